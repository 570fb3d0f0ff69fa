"""Negative controls: speculative samplers with one realistic bug each.

Each entry is a :class:`~specdec_lab.samplers.rules.Verifier` that differs from a lossless rule
(:data:`~specdec_lab.samplers.rules.LEVIATHAN`, or :data:`~specdec_lab.samplers.rules.BLOCK` /
:data:`~specdec_lab.samplers.rules.POINT_MASS` where named) in exactly one piece, and records its source in
``anchor``: the engine and the issue or pull request where the bug shipped (each checked against the public
tracker), the shape a tracker describes where it never shipped (said so), or "common re-implementation error".
``needs`` names the settings under which the bug changes the output law (a temperature bug is invisible at
temperature 1; ``k`` is the number of draft tokens, the rest are :class:`~specdec_lab.sampling.SamplingConfig`
fields). A harness that passes any of these is broken.

>>> sorted(FAULTY)[:3]
['always_accept', 'argmax_draft_logit_q', 'argmax_draft_softmax_q']
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.rules import (BLOCK, LEVIATHAN, POINT_MASS, AcceptanceNoise, DraftLaws, Law, Mode, Verifier,
                                       draft_point_mass, residual_positive_part)


def _accept_always(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(p_x)


def _accept_swapped(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, q(x)/p(x)): target and draft letters swapped (p(x) = 0 gives certain acceptance)."""
    return torch.where(p_x > 0, torch.clamp(q_x / torch.where(p_x > 0, p_x, 1.0), max=1.0), 1.0)


def _residual_p(p: Law, q: Law) -> Law:
    return p


def _residual_q(p: Law, q: Law) -> Law:
    return q


def _draft_q_untempered(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    """Draft samples at the requested temperature; the ratio uses its temperature-1 softmax."""
    return DraftLaws(to_probs(logits, config), to_probs(logits, replace(config, temperature=1.0)))


def _draft_q_topk_unnormalised(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    """Draft samples from its top-k law; the ratio uses the softmax masked but not renormalised."""
    q = to_probs(logits, config)
    full = to_probs(logits, replace(config, top_k=None, top_p=1.0))
    return DraftLaws(q, torch.where(q > 0, full, 0.0))


def _draft_argmax_softmax_q(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    """Draft token is the argmax, but the ratio uses the draft's softmax instead of a point mass."""
    return DraftLaws(draft_point_mass(logits, config).q_sample, to_probs(logits, config))


def _draft_argmax_logit_q(logits: torch.Tensor, config: SamplingConfig) -> DraftLaws:
    """Draft token is the argmax, and the draft's raw logits stand in for q in the ratio and the residual."""
    return DraftLaws(draft_point_mass(logits, config).q_sample, logits.to(config.dtype))


def _accept_never(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The acceptance test reads p(x) after the recovery step zeroed it in place: 0, so nothing is kept."""
    return torch.zeros_like(p_x)


def _residual_unweighted(weighted_p: Law, q: Law) -> Law:
    """Block verification's replacement drawn from the token-wise norm((p − q)+): the block weight w is divided out."""
    total = weighted_p.sum(dim=-1, keepdim=True)
    return residual_positive_part(torch.where(total > 0, weighted_p / torch.where(total > 0, total, 1.0), weighted_p), q)


def _stop_without_lookahead(w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Block verification's stop coin read off the block weight alone, h_i = w_i, as a token-wise test reads its
    ratio: the residual mass still to come (r_i) is ignored."""
    return w


def _reused_uniforms(draft_u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return draft_u


def _kept_reused(q_sample: Law, accept: torch.Tensor) -> Law:
    """x is drafted for u in [F(x−), F(x)) (inverse CDF in vocabulary order) and kept for u < accept(x): the
    length of the overlap of the two intervals."""
    cdf = torch.cumsum(q_sample, dim=-1) / q_sample.sum(dim=-1, keepdim=True)
    return torch.clamp(torch.minimum(cdf, accept) - (cdf - q_sample / q_sample.sum(dim=-1, keepdim=True)), min=0.0)


REUSED_DRAFT_NOISE = AcceptanceNoise("reused draft noise", _reused_uniforms, _kept_reused)


def _target_unfiltered(logits: torch.Tensor, config: SamplingConfig) -> Law:
    """Target law computed with the model's default settings (temperature 1, no filtering)."""
    return to_probs(logits, SamplingConfig(dtype=config.dtype))


def _control(name: str, changed: dict, description: str, anchor: str, needs: dict | None = None,
             base: Verifier = LEVIATHAN) -> Verifier:
    """A lossless rule (``base``, :data:`~specdec_lab.samplers.rules.LEVIATHAN` by default) with one piece changed
    (``changed``: the :class:`~specdec_lab.samplers.rules.Verifier` field and its faulty value), marked not
    lossless."""
    return replace(base, name=name, lossless=False, description=description, anchor=anchor, needs=needs, **changed)


FAULTY = {v.name: v for v in (
    _control("always_accept", {"accept_prob": _accept_always},
             "every draft token accepted (output law is q, not p)",
             "common re-implementation error (the acceptance test skipped or short-circuited)"),
    _control("residual_from_p", {"residual": _residual_p},
             "after a rejection, resample from p instead of norm((p - q)+)",
             "common re-implementation error (double-counts tokens where p > q)"),
    _control("residual_from_q", {"residual": _residual_q},
             "after a rejection, resample from q",
             "common re-implementation error (resampling on the draft side)"),
    _control("q_untempered", {"draft_law": _draft_q_untempered},
             "draft sampled at temperature T, ratio uses its temperature-1 q",
             "common re-implementation error; the mirror image of vLLM issue #9834 (fixed by PR #10198), where "
             "the two sides were also filtered differently", needs={"temperature": 0.7}),
    _control("q_topk_unnormalised", {"draft_law": _draft_q_topk_unnormalised},
             "draft sampled from top-k, ratio uses q without renormalisation (ratio x 1/Z)",
             "HF transformers issue #47932 (candidate generators returned a q they did not sample from: "
             "the ratio inflated by 1/Z)", needs={"top_k": 20}),
    _control("argmax_draft_softmax_q", {"draft_law": _draft_argmax_softmax_q},
             "draft token is argmax q, yet its softmax q enters the ratio",
             "HF transformers PR #30778 (assistant forced greedy), reported as issue #32867, "
             "reverted by PR #33534"),
    _control("bonus_wrong_position", {"bonus_offset": -1},  # the bonus is token K+1: K = 1 puts it in a 2-token window
             "after K accepts the bonus token is drawn from p at position K, not K+1",
             "common re-implementation error (an off-by-one logits slice)", needs={"k": 1}),
    _control("swapped_ratio", {"accept_prob": _accept_swapped},
             "acceptance with min(1, q/p): target and draft letters swapped",
             "common re-implementation error (target and draft letters swapped between files)"),
    _control("target_unfiltered", {"target_law": _target_unfiltered},
             "target probabilities at default temperature while the draft is tempered",
             "vLLM issue #9834, fixed by PR #10198 (target probabilities at default sampling "
             "parameters while the draft was filtered)", needs={"temperature": 0.7}),
    _control("block_tokenwise_residual", {"residual": _residual_unweighted},
             "block verification whose replacement token comes from the token-wise norm((p - q)+)",
             "vllm-ascend issue #7807, fixed by PR #7808 (block verification with the token-wise residual; its "
             "acceptance was token-wise too)", needs={"k": 2, "top_k": 5}, base=BLOCK),
    _control("block_no_lookahead", {"block": _stop_without_lookahead},
             "block verification whose stop coin at position i is the block weight w_i alone (no look-ahead mass)",
             "vllm-ascend issue #7807, fixed by PR #7808 (its acceptance compared the block weight with a product of "
             "uniforms, without the look-ahead mass; its residual was token-wise)", needs={"k": 2, "top_k": 20},
             base=BLOCK),
    _control("draft_noise_reused", {"noise": REUSED_DRAFT_NOISE},
             "the uniform that drew the draft token is reused as its acceptance uniform",
             "vLLM Model Runner V2 with probabilistic drafting: draft noise, acceptance uniform and recovery draw "
             "from one Philox offset (PR #47386; fixed by PR #54282, which salts the draft's offset)"),
    _control("target_zeroed_before_recovery", {"accept_prob": _accept_never},
             "greedy (n-gram) draft; the acceptance test reads p(x) after recovery zeroed it in place",
             "the n-gram recovery path of vllm-ascend PR #2881's description (p(x) zeroed in place and not "
             "restored; the released kernels restore it)", base=POINT_MASS),
    _control("argmax_draft_logit_q", {"draft_law": _draft_argmax_logit_q},
             "draft token is argmax q, and its raw logits enter the ratio and residual as q",
             "the shape z-lab/dflash issue #74 alleges for greedy block drafters at T > 0 (the reference's own "
             "verification compares tokens and keeps p)"),
)}


# Controls whose fault moves the law of tokens 1-2 by less than 0.01 TV on the bundled pair: the weighted residual only
# matters after a kept draft whose weight fell below 1, so the conditional law of token 2 carries it. Harnesses run
# them at their larger control size (verify: Scale.dependence_samples).
SMALL_EFFECT = ("block_tokenwise_residual",)


def get(name: str) -> Verifier:
    """A faulty verifier by name, with an error listing the valid names."""
    if name not in FAULTY:
        raise ValueError(f"unknown faulty variant {name!r}; valid names: {', '.join(sorted(FAULTY))}")
    return FAULTY[name]


# ---------------------------------------------------------------- tree negative controls


def _select_sibling_independent(p: Law, nodes: torch.Tensor, tree, config, generator):
    """Medusa "nucleus" style: every root-to-leaf path gets its own independent target draws
    y_i ~ p(· | path prefix), kept while they match the path's tokens; the longest match wins
    (first on ties), followed by that path's first non-matching draw (or its leaf bonus draw).

    Each path alone is the lossless "sample from p, keep while it matches" rule; taking the best
    of several independent tries is not: the first token is biased towards the candidates."""
    from specdec_lab.sampling import sample

    B = p.shape[0]
    retrieve = tree.retrieve_indices.to(p.device)  # (P, D+1)
    P, D1 = retrieve.shape
    laws = p[:, retrieve.clamp(min=0)]  # (B, P, D+1, V): the law at each path node
    draws = sample(laws, generator)  # (B, P, D+1): independent per path and position
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=p.device), nodes], dim=1)
    path_tokens = tokens[:, retrieve.clamp(min=0)]  # (B, P, D+1)
    has_next = (retrieve[:, 1:] >= 0)[None]  # (1, P, D)
    match = has_next & (draws[..., :-1] == path_tokens[..., 1:])  # (B, P, D)
    length = torch.cumprod(match.long(), dim=-1).sum(-1)  # (B, P)
    best = length.argmax(-1)  # first longest
    rows = torch.arange(B, device=p.device)
    best_length = length[rows, best]
    token = draws[rows, best, best_length]
    return retrieve[best], best_length, token


TREE_FAULTY = {m.name: m for m in (
    Mode(name="sibling_independent", lossless=False, candidates="topk",
               description="independent target draws per sibling path, longest accepted path wins",
               select=_select_sibling_independent),
)}
TREE_FAULTY_ANCHORS = {"sibling_independent": "Medusa's nucleus/typical code path (ANCHORS: not lossless)"}


# ---------------------------------------------------------------- overlapping random streams


@dataclass(frozen=True)
class OverlappingStreams:
    """A correct sampler fed overlapping random streams: the samples are not independent.

    The client draws its chains in batches of ``requests_per_batch`` requests of ``request_size``
    chains each and derives seeds by "seed + i" at both levels: batch j gets seed s + j, and its
    request r gets (s + j) + r, where s is the seed of the generator handed to :meth:`draw`. Within
    a batch the seeds differ, so **each batch alone is i.i.d. from p exactly** (each request is the
    wrapped sampler with its own generator); across batches they collide — request r of batch j+1
    replays request r+1 of batch j token for token. With the defaults (2 requests of 128 chains per
    batch) 3 of every 8 requests in a 1,024-chain draw are replays.

    Anchor: child streams derived as seed + i (ANCHORS: overlapping random streams); the same
    duplication comes from a seed reused across batches or a generator reset per batch.
    """

    base: object  # the correct sampler wrapped (any config with describe() and draw())
    requests_per_batch: int = 2
    request_size: int = 128

    def __post_init__(self) -> None:
        if self.requests_per_batch < 2 or self.request_size < 1:
            raise ValueError("overlapping streams need requests_per_batch >= 2 and request_size >= 1")

    @property
    def sampling(self) -> SamplingConfig:
        return self.base.sampling

    def describe(self) -> dict:
        return {"sampler": "overlapping_streams", "requests_per_batch": self.requests_per_batch,
                "request_size": self.request_size, "base": self.base.describe(),
                **self.base.sampling.describe()}

    def request_seeds(self, seed: int, n: int) -> list[tuple[int, int]]:
        """(seed, chains) of each request covering n chains: request k is request r = k mod R of
        batch j = k // R, seeded (seed + j) + r."""
        R, g = self.requests_per_batch, self.request_size
        sizes = [min(g, n - start) for start in range(0, n, g)]
        return [(seed + k // R + k % R, size) for k, size in enumerate(sizes)]

    def draw(self, pair, prompt, n, length, generator):
        from specdec_lab.sampling import make_generator
        from specdec_lab.samplers.protocol import SampleResult, merge_stats

        requests = self.request_seeds(generator.initial_seed(), n)
        drawn = {request: self.base.draw(pair, prompt, request[1], length, make_generator(request[0], pair.device))
                 for request in dict.fromkeys(requests)}  # a replayed request is the same draw: run it once
        parts = [drawn[request] for request in requests]
        return SampleResult(torch.cat([r.tokens for r in parts]), None, merge_stats([r.stats for r in parts]))
