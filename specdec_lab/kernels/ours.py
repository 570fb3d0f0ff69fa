"""Our verification rules as kernels in the contract, and the kernel-level negative controls.

:func:`rule_kernel` turns a :class:`~specdec_lab.samplers.rules.Verifier` into a batched torch
kernel: the target law from the Verifier's ``target_law`` per row setting, acceptance with its
``accept_prob``, the replacement token from its ``residual``, the bonus token at its
``bonus_offset`` — the same pieces the model-level sampler runs. :data:`LOSSLESS` is
:data:`~specdec_lab.samplers.rules.LEVIATHAN` as a kernel; the point-mass rule needs no kernel of
its own (a one-hot ``draft_probs`` row is a point-mass draft, the ``point-mass draft`` scenario).

:data:`FAULTY` holds every negative control of :mod:`specdec_lab.samplers.faulty` that a kernel can
commit, and :data:`NOT_AT_KERNEL_LEVEL` says, for the others, why not. :data:`BATCH_FAULTY` are the
heterogeneous-batch controls of issue 26: a kernel that is lossless row by row but mixes rows up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec_lab.kernels.contract import KernelSpec, draft_counts, target_laws
from specdec_lab.sampling import inverse_cdf
from specdec_lab.samplers.faulty import FAULTY as RULE_FAULTY
from specdec_lab.samplers.rules import LEVIATHAN, Verifier

QRatio = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (q (B, K, V), temperature (B,)) -> q in the ratio


def given_q(q: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The ratio's q is the law the drafts were drawn from (correct)."""
    return q


def untempered_q(q: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The draft's temperature-1 law, recovered from its tempered law q = softmax(l / T): softmax(T log q)
    (exact when the draft is unfiltered; greedy rows keep q)."""
    t = torch.where(temperature > 0, temperature, 1.0)[:, None, None]  # (B, 1, 1)
    return torch.softmax(t * torch.log(q), dim=-1)


@dataclass(frozen=True)
class Uniforms:
    accept: torch.Tensor  # (B, K) float64: u_j, draft j kept when u_j < accept_prob
    last: torch.Tensor  # (B, 1) float64: the inverse-CDF uniform of the replacement or bonus token


def draw_uniforms(B: int, K: int, generator: torch.Generator) -> Uniforms:
    """One acceptance uniform per draft position and one for the last token of each row."""
    return Uniforms(torch.rand(B, K, generator=generator, dtype=torch.float64),
                    torch.rand(B, 1, generator=generator, dtype=torch.float64))


@dataclass(frozen=True)
class Rule:
    """One verification rule at kernel level: a Verifier's pieces plus the kernel-level hooks the
    batch controls change (which p feeds the residual, which rows' logits a row reads, its uniforms)."""

    verifier: Verifier = LEVIATHAN
    q_ratio: QRatio = given_q


def verify(rule: Rule, target_logits: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: Uniforms,
           residual_p: torch.Tensor | None = None) -> torch.Tensor:
    """The chain rule on a batch, given its uniforms: (B, K+1) tokens, -1 after the first rejection.

    Leviathan et al. (2023), Algorithm 1, per row: keep draft x_j ~ q_j while u_j < min(1, p_j(x)/q_j(x));
    at the first rejection emit a draw from norm((p_j − q_j)+); after all n drafts a bonus draw from p_n.
    ``residual_p`` replaces p in the residual (a batch control); None uses p.
    """
    B, K1, V = target_logits.shape
    K = K1 - 1
    v = rule.verifier
    p = target_laws(target_logits, temperature, top_k, top_p, law=v.target_law)  # (B, K+1, V)
    q = rule.q_ratio(draft_probs, temperature)  # (B, K, V)
    n = draft_counts(draft_tokens)  # (B,)
    x = draft_tokens.clamp(min=0)  # (B, K)
    p_x = p[:, :K].gather(-1, x[..., None])[..., 0].double()  # (B, K)
    q_x = q.gather(-1, x[..., None])[..., 0].double()  # (B, K)
    drafted = torch.arange(K)[None] < n[:, None]  # (B, K)
    keep = drafted & (uniforms.accept < v.accept_prob(p_x, torch.where(q_x > 0, q_x, 1.0)))
    accepted = torch.cumprod(keep.long(), dim=-1).sum(dim=-1)  # (B,) drafts kept before the first rejection
    rows = torch.arange(B)
    rejected = (accepted < n)[:, None]  # (B, 1)
    p_res = p if residual_p is None else residual_p
    residual = v.residual(p_res[rows, accepted].double(), q[rows, accepted.clamp(max=K - 1)].double())  # (B, V)
    bonus = p[rows, (accepted + v.bonus_offset).clamp(min=0)].double()  # (B, V)
    last = inverse_cdf(torch.where(rejected, residual, bonus), uniforms.last)[:, 0]  # (B,)
    positions = torch.arange(K + 1)[None]  # (1, K+1)
    tokens = torch.cat([x, x.new_zeros(B, 1)], dim=1)
    tokens = torch.where(positions < accepted[:, None], tokens, -1)
    tokens[rows, accepted] = last
    return tokens


def rule_kernel(rule: Rule, name: str, description: str = "") -> KernelSpec:
    """A :class:`~specdec_lab.kernels.contract.KernelSpec` running ``rule`` with uniforms from the generator."""

    def kernel(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
        uniforms = draw_uniforms(draft_tokens.shape[0], draft_tokens.shape[1], generator)
        return verify(rule, target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, uniforms)

    kernel.__name__ = name
    return KernelSpec(name, kernel, description=description or rule.verifier.description)


LOSSLESS = rule_kernel(Rule(), "leviathan", "Leviathan/Chen modified rejection sampling (ours)")

# ---------------------------------------------------------------- the rule controls at kernel level

NOT_AT_KERNEL_LEVEL = {
    "q_topk_unnormalised": "the fault is in producing draft_probs (q masked by top-k but not renormalised); "
                           "the kernel receives q as data and cannot know the draft's untruncated law",
    "argmax_draft_softmax_q": "the fault is in producing draft_tokens (the draft's argmax, not a draw from "
                              "draft_probs); the kernel receives the drafts as data, and the harness draws "
                              "them from q as the contract says",
    "overlapping_streams": "a property of random streams across requests and batches (seeds reused); a kernel "
                           "call receives one generator. Its kernel-level relative, rows of one call sharing "
                           "random numbers, is the batch control greedy_shares_uniforms",
    "block_no_lookahead": "a block-verification rule: this kernel contract judges drafts token by token (keep, then "
                          "a residual); a block kernel has another contract",
    "block_tokenwise_residual": "a block-verification rule: this kernel contract judges drafts token by token",
    "draft_noise_reused": "the fault couples the draft's random numbers with the acceptance test's; the harness "
                          "draws the drafts outside the kernel, from their own stream",
    "target_zeroed_before_recovery": "a point-mass (n-gram) rule: the harness draws sampled drafts from draft_probs, "
                                     "as the contract says",
    "argmax_draft_logit_q": "the fault is in producing draft_tokens and draft_probs (the argmax, with raw logits as "
                            "q); the kernel receives both as data",
}
KERNEL_Q = {"q_untempered": untempered_q}  # the draft-law controls a kernel can commit, in kernel form

FAULTY = {name: rule_kernel(Rule(v, KERNEL_Q.get(name, given_q)), name, v.description)
          for name, v in RULE_FAULTY.items() if name not in NOT_AT_KERNEL_LEVEL}

# ---------------------------------------------------------------- heterogeneous-batch controls


def _temperature_leak(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
    """Row 0's temperature applied to every row (a per-request tensor read as a scalar)."""
    return LOSSLESS(target_logits, draft_probs, draft_tokens, temperature[:1].expand_as(temperature).contiguous(),
                    top_k, top_p, generator)


def _topk_shared_residual(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
    """The residual of every row from its tempered law without top-k (the unfiltered rows' path):
    top-k rows accept correctly, then resample outside their top-k set."""
    B, K = draft_tokens.shape
    unfiltered = target_laws(target_logits, temperature, torch.zeros_like(top_k), top_p)
    return verify(Rule(), target_logits, draft_probs, draft_tokens, temperature, top_k, top_p,
                  draw_uniforms(B, K, generator), residual_p=unfiltered)


def _zero_draft_shift(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
    """Rows packed without their zero-draft predecessors: row b reads the target logits of row
    b − (number of zero-draft rows before b), as when the logits of requests without drafts are
    skipped but the offsets assume every request is there (vLLM PR #41768 class)."""
    B, K = draft_tokens.shape
    zero = (draft_counts(draft_tokens) == 0).long()
    source = torch.arange(B) - (torch.cumsum(zero, 0) - zero)  # (B,)
    return verify(Rule(), target_logits[source], draft_probs, draft_tokens, temperature, top_k, top_p,
                  draw_uniforms(B, K, generator))


def _greedy_shares_uniforms(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
    """Uniforms drawn for the sampled rows only but indexed by batch row, wrapping around: each greedy
    row in the batch makes one late row reuse an early row's random numbers (rows correlated,
    every row's own law still exact)."""
    B, K = draft_tokens.shape
    sampled = max(1, int((temperature > 0).sum()))
    drawn = draw_uniforms(sampled, K, generator)
    index = torch.arange(B) % sampled
    return verify(Rule(), target_logits, draft_probs, draft_tokens, temperature, top_k, top_p,
                  Uniforms(drawn.accept[index], drawn.last[index]))


BATCH_FAULTY = {spec.name: spec for spec in (
    KernelSpec("temperature_leak", _temperature_leak, description="row 0's temperature applied to all rows"),
    KernelSpec("topk_shared_residual", _topk_shared_residual,
               description="top-k rows resample from the residual of the unfiltered law"),
    KernelSpec("zero_draft_shift", _zero_draft_shift,
               description="rows after a zero-draft row read the previous row's target logits"),
    KernelSpec("greedy_shares_uniforms", _greedy_shares_uniforms,
               description="greedy rows skipped when drawing uniforms: late rows reuse early rows' numbers"),
)}
