"""Candidate trees for Medusa-style verification, and the one target pass that scores a whole tree.

A tree is given, as in Medusa, by its **choice paths**: ``[[0], [0, 0], [1], [0, 1]]`` means: the
root (the last emitted token, not yet fed to the target) has two children, candidates of rank 0 and 1
for the next token; child ``[0]`` has two children of its own, and so on. The rank says *which*
candidate a node holds: the rank-r entry of the depth-d head's top-k list (distinct candidates), or
the r-th i.i.d. draw from that head's law (sampled candidates).

Node 0 is the root; nodes 1..N are the paths sorted by (depth, path), so parents come before their
children. From that order follow

- ``attention_mask`` (N+1, N+1): node i attends to node j iff j is i or an ancestor of i;
- ``position_ids`` (N+1,): each node's depth (added to the chain's length);
- ``retrieve_indices`` (P, D+1): one row per leaf, the node indices of its root-to-leaf path,
  padded with -1.

:class:`TreeDecoder` feeds root + nodes of B chains in one target forward with that mask over the
chains' KV caches, so every candidate path is scored as if it had been fed alone.

>>> tree = Tree.from_choices([[0], [1], [0, 0]])
>>> tree.parents, tree.depths
((-1, 0, 0, 1), (0, 1, 1, 2))
>>> tree.retrieve_indices.tolist()
[[0, 2, -1], [0, 1, 3]]
>>> tree.attention_mask.int().tolist()
[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch

from specdec_lab.samplers.decoder import HEADROOM, Decoder


@dataclass(frozen=True)
class Tree:
    """A candidate tree; node 0 is the root, nodes 1..N are ``paths`` in (depth, path) order."""

    paths: tuple[tuple[int, ...], ...]  # (N,) rank at each depth, root excluded

    @classmethod
    def from_choices(cls, choices) -> "Tree":
        """Validate Medusa-style choice paths and return the tree they describe."""
        paths = sorted({tuple(int(r) for r in path) for path in choices}, key=lambda c: (len(c), c))
        if len(paths) != len(list(choices)):
            raise ValueError("tree choices contain a duplicated path")
        if not paths or any(len(path) == 0 for path in paths):
            raise ValueError("a tree needs at least one non-empty choice path, e.g. [[0]]")
        known = set(paths)
        for path in paths:
            if min(path) < 0:
                raise ValueError(f"choice path {list(path)} has a negative rank")
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"choice path {list(path)} has no parent {list(path[:-1])} in the tree")
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in known:
                raise ValueError(f"choice path {list(path)}: sibling ranks must be 0, 1, 2, ... without gaps")
        return cls(tuple(paths))

    @property
    def num_nodes(self) -> int:
        """N: candidate nodes, the root excluded."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        """D: the longest path, the number of heads the tree needs."""
        return max(len(path) for path in self.paths)

    @property
    def parents(self) -> tuple[int, ...]:
        """Parent node index of every node (the root's is -1)."""
        index = {path: i + 1 for i, path in enumerate(self.paths)}
        index[()] = 0
        return (-1,) + tuple(index[path[:-1]] for path in self.paths)

    @property
    def depths(self) -> tuple[int, ...]:
        return (0,) + tuple(len(path) for path in self.paths)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Each node's rank among its siblings (the root's is 0)."""
        return (0,) + tuple(path[-1] for path in self.paths)

    @property
    def children(self) -> torch.Tensor:
        """(N+1, M) child node indices of every node in rank order, padded with -1."""
        kids = [[] for _ in range(self.num_nodes + 1)]
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                kids[parent].append(node)
        width = max(len(k) for k in kids)
        return torch.tensor([k + [-1] * (width - len(k)) for k in kids], dtype=torch.long)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N+1, N+1) bool: node i sees node j iff j is i or one of its ancestors."""
        parents = self.parents
        mask = torch.eye(self.num_nodes + 1, dtype=torch.bool)
        for node in range(1, self.num_nodes + 1):
            mask[node] |= mask[parents[node]]
        return mask

    @property
    def position_ids(self) -> torch.Tensor:
        return torch.tensor(self.depths, dtype=torch.long)  # (N+1,)

    @property
    def retrieve_indices(self) -> torch.Tensor:
        """(P, D+1): node indices of every root-to-leaf path, padded with -1."""
        parents, D = self.parents, self.depth
        leaves = sorted(set(range(self.num_nodes + 1)) - set(parents))
        rows = []
        for leaf in leaves:
            path = [leaf]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            path.reverse()
            rows.append(path + [-1] * (D + 1 - len(path)))
        return torch.tensor(rows, dtype=torch.long)

    def max_children(self) -> list[int]:
        """Per depth d = 1..D: the most children any depth-(d-1) node has (candidates the head needs)."""
        widest = [0] * self.depth
        for path in self.paths:
            widest[len(path) - 1] = max(widest[len(path) - 1], path[-1] + 1)
        return widest

    def describe(self) -> str:
        return f"{self.num_nodes} nodes, depth {self.depth}"


def chain(depth: int) -> Tree:
    """A single path of ``depth`` rank-0 candidates: Medusa without a tree.

    >>> chain(3).paths
    ((0,), (0, 0), (0, 0, 0))
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"chain depth must be an integer >= 1, got {depth!r}")
    return Tree.from_choices([[0] * d for d in range(1, depth + 1)])


def cartesian(top_k_per_head) -> Tree:
    """Every combination of the top-k_d candidates of head d: Π_d k_d leaves.

    >>> cartesian([2, 2]).num_nodes
    6
    """
    ks = [int(k) for k in top_k_per_head]
    if not ks or min(ks) < 1:
        raise ValueError(f"top_k_per_head needs one integer >= 1 per head, got {list(top_k_per_head)!r}")
    paths = []
    for d in range(1, len(ks) + 1):
        paths.extend(list(p) for p in itertools.product(*(range(k) for k in ks[:d])))
    return Tree.from_choices(paths)


def sparse(rank_probs, num_nodes: int) -> Tree:
    """The ``num_nodes`` most probable paths under independent per-head rank probabilities.

    ``rank_probs[d][r]`` estimates the chance that head d+1's rank-r candidate is the token the
    target emits (e.g. its measured top-k accuracy); a path's score is the product along it. Medusa's
    sparse trees are built the same way from measured head accuracies. Ranks must have non-increasing
    probability, so the chosen set is always a valid tree.

    >>> sparse([[0.6, 0.2], [0.4, 0.1]], 4).paths
    ((0,), (1,), (0, 0), (1, 0))
    """
    probs = [list(map(float, row)) for row in rank_probs]
    if not probs or any(not row for row in probs):
        raise ValueError("rank_probs needs one non-empty row of probabilities per head")
    if any(a < b for row in probs for a, b in zip(row, row[1:])) or any(not 0 < x <= 1 for r in probs for x in r):
        raise ValueError("each row of rank_probs must hold probabilities in (0, 1], non-increasing in rank")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    chosen, frontier = [], [(-probs[0][0], (0,))]
    while frontier and len(chosen) < num_nodes:
        neg, path = heapq.heappop(frontier)
        chosen.append(path)
        depth, rank = len(path), path[-1]
        if rank + 1 < len(probs[depth - 1]):  # next sibling
            heapq.heappush(frontier, (neg / probs[depth - 1][rank] * probs[depth - 1][rank + 1],
                                      path[:-1] + (rank + 1,)))
        if depth < len(probs):  # first child
            heapq.heappush(frontier, (neg * probs[depth][0], path + (0,)))
    return Tree.from_choices(chosen)


class TreeDecoder(Decoder):
    """A :class:`Decoder` that also feeds whole candidate trees and returns hidden states.

    Tree slots go into the cache like any other; after verification every node off the accepted
    path is :meth:`discard`-ed, so the cache again holds exactly each chain's text.
    """

    def prefill_state(self, prompt: torch.Tensor, room: int = HEADROOM) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the whole prompt (P,) once, share its cache across the B chains (``room``: see
        :meth:`Decoder.prefill`), and return the logits (V,) and final hidden state (D,) at its last position."""
        out = self.prefill(prompt, hidden=True, room=room)
        return out.logits[0, -1, : self.vocab_size].double(), out.hidden_states[-1][0, -1]

    def feed_tree(self, tokens: torch.Tensor, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed root + nodes (B, N+1) with tree attention -> logits (B, N+1, V) float64 and final
        hidden states (B, N+1, D)."""
        B, T = tokens.shape
        if T != tree.num_nodes + 1:
            raise ValueError(f"feed_tree needs {tree.num_nodes + 1} tokens per chain (root + nodes), got {T}")
        tree_mask = tree.attention_mask.to(self.device).expand(B, T, T)  # (B, T, T) ancestors and self
        positions = self.lengths[:, None] + tree.position_ids.to(self.device)  # (B, T)
        keep = torch.ones(B, T, dtype=torch.bool, device=self.device)
        out = self.forward(tokens, tree_mask, positions, keep, hidden=True)
        self.passes += 1
        return out.logits[..., : self.vocab_size].double(), out.hidden_states[-1]

    def keep_path(self, kept: torch.Tensor) -> None:
        """After :meth:`feed_tree`: keep only the slots with kept=True (B, N+1) (root + accepted path)."""
        self.discard(~kept)
