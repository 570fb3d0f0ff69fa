"""The output law of block verification (:mod:`specdec_lab.samplers.block`), by enumeration of every drafted block.

Under block verification whether draft x_1 is kept depends on the drafts after it, so the law of the emitted
tokens is not a chain of one-step laws (:func:`specdec_lab.laws.sequence_law`): each block is enumerated whole,
all V^K drafts x with their probability Q(x) = Π q_i(x_i), their weights w_i, stop probabilities h_i and the law
of the kept count τ,

    P(τ = j | x) = h_j · Π_{i>j} (1 − h_i)   (j ≥ 1),      P(τ = 0 | x) = Π_{i≥1} (1 − h_i),

then the token after the kept ones (the bonus from p_{K+1}, or the weighted residual). A block that ends before
the window is full starts the next one after its emitted tokens. The tree holds only drafts of positive draft mass,
so its cost is the number of drafted prefixes of up to K − 1 tokens (K with the bonus inside the window) times the
block starts: small under top-k (20^K leaves at top-k = 20) or a small vocabulary
(:func:`~specdec_lab.laws.markov_logits_at`); V^K at temperature 1 without filtering.

>>> import torch
>>> from specdec_lab.laws import markov_logits_at
>>> from specdec_lab.sampling import SamplingConfig
>>> from specdec_lab.samplers.rules import BLOCK
>>> g = torch.Generator().manual_seed(0)
>>> p, q = (torch.log_softmax(2 * torch.randn(5, 5, generator=g, dtype=torch.float64), -1) for _ in range(2))
>>> law = block_sequence_law(markov_logits_at(p, q), 5, 3, 3, SamplingConfig(), BLOCK)
>>> law.max_abs_error < 1e-14
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.laws.common import LogitsAt, SequenceLaw
from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.rules import Verifier

__all__ = ["BlockOutcomes", "BlockTree", "block_first_token_parts", "block_outcomes", "block_sequence_law", "block_tree",
           "tokens_per_pass"]


@dataclass(frozen=True)
class BlockTree:
    """Every block the draft can propose from one start, as a tree: depth d holds the n_d drafted prefixes x_1..x_d
    of positive draft mass (depth 0: the empty prefix), each with the laws of the next token after it.

    Per depth d (lists indexed by d): ``tokens[d]`` (n_d, d); ``parent[d]`` (n_d,) the row of x_<d at depth d − 1;
    ``p[d]`` (n_d, V) the verifier's target law after x_≤d; for d < K ``q_sample[d]`` / ``q_ratio[d]`` (n_d, V),
    what x_{d+1} is drawn from and what the rule believes it was drawn from. ``p[K]`` only when the bonus is wanted."""

    tokens: list
    parent: list
    p: list
    q_sample: list
    q_ratio: list

    @property
    def k(self) -> int:
        return len(self.q_sample)


def block_tree(logits_at: LogitsAt, start: torch.Tensor, k: int, config: SamplingConfig, verifier: Verifier,
               bonus: bool) -> BlockTree:
    """The draft tree of depth K after the emitted prefix ``start`` (t,), pruned to drafts of positive mass, with the
    target at every node (at depth K only when ``bonus``)."""
    tokens, parent = [torch.zeros(1, 0, dtype=torch.long)], [torch.zeros(1, dtype=torch.long)]
    p, q_sample, q_ratio = [], [], []
    for depth in range(k + 1):
        if depth == k and not bonus:
            break
        prefixes = torch.cat([start.expand(len(tokens[depth]), -1), tokens[depth]], dim=1)
        target_logits, draft_logits = logits_at(prefixes)  # (n_d, V) each
        p.append(verifier.target_law(target_logits, config))
        if depth == k:
            break
        laws = verifier.draft_law(draft_logits, config)
        q_sample.append(laws.q_sample)
        q_ratio.append(laws.q_ratio)
        rows, drafted = (laws.q_sample > 0).nonzero(as_tuple=True)  # children of positive draft mass
        tokens.append(torch.cat([tokens[depth][rows], drafted[:, None]], dim=1))
        parent.append(rows)
    return BlockTree(tokens, parent, p, q_sample, q_ratio)


@dataclass(frozen=True)
class BlockOutcomes:
    """What one block emits: ``kept[j]`` (n_j,) is P(τ = j and the drafts are node x_≤j), j = 0..K; ``after[j]``
    (n_j, V) the law of the token after those j kept drafts (the weighted residual; the bonus at j = K when the tree
    holds it); ``tokens[j]`` the nodes' drafts (n_j, j)."""

    kept: list
    after: list
    tokens: list


def block_outcomes(tree: BlockTree, verifier: Verifier) -> BlockOutcomes:
    """The law of τ and of the token after it, node by node (the equations of :mod:`specdec_lab.samplers.block`).

    With G_d(x_≤d) = E[Π_{i>d} (1 − h_i) | x_≤d] (G_K = 1, built from the leaves up),
    P(τ = j, x_≤j) = Q(x_≤j) · h_j(x_≤j) · G_j(x_≤j) for j ≥ 1 and P(τ = 0) = G_0."""
    K = tree.k
    w, mass = [torch.ones(1, dtype=torch.float64)], [torch.ones(1, dtype=torch.float64)]  # per node: w_d, Q(x_≤d)
    for d in range(K):
        rows, x = tree.parent[d + 1], tree.tokens[d + 1][:, -1]
        q_x = tree.q_sample[d][rows, x]
        ratio = torch.where(q_x > 0, tree.q_ratio[d][rows, x], 1.0)
        w.append(verifier.accept_prob(w[d][rows] * tree.p[d][rows, x], ratio))
        mass.append(mass[d][rows] * q_x)
    h = [None]
    for d in range(1, K):
        r = torch.clamp(w[d][:, None] * tree.p[d] - tree.q_ratio[d], min=0.0).sum(-1)  # (n_d,) residual mass r_d
        h.append(verifier.block(w[d], r))
    h.append(w[K])
    survive = torch.ones_like(w[K])  # G_d per node at depth d, from d = K up
    kept = [None] * (K + 1)
    for d in range(K, -1, -1):
        kept[d] = mass[d] * survive * (h[d] if d > 0 else 1.0)
        if d > 0:
            q_x = tree.q_sample[d - 1][tree.parent[d], tree.tokens[d][:, -1]]
            step = q_x * (1.0 - h[d]) * survive  # (n_d,)
            survive = torch.zeros(len(tree.tokens[d - 1]), dtype=torch.float64).index_add_(0, tree.parent[d], step)
    after = [verifier.residual(w[j][:, None] * tree.p[j], tree.q_ratio[j]) for j in range(K)]
    if len(tree.p) > K:
        after.append(tree.p[K])
    return BlockOutcomes(kept, after, tree.tokens)


def block_first_token_parts(logits_at: LogitsAt, k: int, config: SamplingConfig, verifier: Verifier):
    """(kept, replaced), each (V,): the law of the first emitted token split into a kept first draft (τ ≥ 1) and the
    replacement drawn when no draft is kept (τ = 0), after the empty prefix."""
    tree = block_tree(logits_at, torch.zeros(0, dtype=torch.long), k, config, verifier, bonus=False)
    out = block_outcomes(tree, verifier)
    V = tree.p[0].shape[-1]
    kept = torch.zeros(V, dtype=torch.float64)
    for j in range(1, k + 1):
        kept.index_add_(0, out.tokens[j][:, 0], out.kept[j])
    return kept, out.kept[0] * out.after[0][0]


def block_sequence_law(logits_at: LogitsAt, vocab_size: int, k: int, length: int, config: SamplingConfig,
                       verifier: Verifier) -> SequenceLaw:
    """Joint law (V,)*L of the first ``length`` tokens of block verification with K drafts per block."""
    if verifier.bonus_offset != 0:
        raise ValueError("block_sequence_law describes the bonus token at position K+1 only")
    V, L = vocab_size, length
    law = torch.zeros(V ** L, dtype=torch.float64)  # flat over (V,)*L, row-major
    states = [(torch.zeros(0, dtype=torch.long), 1.0)]  # (emitted prefix (t,), its mass): blocks still to start
    while states:
        start, mass = states.pop()
        need = L - len(start)
        out = block_outcomes(block_tree(logits_at, start, k, config, verifier, bonus=need > k), verifier)
        for j in range(k + 1):
            if j >= need:  # the window ends inside the kept drafts
                _add(law, V, start, out.tokens[j][:, :need], mass * out.kept[j])
                continue
            emitted = out.kept[j][:, None] * out.after[j]  # (n_j, V): x_1..x_j, then the token after them
            node, y = emitted.nonzero(as_tuple=True)
            cells = torch.cat([out.tokens[j][node], y[:, None]], dim=1)  # (c, j + 1)
            if j + 1 == need:
                _add(law, V, start, cells, mass * emitted[node, y])
                continue
            for cell, value in zip(cells, emitted[node, y].tolist()):  # the next block starts after these tokens
                states.append((torch.cat([start, cell]), mass * value))
    return SequenceLaw(law.reshape((V,) * L), _target_law(logits_at, V, L, config))


def _add(law: torch.Tensor, V: int, start: torch.Tensor, cells: torch.Tensor, values: torch.Tensor) -> None:
    """law[start + cell] += value for each row of ``cells`` (c, L − t); ``law`` is flat over (V,)*L."""
    full = torch.cat([start.expand(len(cells), -1), cells], dim=1)  # (c, L)
    L = full.shape[1]
    index = (full * (V ** torch.arange(L - 1, -1, -1))).sum(1)
    law.index_add_(0, index, values.to(law.dtype))


def _target_law(logits_at: LogitsAt, V: int, L: int, config: SamplingConfig) -> torch.Tensor:
    """The chain rule of p over all V^L sequences (the reference the block law must equal)."""
    prefixes, reference = torch.zeros(1, 0, dtype=torch.long), torch.ones(1, dtype=torch.float64)
    for step in range(L):
        target_logits, _ = logits_at(prefixes)
        reference = (reference[:, None] * to_probs(target_logits, config)).reshape(-1)
        if step < L - 1:
            prefixes = torch.cat([prefixes.repeat_interleave(V, dim=0), torch.arange(V).repeat(len(prefixes))[:, None]],
                                 dim=1)
    return reference.reshape((V,) * L)


def tokens_per_pass(tree: BlockTree, verifier: Verifier) -> dict:
    """Exact expected tokens per target pass, E[τ] + 1, of one block (``tree`` from :func:`block_tree`) under block
    verification and under the token-wise rule with the same pieces: {"block", "tokenwise"}.

    Token-wise: τ ≥ j exactly when x_1..x_j are each accepted, P = Σ Q(x_≤j) Π_{i≤j} min(1, p_i(x_i)/q_i(x_i))."""
    out = block_outcomes(tree, verifier)
    block = 1.0 + sum(j * float(out.kept[j].sum()) for j in range(tree.k + 1))
    reach, tokenwise = torch.ones(1, dtype=torch.float64), 1.0  # P(x_≤d drafted and each accepted), per node
    for d in range(tree.k):
        rows, x = tree.parent[d + 1], tree.tokens[d + 1][:, -1]
        q_x = tree.q_sample[d][rows, x]
        ratio = torch.where(q_x > 0, tree.q_ratio[d][rows, x], 1.0)
        reach = reach[rows] * q_x * verifier.accept_prob(tree.p[d][rows, x], ratio)
        tokenwise += float(reach.sum())
    return {"block": block, "tokenwise": tokenwise}
