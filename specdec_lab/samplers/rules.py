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

The lossless rules are :data:`LEVIATHAN` (sampled drafts), :data:`POINT_MASS` (deterministic
drafts: q is one-hot on the draft's argmax, so the same formulas accept with p(x) and resample p with
x removed) and :data:`BLOCK` (Sun et al. 2025: the drafted prefix judged jointly, ``block=True``; the same
pieces, ``accept_prob`` stepping the block weight and ``residual`` taking the weighted p, see
:mod:`specdec_lab.samplers.block`). Faulty variants in :mod:`specdec_lab.samplers.faulty` replace exactly one
piece.
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


@dataclass(frozen=True)
class AcceptanceNoise:
    """Where the acceptance test's uniforms come from, as the sampler draws them and as the exact law sees them.

    ``uniforms(draft_u, generator)`` -> (B, K): the acceptance uniforms, given the uniforms the draft tokens were drawn
    with by inverse CDF in vocabulary order (``draft_u`` (B, K)); ``kept(q_sample, accept)`` (..., V): the chance
    that x is drafted and kept, given the rule's keep probability ``accept`` (..., V)."""

    name: str
    uniforms: Callable[[torch.Tensor, torch.Generator], torch.Tensor]
    kept: Callable[[Law, torch.Tensor], Law]


def _fresh_uniforms(draft_u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(draft_u.shape, generator=generator, dtype=draft_u.dtype, device=draft_u.device)


def _kept_independent(q_sample: Law, accept: torch.Tensor) -> Law:
    return q_sample * accept


FRESH = AcceptanceNoise("fresh", _fresh_uniforms, _kept_independent)  # a new U(0, 1) per test: q(x)·accept(x)


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
    # None: token-wise; else the drafted prefix is judged jointly (samplers.block.verify_block) and this is its stop
    # rule h_i = block(w_i, r_i) at positions i < k (h_k = w_k)
    block: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    noise: AcceptanceNoise = FRESH  # the acceptance test's uniforms
    anchor: str = ""  # the shipped bug this variant reproduces
    needs: dict | None = None  # sampling settings under which the fault shows (e.g. temperature)


LEVIATHAN = Verifier("leviathan", True, "Leviathan/Chen modified rejection sampling, sampled draft")
POINT_MASS = Verifier("point_mass", True, "deterministic (greedy) draft: accept with p(x), resample p without x",
                      draft_law=draft_point_mass)
def lookahead_stop(w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Block verification's stop probability h_i = r_i / (r_i + 1 − w_i) (Sun et al. 2025, Algorithm 2): the block
    weight w_i of x_≤i against the residual mass r_i = Σ (w_i p_{i+1} − q_{i+1})+ still to come; 0 where both
    r_i and 1 − w_i are 0 (then a later coin succeeds surely, :mod:`specdec_lab.samplers.block`)."""
    denominator = r + 1.0 - w
    return torch.where(denominator > 0, r / torch.where(denominator > 0, denominator, 1.0), 0.0)


BLOCK = Verifier("block", True, "block verification (Sun et al. 2025): the drafted prefix judged jointly",
                 block=lookahead_stop)
LOSSLESS = {v.name: v for v in (LEVIATHAN, POINT_MASS, BLOCK)}


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
