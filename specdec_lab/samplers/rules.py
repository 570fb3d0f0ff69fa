"""Verification rules: the pieces of one speculative step, shared by the sampler and the exact law.

A :class:`Verifier` names the four decisions a speculative step makes:

1. ``target_law`` — p from the target's logits,
2. ``draft_law`` — from the draft's logits, the law draft tokens are drawn from (``q_sample``) and
   the q that enters the acceptance ratio (``q_ratio``); a correct rule uses one law for both,
3. ``accept_prob(p(x), q(x))`` — the chance of keeping draft token x,
4. ``residual(p, q)`` — the law of the replacement token after a rejection,

plus ``bonus_offset`` (which target position the bonus token after K accepts is drawn from).
Leviathan et al. (2023, Algorithm 1): keep x ~ q with probability min(1, p(x)/q(x)); on the first
rejection draw from norm((p − q)+); after K accepts draw a bonus token from p at position K+1.

The lossless rules are :data:`LEVIATHAN` (sampled drafts) and :data:`POINT_MASS` (deterministic
drafts: q is one-hot on the draft's argmax, so the same formulas accept with p(x) and resample p with
x removed). Faulty variants in :mod:`specdec_lab.samplers.faulty` replace exactly one piece.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from specdec_lab.sampling import SamplingConfig, to_probs

Law = torch.Tensor  # (..., V), rows sum to 1


@dataclass(frozen=True)
class DraftLaws:
    q_sample: Law  # what the draft tokens are drawn from
    q_ratio: Law  # what the acceptance test and residual believe they were drawn from


def target_filtered(logits: torch.Tensor, config: SamplingConfig) -> Law:
    return to_probs(logits, config)


def draft_sampled(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    q = to_probs(logits, config)
    return DraftLaws(q, q)


def draft_point_mass(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    """Greedy draft: q is the one-hot law on the draft's argmax (ties to the lowest id)."""
    q = to_probs(logits, replace(config, temperature=0.0))
    return DraftLaws(q, q)


def accept_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)); q(x) > 0 whenever x was drawn from q."""
    return torch.clamp(p_x / q_x, max=1.0)


def residual_positive_part(p: Law, q: Law) -> Law:
    """norm((p − q)+); where p == q exactly the residual is never used and p is returned."""
    excess = torch.clamp(p - q, min=0.0)  # (..., V)
    total = excess.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), p)


@dataclass(frozen=True)
class Verifier:
    name: str
    lossless: bool
    description: str
    target_law: Callable[[torch.Tensor, SamplingConfig], Law] = target_filtered
    draft_law: Callable[[torch.Tensor, SamplingConfig], DraftLaws] = draft_sampled
    accept_prob: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = accept_ratio
    residual: Callable[[Law, Law], Law] = residual_positive_part
    bonus_offset: int = 0  # 0: bonus from p at position K+1 (correct); -1: from position K
    anchor: str = ""  # the shipped bug this variant reproduces
    needs: dict | None = None  # sampling settings under which the fault shows (e.g. temperature)


LEVIATHAN = Verifier("leviathan", True, "Leviathan/Chen modified rejection sampling, sampled draft")
POINT_MASS = Verifier("point_mass", True, "deterministic (greedy) draft: accept with p(x), resample p without x",
                      draft_law=draft_point_mass)
LOSSLESS = {v.name: v for v in (LEVIATHAN, POINT_MASS)}


@dataclass(frozen=True)
class Mode:
    """A Medusa tree acceptance mode (:mod:`specdec_lab.samplers.medusa`): how a tree's candidates
    are drawn and which of them the target keeps."""

    name: str
    lossless: bool
    candidates: str  # "topk": distinct top-k of each head; "iid": i.i.d. draws from each head
    description: str
    pick: Callable | None = None  # node rule for a root-to-leaf walk
    select: Callable | None = None  # whole-tree rule (typical, faulty): (p, nodes, tree, config, gen)
