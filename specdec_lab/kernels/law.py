"""The exact output law of a lossless kernel, per row and position, in closed form.

For one row with target laws p_0..p_n (after its temperature, top-k, top-p) and draft laws
q_0..q_{n−1}, the chain rule (Leviathan et al. 2023) emits at position j, *given that it reaches
j*, a token with law exactly p_j: the kept draft contributes min(p_j, q_j)(x) and the residual
draw (1 − β_j)·norm((p_j − q_j)+)(x) = (p_j − q_j)+(x), whose sum is p_j(x). It reaches j + 1
exactly when it keeps the draft at j, with probability

    β_j = Σ_x min(p_j(x), q_j(x)),

independently of the earlier positions, so P(reach j) = β_0 ⋯ β_{j−1}. The position n (the bonus
position) is reached after n kept drafts and emits from p_n. The drafts' independence across
positions holds at kernel level, where every position's logits are fixed inputs.

>>> import torch
>>> from specdec_lab.kernels.scenarios import standard_batch
>>> law = row_law(standard_batch(vocab_size=500, k=3).rows[0])  # disjoint supports: nothing is kept
>>> law.accept.tolist(), law.reach.tolist()
([0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec_lab.kernels.contract import row_config
from specdec_lab.kernels.scenarios import RowScenario
from specdec_lab.sampling import to_probs


@dataclass(frozen=True)
class RowLaw:
    p: np.ndarray  # (n+1, V) float64: law of the token emitted at position j, given position j is reached
    accept: np.ndarray  # (n,) β_j: probability of keeping the draft at j, given j is reached

    @property
    def reach(self) -> np.ndarray:
        """(n+1,) P(reach j) = β_0 ⋯ β_{j−1}."""
        return np.concatenate([[1.0], np.cumprod(self.accept)])

    @property
    def tokens_per_call(self) -> float:
        """Expected tokens emitted: Σ_j P(reach j)."""
        return float(self.reach.sum())


def row_target_law(row: RowScenario) -> np.ndarray:
    """(K+1, V) float64 target laws of the row, by :func:`~specdec_lab.sampling.to_probs` on its float32
    logits (the values the kernel receives) in float64."""
    config = row_config(np.float32(row.temperature), row.top_k, np.float32(row.top_p), torch.float64)
    return to_probs(row.target_logits.double(), config).numpy()


def kernel_draft_law(row: RowScenario) -> np.ndarray:
    """(K, V) float64 draft laws as the kernel receives them: float32, renormalised (what drafts are drawn from)."""
    q = row.draft_probs.float().double()
    return (q / q.sum(-1, keepdim=True)).numpy()


def row_law(row: RowScenario) -> RowLaw:
    """The exact law of a lossless kernel on ``row``: p_j at each position 0..n and the acceptance β_j."""
    n = row.n_drafts
    p = row_target_law(row)[: n + 1]
    q = kernel_draft_law(row)[:n]
    return RowLaw(p, np.minimum(p[:n], q).sum(-1))
