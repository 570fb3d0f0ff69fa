"""Row scenarios and heterogeneous batches for auditing a kernel at real vocabulary sizes.

A :class:`RowScenario` is one request of a verification batch: target logits at K+1 positions, the
draft law q at K positions (the law its drafts are drawn from, after the draft's own temperature,
top-k and top-p), how many drafts it has, and its sampling settings. Logit shapes follow what real
next-token laws look like: a Zipf-like head (probability of the r-th most likely token ∝ r^−s,
s ≈ 1.1–1.5, as measured on LLM vocabularies) with a long tail over the whole vocabulary (32,000 for
Llama-2/Mistral, 128,256 for Llama-3, 151,936 for Qwen2), a draft that ranks tokens like the
target up to noise, plus the hard cases: a spike, disjoint supports, q = 0 next to the drafted
tokens, exact ties, and draft laws truncated by top-k / top-p.

:func:`standard_batch` mixes them into one heterogeneous batch: per-row temperature, top-k and
top-p, greedy rows among sampled ones, a zero-draft row and a ragged row.

>>> batch = standard_batch(vocab_size=1000, k=3, seed=0)
>>> len(batch.rows), batch.target_logits.shape, batch.draft_probs.shape
(10, torch.Size([10, 4, 1000]), torch.Size([10, 3, 1000]))
>>> [row.n_drafts for row in batch.rows]
[3, 3, 3, 0, 3, 3, 3, 3, 3, 2]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.kernels.contract import row_config
from specdec_lab.sampling import make_generator, to_probs

VOCAB_SIZES = {"llama-2 / mistral": 32_000, "llama-3": 128_256, "qwen2": 151_936}


@dataclass(frozen=True)
class RowScenario:
    """One request: its logits, its draft law and its settings."""

    name: str  # what the scenario exercises
    row_class: str  # the class a report groups it in: sampled, greedy, top-k, top-p, zero-draft, ragged
    target_logits: torch.Tensor  # (K+1, V) float32
    draft_probs: torch.Tensor  # (K, V) float64, rows sum to 1: the law drafts are drawn from
    n_drafts: int  # drafts of this row (K unless ragged)
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0

    def label(self) -> str:
        settings = f"T={self.temperature:g}" + (f" top-k {self.top_k}" if self.top_k else "") + (
            f" top-p {self.top_p:g}" if self.top_p < 1 else "")
        return f"{self.name} ({settings}, {self.n_drafts} drafts)"


@dataclass(frozen=True)
class Batch:
    """Scenario rows of one batch, stacked in the contract's shapes."""

    rows: tuple[RowScenario, ...]

    @property
    def k(self) -> int:
        return self.rows[0].draft_probs.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.rows[0].target_logits.shape[-1]

    @property
    def target_logits(self) -> torch.Tensor:  # (S, K+1, V) float32
        return torch.stack([r.target_logits for r in self.rows])

    @property
    def draft_probs(self) -> torch.Tensor:  # (S, K, V) float64
        return torch.stack([r.draft_probs for r in self.rows])

    @property
    def n_drafts(self) -> torch.Tensor:  # (S,) int64
        return torch.tensor([r.n_drafts for r in self.rows])

    @property
    def temperature(self) -> torch.Tensor:  # (S,) float32
        return torch.tensor([r.temperature for r in self.rows], dtype=torch.float32)

    @property
    def top_k(self) -> torch.Tensor:  # (S,) int64
        return torch.tensor([r.top_k for r in self.rows])

    @property
    def top_p(self) -> torch.Tensor:  # (S,) float32
        return torch.tensor([r.top_p for r in self.rows], dtype=torch.float32)

    def select(self, keep) -> Batch:
        """The batch of the rows for which ``keep(row)`` is true."""
        return Batch(tuple(r for r in self.rows if keep(r)))


# ---------------------------------------------------------------- logit shapes


def zipf_logits(positions: int, vocab_size: int, generator: torch.Generator, exponent: float = 1.3,
                noise: float = 0.3) -> torch.Tensor:
    """(positions, V) float32 logits of Zipf-like laws: token of rank r has logit −s·log r + noise,
    the ranks a random permutation of the vocabulary per position, s drawn in [s − 0.2, s + 0.2]."""
    ranks = torch.stack([torch.randperm(vocab_size, generator=generator) for _ in range(positions)]) + 1
    s = exponent + 0.4 * (torch.rand(positions, 1, generator=generator) - 0.5)  # (positions, 1)
    jitter = noise * torch.randn(positions, vocab_size, generator=generator)
    return (-s * torch.log(ranks.float()) + jitter).float()


def draft_like(target_logits: torch.Tensor, generator: torch.Generator, noise: float = 1.0) -> torch.Tensor:
    """Draft logits (K, V): the target's first K positions plus Gaussian noise (a draft that ranks like the
    target, accepted about 60–80% of the time)."""
    K = target_logits.shape[0] - 1
    return target_logits[:K] + noise * torch.randn(target_logits[:K].shape, generator=generator)


def draft_law(draft_logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """q (K, V) float64: the draft sampled with the row's own settings (greedy rows: its temperature-1 law),
    so top-k / top-p rows get truncated draft laws."""
    config = row_config(temperature if temperature > 0 else 1.0, top_k, top_p, torch.float64)
    return to_probs(draft_logits.double(), config)


# ---------------------------------------------------------------- scenarios


def zipf_row(name: str, row_class: str, k: int, vocab_size: int, generator: torch.Generator,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, n_drafts: int | None = None,
             exponent: float = 1.3) -> RowScenario:
    """A Zipf-like target with a draft that ranks like it, the draft filtered as the row is."""
    target = zipf_logits(k + 1, vocab_size, generator, exponent)
    q = draft_law(draft_like(target, generator), temperature, top_k, top_p)
    return RowScenario(name, row_class, target, q, k if n_drafts is None else n_drafts, temperature, top_k, top_p)


def spiky_point_mass_row(k: int, vocab_size: int, generator: torch.Generator) -> RowScenario:
    """A spike (one token ≈ 0.9 of the mass) on a Zipf tail, drafted greedily: q is one-hot on the
    draft's argmax (the point-mass rule: accept with p(x), else resample p without x)."""
    target = zipf_logits(k + 1, vocab_size, generator)
    spike = torch.randint(vocab_size, (k + 1,), generator=generator)
    target[torch.arange(k + 1), spike] += 8.0
    draft = draft_like(target, generator, noise=2.0)
    q = torch.nn.functional.one_hot(draft.argmax(-1), vocab_size).double()
    return RowScenario("spike, point-mass draft", "sampled", target, q, k)


def disjoint_row(k: int, vocab_size: int, generator: torch.Generator) -> RowScenario:
    """Target and draft on disjoint halves of the vocabulary: every draft is rejected, every token is
    a residual draw (norm((p − q)+) = p)."""
    half = torch.randperm(vocab_size, generator=generator)[: vocab_size // 2]
    outside = torch.ones(vocab_size, dtype=torch.bool)
    outside[half] = False
    target = zipf_logits(k + 1, vocab_size, generator).masked_fill(outside, float("-inf"))
    draft = zipf_logits(k, vocab_size, generator).masked_fill(~outside, float("-inf"))
    return RowScenario("disjoint supports", "sampled", target, to_probs(draft.double(), row_config(1, 0, 1, torch.float64)), k)


def zero_beside_drafts_row(k: int, vocab_size: int, generator: torch.Generator, temperature: float) -> RowScenario:
    """q = 0 on every odd token id (the neighbours of every token a draft can be) while p is positive there:
    a kernel reading q or p one id off divides by zero or uses the wrong ratio."""
    row = zipf_row("q = 0 beside the drafted tokens", "sampled", k, vocab_size, generator, temperature)
    q = row.draft_probs.clone()
    q[:, 1::2] = 0.0
    return RowScenario(row.name, row.row_class, row.target_logits, q / q.sum(-1, keepdim=True), k, temperature)


def ties_row(k: int, vocab_size: int, generator: torch.Generator, temperature: float, top_k: int) -> RowScenario:
    """Target logits rounded to steps of 0.5: many exact ties, also at the top-k boundary (``to_probs`` keeps
    every token tied with the k-th) and at the argmax."""
    target = torch.round(2 * zipf_logits(k + 1, vocab_size, generator, exponent=1.0)) / 2
    q = draft_law(draft_like(target, generator), temperature, top_k, 1.0)
    return RowScenario("exact ties", "top-k", target, q, k, temperature, top_k)


def standard_batch(vocab_size: int = 32_000, k: int = 4, seed: int = 0) -> Batch:
    """The heterogeneous batch every audit runs (10 rows; ``select`` drops rows a kernel cannot take).

    Rows: 0 disjoint supports (T=1) · 1 greedy · 2 top-k 50 at T=0.7 (draft truncated likewise) ·
    3 no drafts (T=0.8) · 4 plain Zipf (T=1) · 5 top-p 0.9 at T=0.9 (draft truncated likewise) ·
    6 q = 0 beside the drafts (T=1.2) · 7 exact ties, top-k 20 at T=0.5 · 8 spike with a point-mass
    draft (T=1) · 9 ragged: 2 drafts (T=1).
    """
    if k < 2:
        raise ValueError(f"the standard batch needs k >= 2 (it has a ragged row with 2 drafts), got {k}")
    g = make_generator(seed)
    V = vocab_size
    return Batch((
        disjoint_row(k, V, g),
        zipf_row("greedy", "greedy", k, V, g, temperature=0.0),
        zipf_row("top-k, draft truncated", "top-k", k, V, g, temperature=0.7, top_k=50),
        zipf_row("no drafts", "zero-draft", k, V, g, temperature=0.8, n_drafts=0),
        zipf_row("Zipf head, long tail", "sampled", k, V, g),
        zipf_row("top-p, draft truncated", "top-p", k, V, g, temperature=0.9, top_p=0.9),
        zero_beside_drafts_row(k, V, g, temperature=1.2),
        ties_row(k, V, g, temperature=0.5, top_k=20),
        spiky_point_mass_row(k, V, g),
        zipf_row("fewer drafts", "ragged", k, V, g, n_drafts=2),
    ))
