"""Plug-in estimates of TV and KL from counts, and the distribution-free margins around them.

Contract: ``counts`` and ``p`` are arrays of one shape (V,) (checked by ``_counts_and_law``: p a law,
counts non-negative integers, m = Σ counts >= 1); results are floats in [0, 1] for TV (KL in nats, may
be slightly negative after its bias correction). Here q is the law the counts were drawn from.
:func:`plugin_margin` is the plug-in route of :func:`~specdec_lab.stats.bounds.tv_upper_bound`;
:func:`two_sample_tv_upper` bounds TV between two samples when no law is known.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import stats as sps

from specdec_lab.stats.results import _counts_and_law


def tv_plugin(counts, p) -> float:
    """Plug-in ½ Σ |N_i/m − p_i| (biased upward by sampling noise, ~√(n/m))."""
    counts, p, m = _counts_and_law(counts, p)
    return float(0.5 * np.abs(counts / m - p).sum())


def kl_miller_madow(counts, p) -> float:
    """KL(q̂ ‖ p) plug-in minus the Miller–Madow bias (k̂ − 1) / (2m); may be slightly negative.

    >>> p = np.full(4, 0.25)
    >>> round(kl_miller_madow(np.array([250, 250, 250, 250]), p), 6)
    -0.0015
    """
    counts, p, m = _counts_and_law(counts, p)
    q = counts / m
    seen = counts > 0
    plugin = float((q[seen] * np.log(q[seen] / p[seen])).sum())
    return plugin - (int(seen.sum()) - 1) / (2 * m)


def expected_tv_plugin(p, m: int) -> float:
    """E[TV̂] under H0 (samples from p itself), exactly: ½ Σ_i E|N_i/m − p_i| with N_i binomial,
    by de Moivre's mean absolute deviation 2 m p (1 − p) b(⌊m p⌋; m − 1, p).

    >>> round(expected_tv_plugin(np.full(2, 0.5), 2), 6)  # N_1 in {0, 1, 2}: |N_1/2 − 1/2| = 1/2, 0, 1/2
    0.25
    """
    p = np.asarray(p, dtype=np.float64)
    p = p[(p > 0) & (p < 1)]
    mad = 2 * m * p * (1 - p) * sps.binom.pmf(np.floor(m * p), m - 1, p)  # E|N − m p|
    return float(0.5 * mad.sum() / m)


def plugin_margin(m: int, delta: float) -> float:
    """The plug-in route's margin: the largest lower deviation q − N/m of a Binomial(m, q) proportion at level δ,
    over every q in [0, 1] — how far TV can exceed the plug-in TV̂ with probability at most δ.

    Why it holds: with A* = {q > p}, TV = q(A*) − p(A*) and TV̂ = max_A (N(A)/m − p(A)) >= N(A*)/m − p(A*), so
    TV − TV̂ <= q(A*) − N(A*)/m, and N(A*) ~ Binomial(m, q(A*)) for the one fixed (unknown) set A*. For each q,
    P(q − N/m > q − k_q/m) <= δ with k_q the binomial's lower δ-quantile (``binom.ppf``); k_q is nondecreasing in q,
    so on a grid q_0 < q_1 < … the supremum over q in [q_j, q_{j+1}] is at most q_{j+1} − k_{q_j}/m, and the
    margin is the largest of those (exact, finite-sample). It is ≈ z_δ / (2√m), the q = ½ normal quantile:
    at δ = 0.001, 16% below McDiarmid's bounded-differences margin √(ln(1/δ) / 2m).

    >>> round(plugin_margin(45_000, 0.001), 5)  # McDiarmid's: 0.00876
    0.00734
    """
    return _plugin_margin(int(m), float(delta))


@lru_cache(maxsize=4096)
def _plugin_margin(m: int, delta: float) -> float:
    if delta <= 0:
        return 1.0
    step = min(5e-5, float(np.sqrt(np.log(1.0 / delta) / (2 * m))) / 200)  # grid slack <= 0.5% of McDiarmid's margin
    q = np.linspace(0.0, 1.0, int(np.ceil(1.0 / step)) + 1)
    k = sps.binom.ppf(delta, m, q)  # (G,) lower δ-quantile of the count
    return float(min(1.0, (q[1:] - k[:-1] / m).max()))


def two_sample_tv_upper(x_counts, y_counts, confidence: float = 0.99) -> np.ndarray:
    """Upper confidence bound on TV between the laws of two independent samples (no law known):
    TV̂ + √(ln(1/δ)·(1/m_x + 1/m_y)/2), TV̂ = ½ Σ |X_i/m_x − Y_i/m_y|.

    Valid in finite samples: E TV̂ >= TV (Jensen) and one observation moves TV̂ by at most 1/m_x (or 1/m_y), so
    McDiarmid's inequality gives P(TV > TV̂ + t) <= exp(−2t² / (1/m_x + 1/m_y)). Batched: counts (..., V) give
    bounds (...,). Its cost against the exact mode: TV̂ between two samples of one broad law is large (≈ √(V_eff/m))
    and the margin alone needs m >= ln(1/δ)/ε² per sample (11,513 at ε = 0.02) — :func:`plan_two_sample_bound`.

    >>> x, y = np.array([50, 50]), np.array([50, 50])
    >>> round(float(two_sample_tv_upper(x, y)), 4)
    0.2146
    """
    x = np.asarray(x_counts, dtype=np.float64)
    y = np.asarray(y_counts, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"the two count arrays must have one shape, got {x.shape} and {y.shape}")
    m_x, m_y = x.sum(axis=-1), y.sum(axis=-1)
    if np.any(m_x == 0) or np.any(m_y == 0):
        raise ValueError("both samples need at least one observation")
    plugin = 0.5 * np.abs(x / m_x[..., None] - y / m_y[..., None]).sum(axis=-1)
    margin = np.sqrt(np.log(1 / (1 - confidence)) * (1 / m_x + 1 / m_y) / 2)
    return np.minimum(1.0, plugin + margin)
