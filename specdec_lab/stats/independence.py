"""Independence: the collision test with an exact null, and the cells of the two-token joint law."""

from __future__ import annotations

import numpy as np

from specdec_lab.stats.results import CollisionResult, _counts_and_law


def _collision_parts(counts: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C, S) along the last axis: colliding pairs Σ N(N − 1)/2 and Σ_i P(X_i) = Σ N P."""
    counts = counts.astype(np.float64)
    return (counts * (counts - 1) / 2).sum(axis=-1), (counts * p).sum(axis=-1)


def _collision_null(p: np.ndarray, m: int, n_resamples: int, rng: np.random.Generator,
                    chunk: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """(C, S) of ``n_resamples`` samples of m i.i.d. draws from p, exactly: the cells expecting at
    least 1/4 of a draw are drawn as a multinomial with one pooled cell for the rest, and the pooled
    cell's draws are placed among its cells by inverse CDF, so a large sparse law costs little."""
    heavy = m * p >= 0.25
    p_heavy, p_light = p[heavy], p[~heavy & (p > 0)]
    light_mass = float(p_light.sum())
    cells = np.append(p_heavy, max(0.0, 1.0 - p_heavy.sum()))
    cdf_light = np.cumsum(p_light) / light_mass if light_mass > 0 else None
    C, S = np.empty(n_resamples), np.empty(n_resamples)
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        counts = rng.multinomial(m, cells / cells.sum(), size=b)  # (b, H + 1)
        c, s = _collision_parts(counts[:, :-1], p_heavy)
        n_light = counts[:, -1]
        if cdf_light is not None and n_light.sum() > 0:
            rep = np.repeat(np.arange(b), n_light)  # replicate of each pooled draw
            cell = np.minimum(np.searchsorted(cdf_light, rng.random(len(rep)), side="right"), len(p_light) - 1)
            keys, hits = np.unique(rep * len(p_light) + cell, return_counts=True)
            c += np.bincount(keys // len(p_light), hits * (hits - 1) / 2, minlength=b)
            s += np.bincount(rep, p_light[cell], minlength=b)
        C[start:start + b], S[start:start + b] = c, s
    return C, S


def collision_test(counts, p, *, alternative: str = "two-sided", n_resamples: int = 4999,
                   rng: np.random.Generator | None = None) -> CollisionResult:
    """Test that m samples are independent draws from the exact law P, by their collisions.

    Parameters
    ----------
    counts : array_like of int, shape (V,)
        How often each cell was sampled; a cell is a whole sequence or a prefix of it (e.g. the
        first two tokens, cell ``x1 * V + x2``), whatever P is exactly known on.
    p : array_like of float, shape (V,)
        The exact law P of a cell under the null.
    alternative : {"two-sided", "greater"}
        "greater" rejects only excess collisions (repeated random streams duplicate samples);
        "two-sided" also rejects too few (samples pushed apart, e.g. antithetic streams).
    n_resamples : int
        Samples of m draws from P that calibrate the statistic.
    rng : numpy.random.Generator, optional

    Returns
    -------
    CollisionResult
        ``collisions`` C (pairs i < j with X_i = X_j) beside its null mean ``expected``
        E[C] = C(m, 2) Σ P²; ``statistic`` T, the colliding pairs in excess of what the draws'
        own probabilities predict (below); ``sd`` its exact null standard deviation; ``pvalue``.

    Notes
    -----
    Under i.i.d. draws from P, C has mean C(m, 2) Σ P² and variance
    C(m, 2)(Σ P² − (Σ P²)²) + 6 C(m, 3)(Σ P³ − (Σ P²)²). The second term — how far the draws'
    probabilities wander — dominates for a peaked law: duplicating every sample barely moves C
    against it. T removes it: a fresh independent draw collides with X_i with probability P(X_i),
    so T = C − (m − 1) Σ_i P(X_i) + C(m, 2) Σ P² is a degenerate U-statistic with kernel
    1[x = y] − P(x) − P(y) + Σ P², mean 0 and exact variance C(m, 2)(Σ P² − 2 Σ P³ + (Σ P²)²).
    A duplicated sample adds about one pair to T. For i.i.d. draws from another law q,
    E[T] = C(m, 2) Σ (q − P)² ≥ 0, so T is also an L2 identity test (Goldreich and Ron 2000).
    T is skewed when a few cells carry most of Σ P², so the p-value comes from samples of m
    draws from P itself (exact up to Monte Carlo error, (1 + #{T_b beyond T}) / (B + 1) per
    side), not from the normal approximation.

    Validity needs P exact on the cells; the test cannot tell which assumption failed — i.i.d.
    or the law — so read it beside the identity tests: identity tests passing and collisions in
    excess point at dependent samples.

    References
    ----------
    Goldreich, O. and Ron, D. (2000). On testing expansion in bounded-degree graphs. ECCC TR00-020
    (the collision statistic). Hoeffding, W. (1948). A class of statistics with asymptotically
    normal distribution. Ann. Math. Statist. 19, 293-325 (U-statistic variance).

    Examples
    --------
    >>> rng = np.random.default_rng(8)
    >>> p = np.full(2000, 1 / 2000)
    >>> x = rng.choice(2000, size=600, p=p)
    >>> collision_test(np.bincount(x, minlength=2000), p, n_resamples=999, rng=rng).pvalue > 0.01
    True
    >>> twice = np.concatenate([x[:300], x[:300]])  # a random stream replayed: 300 draws, each twice
    >>> collision_test(np.bincount(twice, minlength=2000), p, n_resamples=999, rng=rng).pvalue < 0.01
    True
    """
    sides = ("two-sided", "greater")
    if alternative not in sides:
        raise ValueError(f"alternative must be one of {list(sides)}, got {alternative!r}")
    counts, p, m = _counts_and_law(counts, p)
    if m < 2:
        raise ValueError("the collision test needs at least 2 samples")
    rng = np.random.default_rng() if rng is None else rng
    s2, s3 = float((p ** 2).sum()), float((p ** 3).sum())
    pairs = m * (m - 1) / 2
    shift = pairs * s2

    def excess(c, s):
        return c - (m - 1) * s + shift

    c_obs, s_obs = _collision_parts(counts, p)
    t = float(excess(c_obs, s_obs))
    null = excess(*_collision_null(p, m, n_resamples, rng))
    upper = (1 + int((null >= t - 1e-9 * max(1.0, abs(t))).sum())) / (n_resamples + 1)
    lower = (1 + int((null <= t + 1e-9 * max(1.0, abs(t))).sum())) / (n_resamples + 1)
    pvalue = upper if alternative == "greater" else min(1.0, 2 * min(upper, lower))
    sd = float(np.sqrt(max(0.0, pairs * (s2 - 2 * s3 + s2 ** 2))))
    return CollisionResult(t, pvalue, int(c_obs), shift, sd, m, n_resamples)


def pair_cells(first, second, vocab_size: int) -> np.ndarray:
    """Cell index ``x1 * V + x2`` of each (first, second) token pair, for tests on the joint law
    of the first two tokens (whose exact law is a (V, V) table, flattened the same way)."""
    return np.asarray(first, dtype=np.int64) * vocab_size + np.asarray(second, dtype=np.int64)
