"""The benchmark's report: tables from the jobs' results and the markdown page (bench.md).

``results`` maps a job name (with :data:`~specdec_lab.bench.jobs.LONG` appended for the long-prompt rows) to
that job's dict; each table function returns a :class:`pandas.DataFrame` with units in its column names
(samples/s, ms/token, MiB, % of the measured peak); :func:`render` returns the markdown page.
"""

from __future__ import annotations

import math

import pandas as pd

from specdec_lab.bench.jobs import LONG
from specdec_lab.bench.measure import BenchConfig

def _ratio(a: dict, b: dict) -> float:
    return a["samples_per_s"]["median"] / b["samples_per_s"]["median"]


def _frame(rows: list[dict]):
    import pandas as pd  # imported here: a job's subprocess needs neither pandas nor the plots

    return pd.DataFrame(rows)


def _flops(base: dict, target_positions: float, draft_positions: float) -> float:
    """2 × matmul weights × positions, target plus draft (attention's 4·layers·hidden·context per
    position adds < 5% at these lengths and is left out)."""
    return 2 * (base["target_matmul_params"] * target_positions + base["draft_matmul_params"] * draft_positions)


def throughput_table(results: dict, cfg: BenchConfig, suffix: str = "") -> "pd.DataFrame":
    """Samples/s, ratios to both HF peers, and the achieved share of the measured matmul peak, for
    the short prompt (suffix "") or the long one (suffix LONG)."""
    peak = results["machine"]["matmul_gflops"]["median"] * 1e9
    rows = []
    names = {"naive": "ours: naive (batched)", "speculative": f"ours: speculative K={cfg.k} (batched)",
             "speculative_trim": f"ours: speculative K={cfg.k}, trimmed (batched)",
             "hf_generate": f"HF generate (batch {cfg.batch})", "hf_assisted": f"HF assisted K={cfg.k} (batch 1)"}
    generate, assisted = results["hf_generate" + suffix], results["hf_assisted" + suffix]
    for key, label in names.items():
        r = results[key + suffix]
        s = r["samples_per_s"]
        rows.append({"sampler (same law p)": label, "samples": r["samples"], "samples/s (median)": s["median"],
                     "min–max": f"{s['min']:.4g}–{s['max']:.4g}",
                     "× HF generate": _ratio(r, generate),
                     "× HF assisted": _ratio(r, assisted),
                     "target positions/sample": r["target_positions_per_sample"],
                     "% of matmul peak": 100 * _flops(results["baseline"], r["target_positions_per_sample"],
                                                      r["draft_positions_per_sample"]) * s["median"] / peak,
                     "peak RSS MiB": r["peak_rss_mib"]})
    return _frame(rows)


def work_table(results: dict) -> "pd.DataFrame":
    rows = []
    for r in results["work"]["rows"]:
        medusa = r["sampler"].startswith("Medusa")
        rows.append({"sampler": r["sampler"], "α": r["alpha"],
                     "target passes/token": r["target_per_token"], "theory": r["theory_target_per_token"],
                     "draft passes/token": math.nan if medusa else r["draft_per_token"],
                     "theory ": math.nan if medusa else r["theory_draft_per_token"],
                     "target passes/delivered token": r["target_per_delivered_token"],
                     "target positions/delivered token": r["target_positions_per_delivered_token"],
                     "samples/s": r["samples_per_s"]})
    return _frame(rows)


def latency_table(results: dict) -> "pd.DataFrame":
    """ms per token and the achieved share of the measured matmul peak and copy bandwidth.

    FLOPs per token = 2 × (matmul weights) × positions fed per token (prompt prefill included),
    target plus draft (attention
    adds 4·layers·hidden·context per position, < 5% at these lengths, left out). Bytes per token =
    weights read per forward, i.e. per chain-forward at batch 1.
    """
    base, machine = results["baseline"], results["machine"]
    peak = machine["matmul_gflops"]["median"] * 1e9
    bandwidth = machine["copy_gbs"]["median"] * 1e9
    naive_ms = results["latency"]["runs"]["naive"]["ms_per_token"]["median"]
    rows = []
    for name, r in results["latency"]["runs"].items():
        seconds = r["ms_per_token"]["median"] / 1e3
        flops = _flops(base, r["target_positions_per_token"], r["draft_positions_per_token"])
        rows.append({"batch 1": name, "ms/token (median)": r["ms_per_token"]["median"],
                     "min–max": f"{r['ms_per_token']['min']:.3g}–{r['ms_per_token']['max']:.3g}",
                     "× naive speed": naive_ms / r["ms_per_token"]["median"],
                     "MFLOP/token": flops / 1e6, "% of matmul peak": 100 * flops / seconds / peak,
                     "% of copy bandwidth (weights/pass)": 100 * _weight_bytes_per_token(base, r) / seconds / bandwidth})
    return _frame(rows)


def _weight_bytes_per_token(base: dict, r: dict) -> float:
    """fp32 weight bytes read per token at batch 1: every forward reads every weight once."""
    return 4 * (base["target_params"] * r["target_forwards_per_token"]
                + base["draft_params"] * r["draft_forwards_per_token"])


def memory_table(results: dict) -> "pd.DataFrame":
    return _frame([{"configuration (own process)": name, "peak RSS MiB": r["peak_rss_mib"],
                          "job seconds": r["job_seconds"]} for name, r in results.items()])


def render(results: dict, cfg: BenchConfig, meta: dict) -> str:
    from specdec_lab.report import to_markdown

    m = results["machine"]
    lines = [
        "# specdec-lab benchmark", "",
        f"{meta['time']} · {meta['machine']} · torch {meta['torch']} · transformers {meta['transformers']} · "
        f"device {cfg.device} · torch threads {cfg.threads} · load average before/after "
        f"{meta['load_before']} / {meta['load_after']}", "",
        f"Prompt {cfg.prompt!r}, L = {cfg.length} new tokens per sample, temperature 1, no top-k/top-p "
        f"(the same law p for every row). Medians over {cfg.repeats} repeats after a warm-up; min–max is the spread.",
        "", f"Measured peak: {m['matmul_gflops']['median']:.1f} GFLOP/s fp32 matmul ({cfg.matmul_size}², "
        f"min–max {m['matmul_gflops']['min']:.1f}–{m['matmul_gflops']['max']:.1f}); copy bandwidth "
        f"{m['copy_gbs']['median']:.1f} GB/s (128 MiB read + write).", "",
        "## 1. Collection throughput", "",
        f"After the prompt {cfg.prompt!r} ({results['naive']['prompt_tokens']} tokens):", "",
        to_markdown(throughput_table(results, cfg)), "",
        f"After a long prompt (`bench.LONG_PROMPT`, {results['naive' + LONG]['prompt_tokens']} tokens; our samplers "
        "feed it once per batch of chains and share its cache, HF generate once per sample):", "",
        to_markdown(throughput_table(results, cfg, LONG)), "",
        "## 2. Work per token (speculative, per chain)", "",
        "Passes per token are per chain and per emitted token (before truncation to L), counted by forward hooks; "
        "theory: (1 − α)/(1 − α^{K+1}) target and K(1 − α)/(1 − α^{K+1}) draft passes per token at the measured α. "
        "'delivered' divides by the N·L tokens kept (the last block is truncated). The trimmed row drafts "
        "min(K, r − 1) tokens when r are missing (`SpeculativeConfig(trim=True)`, as HF assisted generation does): "
        "nothing is truncated, and its theory is `theory.expected_work_per_sample(α, K, L)` / L.", "",
        to_markdown(work_table(results)), "", results["work"]["medusa"], "",
        "## 3. Batch-1 latency", "", to_markdown(latency_table(results)), "",
        "MFLOP/token counts 2 × matmul weights × positions fed per token (target + draft). At batch 1 the "
        f"weights ({4 * results['baseline']['target_params'] / 1e6:.1f} MB target fp32) are re-read every forward; the last column is weight bytes per token "
        "/ time as a share of the measured copy bandwidth (the memory-bound view; on this CPU the weights "
        "largely stay in cache, so neither roof binds: batch-1 decoding is overhead-bound).", "",
        "## 4. Peak memory", "", to_markdown(memory_table(results)), "",
    ]
    return "\n".join(lines)


def vllm_table(results: dict, cfg: BenchConfig) -> "pd.DataFrame":
    """Our samplers against vLLM's offline engine on the same models, same machine, one run."""
    names = {"naive": "ours: naive (batched)", "speculative": f"ours: speculative K={cfg.k} (batched)",
             "vllm_none": "vLLM offline, no speculation", "vllm_draft_model": f"vLLM offline, draft model K={cfg.k}",
             "vllm_eagle": f"vLLM offline, EAGLE head K={cfg.k}"}
    base = results["vllm_none"]
    return _frame([{"sampler": label, "samples": results[key]["samples"],
                    "samples/s (median)": results[key]["samples_per_s"]["median"],
                    "min–max": f"{results[key]['samples_per_s']['min']:.4g}–{results[key]['samples_per_s']['max']:.4g}",
                    "× vLLM no speculation": _ratio(results[key], base),
                    "peak RSS MiB (main process)": results[key]["peak_rss_mib"]}
                   for key, label in names.items()])
