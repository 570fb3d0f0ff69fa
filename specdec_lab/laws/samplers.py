"""The output law of speculative sampling, computed by enumeration instead of sampling.

p = target, q = draft. For one verification position with laws p and q, a rule keeps draft token x
with probability a(x) = q_s(x) · acc(p(x), q_r(x)) and otherwise (total mass ρ = 1 − Σ a) replaces
it with a draw from the residual r. The emitted token therefore has law

    out(x) = a(x) + ρ · r(x).

For Leviathan's rule a(x) = min(q(x), p(x)) and ρ r(x) = (p(x) − q(x))+, so out = p: the theorem.
:func:`step_law` evaluates this formula for any :class:`~specdec_lab.samplers.rules.Verifier`, and
:func:`sequence_law` chains it over the first L tokens (block positions, rejections restarting a
block, bonus tokens after K accepts), using the same rule pieces the sampler runs.

>>> import torch
>>> from specdec_lab.sampling import SamplingConfig
>>> from specdec_lab.samplers.rules import LEVIATHAN
>>> p_logits = torch.log(torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64))
>>> q_logits = torch.log(torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64))
>>> law = step_law(p_logits, q_logits, SamplingConfig(), LEVIATHAN)
>>> [round(x, 12) for x in law.tolist()]
[0.7, 0.2, 0.1]
"""

from __future__ import annotations

__all__ = ["LogitsAt", "SequenceLaw", "cached_logits_at", "first_token_law", "first_token_logits", "first_token_rule_law",
           "markov_logits_at", "medusa_first_token_law", "medusa_tree_at", "model_logits_at", "sequence_law",
           "step_law", "step_parts", "tree_first_token_law", "tv", "tv_typical", "typical_first_token_law"]

from typing import Callable

import numpy as np
import torch

from specdec_lab.laws.block import block_sequence_law
from specdec_lab.laws.common import LogitsAt, SequenceLaw, tv
from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.rules import Verifier


def step_parts(target_logits: torch.Tensor, draft_logits: torch.Tensor, config: SamplingConfig,
               verifier: Verifier) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, replaced): a(x) and ρ·r(x), each (..., V), for one verification position."""
    p = verifier.target_law(target_logits, config)
    laws = verifier.draft_law(draft_logits, config)
    kept = verifier.noise.kept(laws.q_sample, verifier.accept_prob(p, torch.where(laws.q_sample > 0, laws.q_ratio, 1.0)))
    kept = torch.where(laws.q_sample > 0, kept, 0.0)
    rejected_mass = 1.0 - kept.sum(dim=-1, keepdim=True)
    return kept, rejected_mass * verifier.residual(p, laws.q_ratio)


def step_law(target_logits: torch.Tensor, draft_logits: torch.Tensor, config: SamplingConfig,
             verifier: Verifier) -> torch.Tensor:
    """Law (..., V) of the first token one verification step emits."""
    kept, replaced = step_parts(target_logits, draft_logits, config, verifier)
    return kept + replaced


def sequence_law(logits_at: LogitsAt, vocab_size: int, k: int, length: int, config: SamplingConfig,
                 verifier: Verifier, bonus_law: Callable | None = None) -> SequenceLaw:
    """Joint law of the first ``length`` tokens of speculative sampling with K drafts per block.

    ``logits_at(prefixes)`` maps prefixes (n, t) of emitted tokens to (target_logits, draft_logits),
    each (n, V). Enumerates all V^length sequences, so keep V^length small (V=512 with length 2 is
    262k cells). State per prefix: the position i = 0..K inside the current block (K = bonus).
    ``bonus_law(target_logits, config)``, when given, is the law the bonus token is drawn from
    instead of the verifier's p (a planted fault: e.g. the bonus sampled at another temperature).
    A block verifier (``verifier.block``) is enumerated block by block (:func:`specdec_lab.laws.block.block_sequence_law`).
    """
    if verifier.block:
        if bonus_law is not None:
            raise ValueError("bonus_law is not supported for block verification")
        return block_sequence_law(logits_at, vocab_size, k, length, config, verifier)
    V, K = vocab_size, k
    prefixes = torch.zeros(1, 0, dtype=torch.long)  # (n, t)
    mass = torch.zeros(1, K + 1, dtype=torch.float64)  # (n, K+1) mass at each block position
    mass[0, 0] = 1.0
    reference = torch.ones(1, dtype=torch.float64)  # (n,) target's law of each prefix
    parent_p = None  # target law one position back: set only for a verifier whose bonus is drawn from there
    for step in range(length):
        target_logits, draft_logits = logits_at(prefixes)  # (n, V) each
        p_used = verifier.target_law(target_logits, config)
        kept, replaced = step_parts(target_logits, draft_logits, config, verifier)
        bonus = p_used if parent_p is None else parent_p  # (n, V) law of a bonus token
        if bonus_law is not None:
            bonus = bonus_law(target_logits, config)
        child = torch.zeros(len(prefixes), V, K + 1, dtype=torch.float64)  # (n, V, K+1)
        child[:, :, 1:] += mass[:, None, :K] * kept[:, :, None]  # accepted: advance in the block
        child[:, :, 0] += (mass[:, None, :K] * replaced[:, :, None]).sum(-1)  # rejected: new block
        child[:, :, 0] += mass[:, None, K] * bonus  # bonus token: new block
        reference = (reference[:, None] * to_probs(target_logits, config)).reshape(-1)
        mass = child.reshape(-1, K + 1)
        if step == length - 1:
            break  # the children's prefixes and parent laws would be (n V, V): a GiB at V = 512, unused
        if verifier.bonus_offset != 0:
            parent_p = p_used.repeat_interleave(V, dim=0)  # law at each child's parent prefix
        prefixes = torch.cat([prefixes.repeat_interleave(V, dim=0),
                              torch.arange(V).repeat(len(prefixes))[:, None]], dim=1)
    shape = (V,) * length
    return SequenceLaw(mass.sum(-1).reshape(shape), reference.reshape(shape))


def model_logits_at(pair, context: torch.Tensor, batch: int = 512) -> LogitsAt:
    """``logits_at`` for a real model pair after ``context`` (C,): one batched forward per chunk."""

    @torch.no_grad()
    def logits_at(prefixes: torch.Tensor):
        n = len(prefixes)
        seqs = torch.cat([context.expand(n, -1), prefixes], dim=1).to(pair.device)  # (n, C + t)
        outs = []
        for model in (pair.target, pair.draft):
            chunks = [model(input_ids=c).logits[:, -1, : pair.vocab_size].double().cpu()
                      for c in seqs.split(batch)]
            outs.append(torch.cat(chunks))
        return outs[0], outs[1]

    return logits_at


def first_token_logits(pair, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits (V,) each, in float64, for the token right after the prompt."""
    target_logits, draft_logits = model_logits_at(pair, prompt_ids)(torch.zeros(1, 0, dtype=torch.long))
    return target_logits[0], draft_logits[0]


def first_token_law(pair, prompt_ids: torch.Tensor, sampling: SamplingConfig = SamplingConfig()) -> np.ndarray:
    """The exact target law p(· | prompt) after ``sampling``, as a float64 array (V,)."""
    target_logits, _ = model_logits_at(pair, prompt_ids)(torch.zeros(1, 0, dtype=torch.long))
    return to_probs(target_logits[0], sampling).numpy()


def first_token_rule_law(pair, prompt_ids: torch.Tensor, config) -> np.ndarray:
    """The exact law (V,) of the first token a speculative sampler emits after the prompt (``config``: a
    :class:`~specdec_lab.samplers.speculative.SpeculativeConfig`, its sampling and verifier)."""
    if config.verifier.block:  # whether x_1 is kept depends on the later drafts: enumerate the whole block
        law = block_sequence_law(model_logits_at(pair, prompt_ids), pair.vocab_size, config.k, 1, config.sampling,
                                 config.verifier)
        return law.law.numpy()
    target_logits, draft_logits = first_token_logits(pair, prompt_ids)
    return step_law(target_logits, draft_logits, config.sampling, config.verifier).numpy()


def cached_logits_at(pair, context: torch.Tensor) -> LogitsAt:
    """:func:`specdec_lab.model_logits_at`, remembering each answer: many rules' exact laws
    over the same prefixes then cost one set of forwards."""
    compute = model_logits_at(pair, context)
    memo = {}

    def logits_at(prefixes: torch.Tensor):
        key = (tuple(prefixes.shape), prefixes.numpy().tobytes())
        if key not in memo:
            memo[key] = compute(prefixes)
        return memo[key]

    return logits_at


def markov_logits_at(target_table: torch.Tensor, draft_table: torch.Tensor) -> LogitsAt:
    """``logits_at`` for first-order Markov chains given as (V, V) log-probability tables.

    The first token conditions on state 0. Useful for adversarial small-vocabulary checks.
    """
    def logits_at(prefixes: torch.Tensor):
        state = prefixes[:, -1] if prefixes.shape[1] else torch.zeros(len(prefixes), dtype=torch.long)
        return target_table[state], draft_table[state]

    return logits_at


# ---------------------------------------------------------------- one Medusa tree step


def tree_first_token_law(p_root: torch.Tensor, children: torch.Tensor | None, q: torch.Tensor | None,
                         mode: str, num_children: int | None = None) -> torch.Tensor:
    """Exact law (V,) of the first token a lossless tree step emits at a node with target law p_root.

    ``rejection_topk``: ``children`` (m,) are the distinct candidates, tried in order; c_i is kept
    with p_i(c_i), else p_{i+1} = p_i without c_i, renormalised. ``rejection_iid``: ``num_children``
    i.i.d. draws from ``q`` (V,); child i keeps x with mass min(q, p_i)(x), else
    p_{i+1} = norm((p_i − q)+). All rejected: a draw from p_{m+1}. Both return p_root (the claim).

    >>> p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    >>> q = torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64)
    >>> bool(torch.allclose(tree_first_token_law(p, None, q, "rejection_iid", 3), p, atol=1e-15))
    True
    >>> bool(torch.allclose(tree_first_token_law(p, torch.tensor([2, 0]), None, "rejection_topk"), p))
    True
    """
    from specdec_lab.samplers.rules import residual_positive_part

    law, reach, p_i = torch.zeros_like(p_root), 1.0, p_root
    if mode == "rejection_topk":
        for c in children.tolist():
            law[c] += reach * p_i[c]
            reach = reach * (1 - p_i[c])
            removed = p_i.clone()
            removed[c] = 0.0
            p_i = removed / removed.sum() if removed.sum() > 0 else p_i
    elif mode == "rejection_iid":
        for _ in range(num_children):
            kept = torch.minimum(q, p_i)  # (V,) q(x)·min(1, p_i(x)/q(x))
            law += reach * kept
            reach = reach * (1 - kept.sum())
            p_i = residual_positive_part(p_i, q)
    else:
        raise ValueError(f"unknown lossless tree mode {mode!r}; valid modes: rejection_topk, rejection_iid")
    return law + reach * p_i


def typical_first_token_law(p: torch.Tensor, nodes: torch.Tensor, tree, epsilon: float,
                            alpha: float) -> torch.Tensor:
    """Exact law (V,) of the first token of one Medusa typical-acceptance step.

    p: (N+1, V) target law at the root and every node (at the sampling temperature); nodes: (N,) the
    deterministic top-k candidates. Typical acceptance is deterministic given them: when some path
    has an accepted first node, the longest one (first on ties) fixes the first token (a point mass);
    otherwise the first token is drawn from p at the root.
    """
    from specdec_lab.samplers.medusa import longest_path, typical_accepted

    accepted = typical_accepted(p[None], nodes[None], tree, epsilon, alpha)[0]  # (N+1,)
    retrieve = tree.retrieve_indices
    on_path = accepted[retrieve.clamp(min=0)] & (retrieve >= 0)  # (P, D+1)
    best, length = longest_path(on_path[None], tree)
    if int(length[0]) == 0:
        return p[0].clone()
    first = int(nodes[int(retrieve[int(best[0]), 1]) - 1])
    law = torch.zeros_like(p[0])
    law[first] = 1.0
    return law


@torch.no_grad()
def medusa_tree_at(pair, heads, context: torch.Tensor, tree):
    """Real laws for one Medusa step after ``context`` (C,) (C >= 2; its last token is the root).

    Returns (node tokens (N,) top-k candidates, target logits (N+1, V), head logits (H, V)), all
    float64 logits; apply :func:`~specdec_lab.sampling.to_probs` at any temperature."""
    from specdec_lab.samplers.tree import TreeDecoder

    decoder = TreeDecoder(pair.target, pair.vocab_size, 1, pair.device)
    _, hidden = decoder.prefill_state(context[:-1].to(pair.device))
    head_logits = heads(hidden)[:, : pair.vocab_size].double()  # (H, V)
    width = max(tree.max_children())
    top = torch.topk(head_logits, width, dim=-1).indices  # (H, width)
    depth = torch.tensor(tree.depths[1:]) - 1
    nodes = top[depth, torch.tensor(tree.ranks[1:])]  # (N,)
    tokens = torch.cat([context[-1:].to(pair.device), nodes])[None]
    logits, _ = decoder.feed_tree(tokens, tree)
    return nodes.cpu(), logits[0].cpu(), head_logits.cpu()


def tv_typical(target_logits: torch.Tensor, nodes: torch.Tensor, tree, epsilons, alphas,
               temperatures) -> list[dict]:
    """Exact TV(first-token law of typical acceptance, p) over a grid of ε, α and temperature.

    ``target_logits`` (N+1, V) and ``nodes`` (N,) from :func:`medusa_tree_at`; top-k candidates do
    not depend on the temperature, the target laws do. Rows: {"epsilon", "alpha", "temperature", "tv"}.
    """
    rows = []
    for temperature in temperatures:
        p = to_probs(target_logits, SamplingConfig(temperature=temperature))
        for epsilon in epsilons:
            for alpha in alphas:
                law = typical_first_token_law(p, nodes, tree, epsilon, alpha)
                rows.append({"epsilon": epsilon, "alpha": alpha, "temperature": temperature,
                             "tv": float(tv(law, p[0]))})
    return rows


def medusa_first_token_law(pair, heads, context: torch.Tensor, config):
    """(law, p): the exact law (V,) of the first token a Medusa sampler (``MedusaConfig``) emits
    after ``context`` and the target's p (V,) from the same forward; law is None for a mode without
    an exact law here (the sibling-independent negative control)."""
    tree = config.tree
    nodes, logits, head_logits = medusa_tree_at(pair, heads, context, tree)
    p = to_probs(logits, config.sampling)  # (N+1, V)
    root_children = tree.children[0][tree.children[0] >= 0]
    if config.mode == "typical":
        return typical_first_token_law(p, nodes, tree, config.epsilon, config.alpha), p[0]
    if config.mode == "rejection_topk":
        return tree_first_token_law(p[0], nodes[root_children - 1], None, "rejection_topk"), p[0]
    if config.mode == "rejection_iid":
        q = to_probs(head_logits, config.sampling)
        return tree_first_token_law(p[0], None, q[0], "rejection_iid", len(root_children)), p[0]
    if config.mode == "greedy":
        return p[0], p[0]
    return None, p[0]
