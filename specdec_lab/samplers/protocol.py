"""What every sampler shares — ours and the engine adapters: the result type, the request check, chunking and the
counts merged across chunks.

A sampler is any object with ``describe() -> dict`` (its settings, JSON-ready) and ``draw(pair, prompt, n, length,
generator) -> SampleResult``; :func:`specdec_lab.collect.collect` drives them all alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.theory import expected_tokens_per_pass

CHUNK = 1024  # chains per forward batch: the fastest size on 2 CPU cores; larger on a GPU


@dataclass
class SampleResult:
    """Samples of one sampler: tokens (N, L) and, where asked, the per-step laws (N, L, V)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    stats: dict | None = None


RATES = ("acceptance", "tokens_per_target_pass", "theory_tokens_per_target_pass")


def speculative_rates(counts: dict) -> dict:
    """Acceptance α (accepted / evaluated drafts), tokens per target pass over the steps that drafted
    all K tokens (a chain's last steps draft fewer, see ``speculative.draft_lengths``; NaN when no
    step did), and the theory's (1 − α^{K+1})/(1 − α) at that α (Leviathan et al.)."""
    alpha = counts["accepted_drafts"] / max(1, counts["evaluated_drafts"])
    full = counts["full_steps"]
    return {**counts, "acceptance": alpha,
            "tokens_per_target_pass": counts["full_emitted_tokens"] / full if full else float("nan"),
            "theory_tokens_per_target_pass": expected_tokens_per_pass(alpha, counts["k"])}


def merge_stats(per_chunk: list[dict]) -> dict:
    """Sum the counts of several runs; rates are recomputed from the summed counts."""
    if not per_chunk or not per_chunk[0]:
        return {}
    keys = dict.fromkeys(key for s in per_chunk for key in s)  # a count a chunk lacks is 0 there
    merged = {key: sum(s.get(key, 0) for s in per_chunk) for key in keys if key not in RATES and key != "k"}
    if "k" in per_chunk[0]:
        merged["k"] = per_chunk[0]["k"]
    return speculative_rates(merged) if "accepted_drafts" in merged else merged


def in_chunks(draw, n: int, chunk: int) -> SampleResult:
    """Run ``draw(size)`` over chunks of at most ``chunk`` chains and concatenate the results."""
    if n <= chunk:
        return draw(n)
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    parts = [draw(size) for size in sizes]
    probs = None if parts[0].probs is None else torch.cat([r.probs for r in parts])
    return SampleResult(torch.cat([r.tokens for r in parts]), probs, merge_stats([r.stats for r in parts]))


def check_request(prompt: torch.Tensor, n: int, length: int) -> None:
    """Raise ValueError unless ``prompt`` is a non-empty 1-D tensor of ids and ``n``, ``length`` >= 1."""
    if prompt.ndim != 1 or prompt.numel() < 1:
        raise ValueError("prompt must be a non-empty 1-D tensor of token ids")
    if n < 1 or length < 1:
        raise ValueError(f"need n >= 1 chains and length >= 1 tokens, got n={n}, length={length}")
