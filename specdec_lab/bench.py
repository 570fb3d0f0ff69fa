"""Benchmarks: sample-collection throughput, work per token, batch-1 latency, peak memory.

Statistical power costs samples (``stats.plan_sample_size(0.01, 256)`` ≈ 232k), so the samplers
must be fast. One run measures, on the same models:

1. **throughput** — samples/s (L new tokens each) of the batched naive and speculative samplers,
   Hugging Face ``generate`` (batched, plain sampling) and HF assisted generation (batch 1), as
   ratios to the two HF peers. All four draw from the same law p (temperature 1, no top-k/top-p,
   no EOS stopping). Twice: after a short prompt and after a long one, because our samplers feed a
   prompt once per batch and share its cache while HF ``generate`` feeds it once per sample;
2. **work per token** — target and draft forwards per generated token for K = 1..8, counted per
   chain by forward hooks on the models, against (1 − α)/(1 − α^{K+1}) from the measured α;
3. **batch-1 latency** — wall time per token, and the achieved fraction of this machine's matmul
   throughput (measured in the same run with a large fp32 matmul) and of its copy bandwidth;
4. **memory** — each configuration runs in a fresh subprocess that reports its peak RSS.

Timings are medians over ``repeats`` runs after one warm-up, with min and max as the spread.

>>> QUICK.length, QUICK.k
(8, 4)
>>> sorted(JOBS)[:3]
['baseline', 'hf_assisted', 'hf_generate']
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch


# Romeo and Juliet, Act II, Scene II (public domain): about 90 tokens of the bundled tokenizer.
LONG_PROMPT = ("ROMEO.\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun!\n"
               "Arise fair sun and kill the envious moon,\nWho is already sick and pale with grief,\n"
               "That thou her maid art far more fair than she.\nROMEO.\n")


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run measures. Defaults are the full run (`make bench`)."""

    length: int = 8  # new tokens per sample (the L)
    k: int = 4  # draft tokens per target pass for the throughput and latency rows
    samples: int = 4096  # per throughput repeat, for our samplers and HF batched generate
    batch: int = 1024  # HF generate batch size: the same as our samplers' chunk
    assisted_samples: int = 100  # HF assisted generation is batch 1: fewer samples per repeat
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # work-per-token sweep
    work_samples: int = 4096  # samples per K in the sweep
    latency_tokens: int = 64  # tokens per batch-1 latency run
    repeats: int = 5  # timed repeats per measurement (after one warm-up)
    matmul_size: int = 2048  # square fp32 matmul for the peak
    threads: int = 2  # torch.set_num_threads in every configuration
    device: str = "cpu"
    prompt: str = "ROMEO:\n"
    long_prompt: str = LONG_PROMPT  # the throughput rows again after this (a realistic audit context)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("length", "k", "samples", "batch", "assisted_samples", "work_samples",
                     "latency_tokens", "repeats", "matmul_size", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty tuple of integers >= 1, got {self.ks!r}")


FULL = BenchConfig()
QUICK = BenchConfig(samples=32, batch=16, assisted_samples=2, ks=(1, 3), work_samples=32,
                    latency_tokens=6, repeats=2, matmul_size=256, threads=1)


# --- measuring -------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeats(run: Callable[[], object], repeats: int, device: torch.device) -> list[float]:
    """Seconds of ``repeats`` calls of ``run`` after one untimed warm-up call."""
    run()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def spread(values: list[float]) -> dict:
    """Median with min and max: the summary every timing row reports."""
    return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values)),
            "n": len(values)}


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM on Linux, ru_maxrss elsewhere) in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


class ForwardCounter:
    """Counts per-chain forwards and token positions of one model.

    A forward over B chains and T tokens adds B chain-forwards and B·T positions. A forward on an
    empty cache is a prompt prefill: our samplers run it once and share it across chains, so the
    work-per-token table leaves it out (``prefill=False``); HF's first forward also verifies or
    samples tokens, so the latency table counts every forward (``prefill=True``).
    """

    def __init__(self, model: torch.nn.Module, prefill: bool = False):
        self.chain_forwards = self.positions = 0
        self.prefill = prefill
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if ids is None or (not self.prefill and (cache is None or cache.get_seq_length() == 0)):
            return
        B, T = ids.shape
        self.chain_forwards += B
        self.positions += B * T

    def close(self) -> None:
        self._handle.remove()


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that a forward multiplies by (every ``nn.Linear``; embedding lookups are free)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


# --- the peers: Hugging Face generate, plain and assisted -------------------------------------
# Both go through the audit adapter (specdec_lab.adapters.hf): its generate_kwargs ask HF for the
# same law p (do_sample, temperature 1, top_k=0 instead of HF's default 50, top_p=1, exactly L new
# tokens, eos_token_id=None so nothing stops or is masked); assisted generation is batch 1 only.

def hf_config(cfg: BenchConfig, mode: str):
    """The adapter's settings: K fixed (constant schedule, confidence threshold 0) like our sampler."""
    from specdec_lab.adapters.hf import HFGenerateConfig

    return HFGenerateConfig(mode=mode, k=cfg.k, schedule="constant", confidence_threshold=0.0, progress=False)


def hf_generate_batch(pair, prompt: torch.Tensor, batch: int, length: int, seed: int) -> torch.Tensor:
    """(batch, length) new tokens from one batched plain HF ``generate`` call (the adapter's settings)."""
    from specdec_lab.adapters.hf import HFGenerateConfig, generate_kwargs

    torch.manual_seed(seed)  # HF samples from the global RNG: forced by its API (only the peer uses it)
    ids = prompt[None].expand(batch, -1).to(pair.device)  # (B, P)
    with torch.no_grad():
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids),
                                   **generate_kwargs(pair, HFGenerateConfig(mode="plain", progress=False), length))
    new = out[:, prompt.numel():]
    if new.shape != (batch, length):
        raise RuntimeError(f"HF generate returned {tuple(new.shape)} new tokens, expected {(batch, length)}")
    return new


def hf_assisted(pair, prompt: torch.Tensor, n: int, length: int, cfg: BenchConfig, seed: int) -> torch.Tensor:
    """(n, length) tokens from HF assisted generation, one batch-1 call per sample, via the adapter."""
    from specdec_lab.adapters.hf import sample_hf

    return sample_hf(pair, prompt, n, length, hf_config(cfg, "assisted"), _generator(cfg, pair.device, seed)).tokens


def hf_plain_single(pair, prompt: torch.Tensor, length: int, cfg: BenchConfig) -> torch.Tensor:
    """One batch-1 plain HF sample via the adapter (the latency row)."""
    from specdec_lab.adapters.hf import sample_hf

    return sample_hf(pair, prompt, 1, length, hf_config(cfg, "plain"), _generator(cfg, pair.device)).tokens


# --- jobs: each runs in its own subprocess and returns plain data ------------------------------

def _load(cfg: BenchConfig):
    return _load_pair(cfg.device, cfg.prompt)


@functools.lru_cache(maxsize=2)
def _load_pair(device: str, prompt: str):
    """The bundled pair, loaded once per process (jobs run in-process by the smoke test share it)."""
    from specdec_lab.models import load_pair

    pair = load_pair("bundled", device=device)
    return pair, pair.encode(prompt)


def _generator(cfg: BenchConfig, device: torch.device, offset: int = 0) -> torch.Generator:
    from specdec_lab.sampling import make_generator

    return make_generator(cfg.seed + offset, device)


def job_baseline(cfg: BenchConfig) -> dict:
    """Load the pair and do nothing: the memory every other row starts from."""
    pair, _ = _load(cfg)
    return {"target_params": sum(p.numel() for p in pair.target.parameters()),
            "draft_params": sum(p.numel() for p in pair.draft.parameters()),
            "target_matmul_params": matmul_params(pair.target),
            "draft_matmul_params": matmul_params(pair.draft)}


def job_machine(cfg: BenchConfig) -> dict:
    """Peak fp32 matmul throughput (GFLOP/s) and copy bandwidth (GB/s) of this device."""
    device = torch.device(cfg.device)
    n = cfg.matmul_size
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    a = torch.randn(n, n, generator=gen, device=device)
    b = torch.randn(n, n, generator=gen, device=device)
    seconds = time_repeats(lambda: a @ b, cfg.repeats, device)
    src = torch.ones(32 * 2**20, device=device)  # 128 MiB: larger than any CPU cache
    dst = torch.empty_like(src)
    copy_seconds = time_repeats(lambda: dst.copy_(src), cfg.repeats, device)
    bytes_moved = 2 * src.numel() * src.element_size()  # read + write
    return {"matmul_gflops": spread([2 * n**3 / s / 1e9 for s in seconds]),
            "copy_gbs": spread([bytes_moved / s / 1e9 for s in copy_seconds])}


def timed_and_counted(pair, run: Callable[[], object], cfg: BenchConfig, samples: int) -> tuple[list[float], dict]:
    """Time ``run`` (warm-up + repeats) while counting every forward's positions (prefills included)
    -> (seconds, {"target_positions_per_sample", "draft_positions_per_sample"})."""
    target, draft = ForwardCounter(pair.target, prefill=True), ForwardCounter(pair.draft, prefill=True)
    try:
        seconds = time_repeats(run, cfg.repeats, pair.device)
    finally:
        target.close()
        draft.close()
    runs = (cfg.repeats + 1) * samples
    return seconds, {"target_positions_per_sample": target.positions / runs,
                     "draft_positions_per_sample": draft.positions / runs}


def _our_throughput(cfg: BenchConfig, sampler: str) -> dict:
    from specdec_lab.samplers.naive import NaiveConfig, sample_naive
    from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative

    pair, prompt = _load(cfg)
    gen = _generator(cfg, pair.device)
    stats = {}

    def run():
        if sampler == "naive":
            result = sample_naive(pair, prompt, cfg.samples, cfg.length, NaiveConfig(), gen)
        else:
            config = SpeculativeConfig(k=cfg.k, trim=sampler == "speculative_trim")
            result = sample_speculative(pair, prompt, cfg.samples, cfg.length, config, gen)
        stats.update(result.stats or {})

    seconds, work = timed_and_counted(pair, run, cfg, cfg.samples)
    return {"samples": cfg.samples, "prompt_tokens": prompt.numel(), "seconds": spread(seconds),
            "samples_per_s": spread([cfg.samples / s for s in seconds]), "stats": stats, **work}


def job_naive(cfg: BenchConfig) -> dict:
    """Batched naive sampling from p (``samplers.naive``)."""
    return _our_throughput(cfg, "naive")


def job_speculative(cfg: BenchConfig) -> dict:
    """Batched speculative sampling at K = cfg.k (``samplers.speculative``)."""
    return _our_throughput(cfg, "speculative")


def job_speculative_trim(cfg: BenchConfig) -> dict:
    """The same with trim=True: a chain missing r tokens drafts min(K, r − 1), as HF assisted does."""
    return _our_throughput(cfg, "speculative_trim")


def job_hf_generate(cfg: BenchConfig) -> dict:
    """HF ``generate``, plain sampling, batches of ``cfg.batch`` until ``cfg.samples`` samples."""
    pair, prompt = _load(cfg)
    batches = [min(cfg.batch, cfg.samples - start) for start in range(0, cfg.samples, cfg.batch)]
    seconds, work = timed_and_counted(pair, lambda: [hf_generate_batch(pair, prompt, b, cfg.length, cfg.seed + i)
                                                     for i, b in enumerate(batches)], cfg, cfg.samples)
    return {"samples": cfg.samples, "batch": cfg.batch, "prompt_tokens": prompt.numel(), "seconds": spread(seconds),
            "samples_per_s": spread([cfg.samples / s for s in seconds]), **work}


def job_hf_assisted(cfg: BenchConfig) -> dict:
    """HF assisted generation (batch 1, the only batch size it supports), K = cfg.k drafts per step."""
    pair, prompt = _load(cfg)
    seconds, work = timed_and_counted(pair, lambda: hf_assisted(pair, prompt, cfg.assisted_samples, cfg.length, cfg, 0),
                                      cfg, cfg.assisted_samples)
    return {"samples": cfg.assisted_samples, "prompt_tokens": prompt.numel(), "seconds": spread(seconds),
            "samples_per_s": spread([cfg.assisted_samples / s for s in seconds]), **work}


def job_work(cfg: BenchConfig) -> dict:
    """Per K: measured α, target and draft forwards per token (counted by hooks), samples/s; then
    the same for Medusa trees (heads instead of a draft model) when the Medusa sampler exists."""
    from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative

    pair, prompt = _load(cfg)
    rows = []
    for i, k in enumerate(cfg.ks):
        rows.append(_work_row(pair, cfg, f"speculative K={k}", k, lambda gen, k=k: sample_speculative(
            pair, prompt, cfg.work_samples, cfg.length, SpeculativeConfig(k=k), gen), offset=i))
    rows.append(_work_row(pair, cfg, f"speculative K={cfg.k}, trimmed", cfg.k, lambda gen: sample_speculative(
        pair, prompt, cfg.work_samples, cfg.length, SpeculativeConfig(k=cfg.k, trim=True), gen), offset=50,
        trimmed=True))
    status = medusa_status()
    if status is None:
        from specdec_lab.samplers.medusa import MedusaConfig, sample_medusa
        from specdec_lab.samplers.tree import cartesian, chain

        for j, (label, shape, mode) in enumerate(MEDUSA_TREES):
            tree = chain(shape) if isinstance(shape, int) else cartesian(shape)
            config = MedusaConfig(tree=tree, mode=mode)
            rows.append(_work_row(pair, cfg, f"Medusa {label}, {mode} ({tree.num_nodes} nodes)",
                                  tree.depth, lambda gen, c=config: sample_medusa(
                                      pair, prompt, cfg.work_samples, cfg.length, c, gen),
                                  offset=100 + j, chain_theory=isinstance(shape, int)))
        status = ("Medusa rows: the bundled heads; rejection_topk is lossless recursive rejection on distinct "
                  "top-k candidates, typical is Medusa's lossy default (shown for contrast); "
                  "α = accepted nodes / (steps × depth); theory for a chain only (a tree has no single-α formula); "
                  "no draft model (the heads read the target's hidden state).")
    return {"samples": cfg.work_samples, "rows": rows, "medusa": status}


# (label, chain depth or top-k per head, acceptance mode): a depth-4 chain like K = 4, a small tree,
# and Medusa's lossy typical acceptance on the same chain for contrast
MEDUSA_TREES = (("chain(4)", 4, "rejection_topk"), ("tree 2×2×2", (2, 2, 2), "rejection_topk"),
                ("chain(4)", 4, "typical"))


def _work_row(pair, cfg: BenchConfig, label: str, k: int, draw, offset: int, chain_theory: bool = True,
              trimmed: bool = False) -> dict:
    """One work-table row. Theory: fixed K, 1/E[tokens per pass] target and K/E[...] draft passes per
    emitted token; trimmed, the expected passes per sample from ``theory.expected_work_per_sample``
    over L (a trimmed chain emits exactly L)."""
    from specdec_lab.theory import expected_tokens_per_pass, expected_work_per_sample

    target, draft = ForwardCounter(pair.target), ForwardCounter(pair.draft)
    gen = _generator(cfg, pair.device, offset=offset)
    try:
        synchronize(pair.device)
        start = time.perf_counter()
        stats = draw(gen).stats
        synchronize(pair.device)
        seconds = time.perf_counter() - start
    finally:
        target.close()
        draft.close()
    alpha, emitted, delivered = stats["acceptance"], stats["emitted_tokens"], cfg.work_samples * cfg.length
    per_pass = expected_tokens_per_pass(alpha, k) if chain_theory else math.nan
    theory_target, theory_draft = 1 / per_pass, k / per_pass
    if trimmed:
        work = expected_work_per_sample(alpha, k, cfg.length)
        theory_target, theory_draft = work["target_passes"] / cfg.length, work["draft_passes"] / cfg.length
    return {"sampler": label, "k": k, "alpha": alpha, "trimmed": trimmed, "target_per_token": target.chain_forwards / emitted,
            "theory_target_per_token": theory_target,
            "draft_per_token": draft.chain_forwards / emitted, "theory_draft_per_token": theory_draft,
            "target_per_delivered_token": target.chain_forwards / delivered,
            "draft_per_delivered_token": draft.chain_forwards / delivered,
            "target_positions_per_delivered_token": target.positions / delivered,
            "samples_per_s": cfg.work_samples / seconds}


def medusa_status() -> str | None:
    """None when a Medusa tree sampler exists to benchmark, else a line saying what is missing."""
    try:
        from specdec_lab.samplers import medusa
    except ImportError:
        return "Medusa: not yet available"
    if not hasattr(medusa, "sample_medusa"):
        return "Medusa: not yet available (no tree sampler API to benchmark yet)"
    return None


def job_latency(cfg: BenchConfig) -> dict:
    """Batch-1 wall time per token: ours (naive, speculative) and HF (plain, assisted), with counts
    of target and draft positions per token for the achieved-FLOP fraction."""
    from specdec_lab.samplers.naive import NaiveConfig, sample_naive
    from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative

    pair, prompt = _load(cfg)
    gen = _generator(cfg, pair.device)
    L = cfg.latency_tokens
    runs = {
        "naive": lambda: sample_naive(pair, prompt, 1, L, NaiveConfig(), gen),
        f"speculative K={cfg.k}": lambda: sample_speculative(pair, prompt, 1, L, SpeculativeConfig(k=cfg.k), gen),
        "HF generate": lambda: hf_plain_single(pair, prompt, L, cfg),
        f"HF assisted K={cfg.k}": lambda: hf_assisted(pair, prompt, 1, L, cfg, 0),
    }
    out = {}
    for name, run in runs.items():
        seconds = time_repeats(run, cfg.repeats, pair.device)
        target, draft = ForwardCounter(pair.target, prefill=True), ForwardCounter(pair.draft, prefill=True)
        run()
        target.close()
        draft.close()
        out[name] = {"ms_per_token": spread([1e3 * s / L for s in seconds]),
                     "target_positions_per_token": target.positions / L,
                     "draft_positions_per_token": draft.positions / L,
                     "target_forwards_per_token": target.chain_forwards / L,
                     "draft_forwards_per_token": draft.chain_forwards / L}
    return {"tokens": L, "runs": out}


def _vllm_throughput(cfg: BenchConfig, method: str) -> dict:
    """vLLM's offline engine (``.venv-vllm`` worker): ``LLM.generate`` of cfg.samples samples in one job, n = 8
    per request; timed inside the worker around ``LLM.generate`` only (engine start excluded, as our rows
    exclude model loading). One warm-up job, then cfg.repeats timed ones."""
    from specdec_lab.adapters import vllm

    pair, prompt = _load(cfg)
    config = vllm.VllmOfflineConfig(method, k=cfg.k, n_per_request=8, progress=False)
    gen = _generator(cfg, pair.device)
    runs = [vllm.sample_offline(prompt, cfg.samples, cfg.length, config, gen, chunk=cfg.samples)
            for _ in range(cfg.repeats + 1)][1:]
    vllm.close_workers()
    seconds = [r.stats["engine_seconds"] for r in runs]
    return {"samples": cfg.samples, "prompt_tokens": prompt.numel(), "seconds": spread(seconds),
            "samples_per_s": spread([cfg.samples / s for s in seconds]), "stats": runs[-1].stats}


def job_vllm_none(cfg: BenchConfig) -> dict:
    """vLLM 0.32.0 (CPU build) offline, no speculation."""
    return _vllm_throughput(cfg, "none")


def job_vllm_draft_model(cfg: BenchConfig) -> dict:
    """vLLM 0.32.0 (CPU build) offline with the bundled draft model, K = cfg.k (its output law is wrong on this
    build at T > 0: docs/audit-vllm.md)."""
    return _vllm_throughput(cfg, "draft_model")


def job_vllm_eagle(cfg: BenchConfig) -> dict:
    """vLLM 0.32.0 (CPU build) offline with the bundled EAGLE head, K = cfg.k (same caveat as the draft model)."""
    return _vllm_throughput(cfg, "eagle")


JOBS = {"baseline": job_baseline, "machine": job_machine, "naive": job_naive,
        "speculative": job_speculative, "speculative_trim": job_speculative_trim, "hf_generate": job_hf_generate, "hf_assisted": job_hf_assisted,
        "work": job_work, "latency": job_latency, "vllm_none": job_vllm_none,
        "vllm_draft_model": job_vllm_draft_model, "vllm_eagle": job_vllm_eagle}
VLLM_ORDER = ("naive", "speculative", "vllm_none", "vllm_draft_model", "vllm_eagle")


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


def run_vllm_benchmark(cfg: BenchConfig) -> str:
    """The vLLM row: :data:`VLLM_ORDER`, each job in its own process; markdown table with the load average."""
    load_before = _load_average()
    results = {name: run_in_subprocess(name, cfg) for name in VLLM_ORDER}
    from specdec_lab.report import to_markdown

    table = to_markdown(vllm_table(results, cfg))
    return (f"{table}\n\nL = {cfg.length}, prompt {cfg.prompt!r}, {cfg.samples} samples per repeat, {cfg.repeats} "
            f"repeats, torch threads {cfg.threads}; load average before {load_before}, after {_load_average()}.")


def run_job(name: str, cfg: BenchConfig) -> dict:
    """Run one job in this process (threads set first); add its peak RSS and duration."""
    if name not in JOBS:
        raise ValueError(f"unknown benchmark job {name!r}; valid names: {', '.join(JOBS)}")
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    result = JOBS[name](cfg)
    result["peak_rss_mib"] = peak_rss_mib()
    if cfg.device.startswith("cuda"):
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    result["job_seconds"] = time.perf_counter() - start
    return result


def run_in_subprocess(name: str, cfg: BenchConfig) -> dict:
    """Run one job in a fresh interpreter so its peak RSS is its own."""
    settings = json.dumps(asdict(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "specdec_lab.bench", "--job", name, "--settings", settings],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark job {name!r} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the report -------------------------------------------------------------------------------

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
        "weights (13.7 MB target fp32) are re-read every forward; the last column is weight bytes per token "
        "/ time as a share of the measured copy bandwidth (the memory-bound view; on this CPU the weights "
        "largely stay in cache, so neither roof binds: batch-1 decoding is overhead-bound).", "",
        "## 4. Peak memory", "", to_markdown(memory_table(results)), "",
    ]
    return "\n".join(lines)


ORDER = ("baseline", "machine", "naive", "speculative", "speculative_trim", "hf_generate", "hf_assisted", "work",
         "latency")
THROUGHPUT = ("naive", "speculative", "speculative_trim", "hf_generate", "hf_assisted")
LONG = "_long_prompt"  # result key suffix: the throughput jobs again after cfg.long_prompt


def run_benchmark(cfg: BenchConfig, out_dir: Path | str | None = None, progress: bool = True,
                  runner: Callable[[str, BenchConfig], dict] = run_in_subprocess) -> tuple[dict, str]:
    """Run every job, write bench.json and bench.md under ``out_dir``; return (data, markdown).

    ``runner`` runs one job: :func:`run_in_subprocess` (default: peak RSS per configuration) or
    :func:`run_job` (in this process; the smoke test's choice, RSS then is cumulative).
    """
    import transformers

    meta = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "load_before": _load_average()}
    results = {}
    for name in ORDER:
        if progress:
            print(f"[bench] {name} …", file=sys.stderr, flush=True)
        results[name] = runner(name, cfg)
    for name in THROUGHPUT:
        if progress:
            print(f"[bench] {name} after the long prompt …", file=sys.stderr, flush=True)
        results[name + LONG] = runner(name, replace(cfg, prompt=cfg.long_prompt))
    meta["load_after"] = _load_average()
    markdown = render(results, cfg, meta)
    if out_dir is None:
        out_dir = Path("reports") / "bench" / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps({"config": asdict(cfg), "meta": meta, "results": results},
                                                   indent=1, default=str))
    (out_dir / "bench.md").write_text(markdown)
    return {"config": asdict(cfg), "meta": meta, "results": results, "dir": str(out_dir)}, markdown


def _load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke size (seconds), for tests")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 2; quick: 1)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="samples per throughput repeat")
    parser.add_argument("--out", default=None, help="output folder (default reports/bench/<timestamp>)")
    parser.add_argument("--vllm", action="store_true", help="only the vLLM row: ours vs vLLM offline (needs make vllm)")
    parser.add_argument("--job", choices=sorted(JOBS), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        settings = json.loads(args.settings)
        settings["ks"] = tuple(settings["ks"])
        print(json.dumps(run_job(args.job, BenchConfig(**settings))))
        return 0
    cfg = QUICK if args.quick else FULL
    overrides = {key: value for key, value in (("device", args.device), ("threads", args.threads),
                                               ("repeats", args.repeats), ("samples", args.samples))
                 if value is not None}
    cfg = replace(cfg, **overrides)
    if args.vllm:
        print(run_vllm_benchmark(cfg))
        return 0
    _, markdown = run_benchmark(cfg, args.out)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
