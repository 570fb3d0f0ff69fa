"""The benchmark's jobs: each measures one configuration and returns plain data (JSON-ready dicts).

A job takes a :class:`~specdec_lab.bench.measure.BenchConfig` and returns a dict of numbers (timings as
:func:`~specdec_lab.bench.measure.spread` summaries in seconds, samples/s or ms/token; counts per sample or per
token); :data:`JOBS` names them. :func:`run_in_subprocess` runs one in a fresh interpreter (so its peak RSS,
added as ``peak_rss_mib``, is its own); :func:`run_job` runs it in this process. Raises ``ValueError`` for an
unknown job name and ``RuntimeError`` when a child process fails.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict

import torch

from specdec_lab.bench.measure import (BenchConfig, ForwardCounter, matmul_params, peak_rss_mib, spread, synchronize,
                                       time_repeats, timed_and_counted)

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


ORDER = ("baseline", "machine", "naive", "speculative", "speculative_trim", "hf_generate", "hf_assisted", "work",
         "latency")
THROUGHPUT = ("naive", "speculative", "speculative_trim", "hf_generate", "hf_assisted")
LONG = "_long_prompt"  # result key suffix: the throughput jobs again after cfg.long_prompt
