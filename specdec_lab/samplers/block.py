"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv 2403.10444, Algorithm 2): the drafted prefix is judged jointly instead of token by token.

p = target, q = draft (as everywhere in :mod:`specdec_lab.samplers`). After drafting x_1..x_k with
x_i ~ q_i = q(· | x_<i), and with p_i = p(· | x_<i) for i = 1..k+1:

    weight:   w_0 = 1,   w_i = min(1, w_{i-1} · p_i(x_i) / q_i(x_i))                    (i = 1..k)
    residual: r_i = Σ_y (w_i · p_{i+1}(y) − q_{i+1}(y))+                                 (i = 0..k−1)
    stop:     h_i = r_i / (r_i + 1 − w_i)  (i = 1..k−1),   h_k = w_k
    coins:    η_i ~ U(0, 1) independently;  τ = max{i : η_i < h_i}  (0 when no coin succeeds)
    finish:   τ = k -> bonus y ~ p_{k+1};   τ < k -> y ~ norm((w_τ · p_{τ+1} − q_{τ+1})+)
    emit x_1..x_τ, y

The token-wise rule (:func:`specdec_lab.samplers.speculative.verify`) stops at the first rejection; here a
rejected x_i can still be kept when a later coin succeeds, because w carries the excess mass p had over
q along the whole prefix. With k = 1 both rules are the same step. The emitted law is p exactly (Sun et al.,
Theorem 2; checked by enumeration in :mod:`specdec_lab.laws.block`), and the expected number of kept drafts
is at least the token-wise rule's (their Theorem 3; :func:`specdec_lab.laws.block.tokens_per_pass`).

Where r_i + 1 − w_i = 0 (w_i = 1 and p_{i+1} = q_{i+1}) every later weight is 1 too and h_k = 1, so τ > i
surely: h_i is then set to 0 and never read (:func:`specdec_lab.samplers.rules.lookahead_stop`).
"""

from __future__ import annotations

import torch

from specdec_lab.sampling import sample


def block_weights(p_x: torch.Tensor, q_x: torch.Tensor, drafted: torch.Tensor, accept_prob) -> torch.Tensor:
    """w_0..w_K (B, K+1): w_i = accept_prob(w_{i-1} p_i(x_i), q_i(x_i)) = min(1, w_{i-1} p_i(x_i)/q_i(x_i)).

    p_x, q_x, drafted: (B, K). Past a chain's k drafts the weight is carried unchanged (never read)."""
    B, K = p_x.shape
    w = torch.ones(B, K + 1, dtype=p_x.dtype, device=p_x.device)  # (B, K+1), w[:, 0] = 1
    for i in range(K):
        step = accept_prob(w[:, i] * p_x[:, i], q_x[:, i])  # (B,)
        w[:, i + 1] = torch.where(drafted[:, i], step, w[:, i])
    return w


def residual_masses(p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """r_i = Σ_y (w_i p_{i+1}(y) − q_{i+1}(y))+ for i = 0..K−1 -> (B, K). p: (B, K+1, V), q: (B, K, V),
    w: (B, K+1)."""
    K = q.shape[1]
    return torch.clamp(w[:, :K, None] * p[:, :K] - q, min=0.0).sum(-1)  # (B, K)


def stop_probabilities(w: torch.Tensor, r: torch.Tensor, k: torch.Tensor, stop) -> torch.Tensor:
    """h_1..h_K (B, K): ``stop(w_i, r_i)`` for i < k[b] (r_i / (r_i + 1 − w_i) for the correct rule), h_k = w_k,
    0 past k[b]. w: (B, K+1), r: (B, K) holding r_0..r_{K−1}."""
    B, K = r.shape
    i = torch.arange(1, K + 1, device=w.device)[None]  # (1, K) positions 1..K
    w_i = w[:, 1:]  # (B, K)
    r_i = torch.cat([r[:, 1:], torch.zeros(B, 1, dtype=r.dtype, device=r.device)], dim=1)  # (B, K): r_1..r_K
    h = torch.where(i == k[:, None], w_i, stop(w_i, r_i))
    return torch.where(i <= k[:, None], h, 0.0)


def verify_block(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor, verifier,
                 generator: torch.Generator, draft_u: torch.Tensor | None = None):
    """Judge the first k[b] drafts of chain b jointly. p: (B, K+1, V), q: (B, K, V) (the verifier's q_ratio),
    drafts: (B, K), k: (B,) in [0, K] -> (τ (B,) drafts kept, y (B,) the token after them). The coins are fresh
    uniforms (``draft_u``, the drafts' own uniforms, is not used).

    Uses ``verifier.accept_prob`` for the weight step, ``verifier.block`` for the stop rule and
    ``verifier.residual(w_τ · p_{τ+1}, q_{τ+1})`` for the replacement law, so a faulty variant changes one piece (:mod:`specdec_lab.samplers.faulty`)."""
    B, K, V = q.shape
    rows = torch.arange(B, device=p.device)
    if K == 0:  # no chain drafted: a plain sample from p
        return torch.zeros(B, dtype=torch.long, device=p.device), sample(p[:, 0], generator)
    drafted = torch.arange(K, device=p.device)[None] < k[:, None]  # (B, K)
    p_x = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
    q_x = torch.where(drafted, q.gather(-1, drafts[..., None]).squeeze(-1), 1.0)  # (B, K)
    w = block_weights(p_x, q_x, drafted, verifier.accept_prob)  # (B, K+1)
    h = stop_probabilities(w, residual_masses(p, q, w), k, verifier.block)  # (B, K)
    coins = torch.rand(B, K, generator=generator, dtype=p.dtype, device=p.device) < h  # (B, K)
    position = torch.arange(1, K + 1, device=p.device)[None]  # (1, K)
    tau = torch.where(coins, position, 0).amax(dim=1)  # (B,) last successful coin, 0 if none
    at = torch.clamp(torch.minimum(tau, k - 1), min=0)  # (B,) the position the replacement is drawn after
    replacement = verifier.residual(w[rows, at, None] * p[rows, at], q[rows, at])  # (B, V)
    law = torch.where((tau == k)[:, None], p[rows, k + verifier.bonus_offset], replacement)  # (B, V)
    y = sample(law, generator)
    if not bool((law.gather(-1, y[:, None]) > 0).all()):
        raise AssertionError("a replacement token fell outside the support of its law")
    return tau, y
