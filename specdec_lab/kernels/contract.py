"""The kernel contract: what a verification kernel receives and must return.

A *kernel* is the verification step of speculative decoding for a batch of B requests, each with
up to K draft tokens, as one function (p is the target, q the draft; Leviathan et al. 2023)::

    kernel(target_logits,   # (B, K+1, V) float32: target logits at the K draft positions and the bonus position
           draft_probs,     # (B, K, V)   float32: the law q each draft token was drawn from (rows sum to 1)
           draft_tokens,    # (B, K)      int64:   the drafts, x_j ~ q_j; -1 pads a row with fewer drafts
           temperature,     # (B,)        float32: 0 = greedy row
           top_k,           # (B,)        int64:   0 = off
           top_p,           # (B,)        float32: 1 = off
           generator)       # torch.Generator: the kernel's only randomness
        -> tokens           # (B, K+1)    int64:   emitted tokens, -1 after the first rejection

Row b's target law at position j is ``to_probs(target_logits[b, j], row_config(b))``: temperature,
then top-k, then top-p on the tempered law (:func:`specdec_lab.sampling.to_probs`). Ragged rows
(an option of the contract, :attr:`KernelSpec.ragged`): row b has n_b drafts, ``draft_tokens[b, j] = -1``
for j >= n_b, and emits at most n_b + 1 tokens (position n_b is its bonus position); n_b = 0 is a
request without drafts, which emits one token from p at position 0.

A lossless kernel emits, at each position j it reaches, a token with law p_j exactly; it reaches
j + 1 exactly when it accepts the draft at j, with probability β_j = Σ_x min(p_j(x), q_j(x))
(:mod:`specdec_lab.kernels.law`). Every accepted position repeats its draft token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec_lab.sampling import SamplingConfig, to_probs

Kernel = Callable[..., torch.Tensor]
LawFn = Callable[[torch.Tensor, SamplingConfig], torch.Tensor]


@dataclass(frozen=True)
class KernelSpec:
    """A kernel in the contract, with what it supports (the audit only sends rows it supports)."""

    name: str
    fn: Kernel
    ragged: bool = True  # accepts rows with fewer (or zero) drafts, padded with -1
    greedy: bool = True  # accepts temperature-0 rows mixed with sampled rows
    description: str = ""

    def __call__(self, *args) -> torch.Tensor:
        return self.fn(*args)


def as_spec(kernel: Kernel | KernelSpec) -> KernelSpec:
    """A :class:`KernelSpec` for a bare function (full support assumed), or the spec itself."""
    return kernel if isinstance(kernel, KernelSpec) else KernelSpec(getattr(kernel, "__name__", "kernel"), kernel)


def row_config(temperature: float, top_k: int, top_p: float, dtype: torch.dtype = torch.float32) -> SamplingConfig:
    """The :class:`~specdec_lab.sampling.SamplingConfig` of one row's contract settings (top-k 0 = off).

    >>> row_config(0.7, 0, 1.0).top_k is None, row_config(0.0, 5, 0.9).greedy
    (True, True)
    """
    return SamplingConfig(temperature=float(temperature), top_k=int(top_k) or None, top_p=float(top_p), dtype=dtype)


def target_laws(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                dtype: torch.dtype = torch.float32, law: LawFn = to_probs) -> torch.Tensor:
    """Each row's law (B, ..., V) from its logits (B, ..., V) and its own settings, by ``law`` (default
    :func:`~specdec_lab.sampling.to_probs`), one call per distinct setting.

    >>> logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    >>> laws = target_laws(logits, torch.tensor([1.0, 0.0]), torch.tensor([2, 0]), torch.tensor([1.0, 1.0]), torch.float64)
    >>> laws.round(decimals=4).tolist()
    [[0.7311, 0.2689, 0.0], [1.0, 0.0, 0.0]]
    """
    out = torch.empty(logits.shape, dtype=dtype, device=logits.device)
    settings = torch.stack([temperature.double(), top_k.double(), top_p.double()], dim=1)  # (B, 3)
    unique, which = torch.unique(settings, dim=0, return_inverse=True)
    for i, (t, k, p) in enumerate(unique.tolist()):
        rows = which == i
        out[rows] = law(logits[rows], row_config(t, k, p, dtype)).to(dtype)
    return out


def draft_counts(draft_tokens: torch.Tensor) -> torch.Tensor:
    """n_b (B,) int64: the drafts of each row (its entries before the -1 padding)."""
    return (draft_tokens >= 0).long().sum(dim=-1)


def contract_violations(tokens: torch.Tensor, draft_tokens: torch.Tensor, vocab_size: int) -> list[tuple[int, str]]:
    """(row, what is wrong) for every row whose output breaks the contract's form: shape and dtype,
    token ids in [0, V), -1 only after the last emitted token, at most n_b + 1 tokens and at least one,
    and every position before the last emitted one equal to its draft (an accepted draft).

    >>> drafts = torch.tensor([[3, 1], [2, -1]])
    >>> contract_violations(torch.tensor([[3, 0, -1], [2, 5, -1]]), drafts, 6)  # row 1 rejected its draft: fine
    []
    >>> [text for _, text in contract_violations(torch.tensor([[3, 0, -1], [2, 5, 4]]), drafts, 6)]
    ['emitted 3 tokens with 1 drafts (at most n + 1)', 'an accepted position differs from its draft: emitted [2, 5, 4], drafts [2, -1]']
    """
    B, K = draft_tokens.shape
    if tokens.shape != (B, K + 1) or tokens.dtype != torch.int64:
        return [(-1, f"output has shape {tuple(tokens.shape)} and dtype {tokens.dtype}, "
                     f"the contract asks ({B}, {K + 1}) int64")]
    emitted = tokens >= 0  # (B, K+1)
    length = emitted.long().sum(dim=-1)  # (B,)
    n = draft_counts(draft_tokens)
    problems = []
    for b in torch.nonzero((tokens >= vocab_size).any(-1) | (tokens < -1).any(-1)).flatten().tolist():
        problems.append((b, f"token ids outside [0, {vocab_size}) or below -1: {tokens[b].tolist()}"))
    positions = torch.arange(K + 1)
    holes = (emitted != (positions[None] < length[:, None])).any(-1)
    for b in torch.nonzero(holes).flatten().tolist():
        problems.append((b, f"-1 before an emitted token: {tokens[b].tolist()}"))
    for b in torch.nonzero(length == 0).flatten().tolist():
        problems.append((b, "emitted no token"))
    for b in torch.nonzero(length > n + 1).flatten().tolist():
        problems.append((b, f"emitted {int(length[b])} tokens with {int(n[b])} drafts (at most n + 1)"))
    before_last = positions[None, :K] < (length[:, None] - 1)  # (B, K): accepted positions
    wrong = (before_last & (tokens[:, :K] != draft_tokens)).any(-1)
    for b in torch.nonzero(wrong).flatten().tolist():
        problems.append((b, f"an accepted position differs from its draft: emitted {tokens[b].tolist()}, "
                            f"drafts {draft_tokens[b].tolist()}"))
    return problems
