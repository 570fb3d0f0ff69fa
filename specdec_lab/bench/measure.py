"""What a benchmark run measures (:class:`BenchConfig`) and the instruments every job uses.

Timings are in seconds (:func:`time_repeats`: ``repeats`` calls after one untimed warm-up, the device
synchronised around each), summarised as median, min and max (:func:`spread`); memory in MiB
(:func:`peak_rss_mib`); work as per-chain forwards and token positions, counted by forward hooks
(:class:`ForwardCounter`). Nothing here loads a model or writes a file.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
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
