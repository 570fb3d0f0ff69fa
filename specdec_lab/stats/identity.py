"""Identity tests against an exactly known law p: Pearson and G with tail merging, ADK, two-sample
closeness, per-prefix conditional tests, randomized PIT, the log-probability z-test, Holm, and the
calibration meta-test and anytime-valid e-process."""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from specdec_lab.stats.results import (ADKResult, ChiSquareResult, ClosenessResult, EProcessResult, HolmResult,
                                       KSResult, ZResult, _counts_and_law)


def merge_tail(p, m: int, min_expected: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Bins for a chi-square test: cells pooled by ascending p until every expected count >= min.

    Returns ``(keep, tail)``: boolean masks over cells; the pooled tail is one extra bin (empty when
    no pooling is needed). The pooled bin itself reaches ``min_expected`` too, when possible.

    >>> keep, tail = merge_tail(np.array([0.5, 0.3, 0.15, 0.04, 0.01]), m=100)
    >>> keep.tolist(), tail.tolist()
    ([True, True, True, False, False], [False, False, False, True, True])
    """
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    expected = m * p[order]
    tail_sorted = np.zeros(len(p), dtype=bool)
    pooled = 0.0
    for j, e in enumerate(expected):
        if e >= min_expected and pooled == 0.0:
            break
        if e >= min_expected and pooled >= min_expected:
            break
        tail_sorted[j] = True
        pooled += e
    tail = np.zeros(len(p), dtype=bool)
    tail[order] = tail_sorted
    tail &= p > 0
    return (~tail) & (p > 0), tail


def chisquare_identity(counts, p, *, statistic: str = "pearson", min_expected: float = 5.0,
                       rng: np.random.Generator | None = None) -> ChiSquareResult:
    """Pearson chi-square or G test of observed counts against the exact law p.

    Parameters
    ----------
    counts : array_like of int, shape (V,)
        How often each cell (token) was sampled.
    p : array_like of float, shape (V,)
        The exact target law.
    statistic : {"pearson", "g"}
        Pearson's X² (Cressie-Read λ = 1) or the likelihood-ratio G (λ = 0).
    min_expected : float
        Cells are pooled in ascending order of p until every bin expects at least this many.
    rng : numpy.random.Generator, optional
        Randomness for the Monte Carlo calibration of the tail test.

    Returns
    -------
    ChiSquareResult
        ``statistic``, ``pvalue`` (asymptotic chi-square, df = bins − 1), ``merged_mass`` (target
        probability pooled into the tail bin) and ``tail_pvalue`` (ADK identity test of the law
        *inside* the pooled tail, conditional on landing there).

    Notes
    -----
    The chi-square approximation is trusted when every expected count is at least about 5, hence
    the pooling. Pooling tests only the coarsened law: a sampler that moves mass *between* tail
    tokens is invisible to the pooled statistic, which is why ``tail_pvalue`` tests the tail
    separately (it needs no minimum count). Combine the two with Bonferroni (``2 min(p1, p2)``) when
    one decision is needed.

    References
    ----------
    Cressie, N. and Read, T. (1984). Multinomial goodness-of-fit tests. JRSS B 46, 440-464.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    >>> res = chisquare_identity(rng.multinomial(1000, p), p, rng=rng)
    >>> res.df, res.pvalue > 0.01
    (4, True)
    """
    lambdas = {"pearson": 1.0, "g": 0.0}
    if statistic not in lambdas:
        raise ValueError(f"statistic must be one of {sorted(lambdas)}, got {statistic!r}")
    counts, p, m = _counts_and_law(counts, p)
    keep, tail = merge_tail(p, m, min_expected)
    observed = np.append(counts[keep], counts[tail].sum()) if tail.any() else counts[keep]
    expected = m * (np.append(p[keep], p[tail].sum()) if tail.any() else p[keep])
    if len(observed) < 2:
        return ChiSquareResult(0.0, 1.0, 0, m, len(observed), float(p[tail].sum()), float("nan"))
    stat, pvalue = sps.power_divergence(observed, expected, lambda_=lambdas[statistic])
    tail_pvalue = float("nan")
    if tail.sum() >= 2 and counts[tail].sum() >= 2:
        inside = p[tail] / p[tail].sum()
        tail_pvalue = adk_identity(counts[tail], inside, n_resamples=2000, rng=rng).pvalue
    return ChiSquareResult(float(stat), float(pvalue), len(observed) - 1, m, len(observed),
                           float(p[tail].sum()), tail_pvalue)


def _adk_statistic(counts: np.ndarray, p: np.ndarray, m: int) -> np.ndarray:
    """Z = Σ [(N_i − m p_i)² − N_i] / (m p_i) along the last axis."""
    expected = m * p
    return (((counts - expected) ** 2 - counts) / expected).sum(axis=-1)


def _adk_cells(counts, p, floor):
    """Cells with p above the floor, plus one pooled cell for the rest (when it has mass); the cells'
    law renormalised, because p may sum to 1 ± 1e-9 and numpy's multinomial refuses a cell above 1
    (all cells pooled into one of mass 1 + 2e-16 once raised in a --scale full run)."""
    keep = p >= floor
    rest = ~keep & (p > 0)
    if rest.any():
        cells_n, cells_p = np.append(counts[keep], counts[rest].sum()), np.append(p[keep], p[rest].sum())
    else:
        cells_n, cells_p = counts[keep], p[keep]
    return cells_n, cells_p / cells_p.sum()


def adk_identity(counts, p, *, floor: float | None = None, n_resamples: int = 10_000,
                 rng: np.random.Generator | None = None) -> ADKResult:
    """The Acharya–Daskalakis–Kamath identity statistic, calibrated by Monte Carlo from p.

    Parameters
    ----------
    counts, p : array_like, shape (V,)
        Observed counts and the exact law.
    floor : float, optional
        Cells with p below ``floor`` are pooled into one cell; default ``1 / (10 m)``.
    n_resamples : int
        Monte Carlo draws of m samples from p used to calibrate Z.
    rng : numpy.random.Generator, optional

    Returns
    -------
    ADKResult
        ``statistic`` Z and Monte Carlo ``pvalue`` (1 + #{Z_b >= Z}) / (B + 1).

    Notes
    -----
    E[Z] = m χ²(q‖p) (Poissonised), so Z concentrates at 0 under H0 with Var(Z) ≈ 2|A|. Z is skewed
    when m p_i ≪ 1, so the p-value comes from draws under p, not from a normal approximation; it is
    exact up to Monte Carlo error for any m. Needs no minimum expected count, and is near
    sample-optimal, Θ(√n / ε²) samples for TV ε.

    References
    ----------
    Acharya, J., Daskalakis, C. and Kamath, G. (2015). Optimal testing for properties of
    distributions. NeurIPS.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> p = np.full(50, 0.02)
    >>> q = np.r_[np.full(25, 0.03), np.full(25, 0.01)]  # TV(q, p) = 0.25
    >>> adk_identity(rng.multinomial(400, q), p, n_resamples=999, rng=rng).pvalue < 0.01
    True
    """
    counts, p, m = _counts_and_law(counts, p)
    rng = np.random.default_rng() if rng is None else rng
    floor = 1.0 / (10 * m) if floor is None else floor
    cells_n, cells_p = _adk_cells(counts, p, floor)
    if len(cells_p) < 2:  # every cell below the floor: one pooled cell, which every law fills alike
        return ADKResult(0.0, 1.0, m, 1, 0)
    z = float(_adk_statistic(cells_n, cells_p, m))
    null = _adk_statistic(rng.multinomial(m, cells_p, size=n_resamples), cells_p, m)
    pvalue = (1 + int((null >= z).sum())) / (n_resamples + 1)
    return ADKResult(z, pvalue, m, len(cells_p), n_resamples)


def closeness_two_sample(x_counts, y_counts, *, n_resamples: int = 5000,
                         rng: np.random.Generator | None = None) -> ClosenessResult:
    """Two-sample closeness test (Chan, Diakonikolas, Valiant, Valiant 2014), by permutation.

    For comparing against a sampler whose law cannot be evaluated (an external engine).

    Parameters
    ----------
    x_counts, y_counts : array_like of int, shape (V,)
        Counts of the two samples over the same cells.

    Returns
    -------
    ClosenessResult
        ``statistic`` Z = Σ [(X_i − Y_i)² − X_i − Y_i] / (X_i + Y_i) over cells with X_i + Y_i > 0,
        and the permutation ``pvalue``.

    Notes
    -----
    The permutation distribution is drawn by splitting the pooled counts at random into groups of
    sizes m_x and m_y (multivariate hypergeometric), which is exact under H0: same law, whatever
    it is, and valid for unequal sample sizes.

    References
    ----------
    Chan, S.-O., Diakonikolas, I., Valiant, P. and Valiant, G. (2014). Optimal algorithms for testing
    closeness of discrete distributions. SODA.

    Examples
    --------
    >>> rng = np.random.default_rng(2)
    >>> p = np.full(20, 0.05)
    >>> closeness_two_sample(rng.multinomial(500, p), rng.multinomial(500, p), rng=rng).pvalue > 0.01
    True
    """
    x = np.asarray(x_counts, dtype=np.int64)
    y = np.asarray(y_counts, dtype=np.int64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x_counts and y_counts must be 1-D arrays of one length")
    rng = np.random.default_rng() if rng is None else rng
    pooled = x + y
    used = pooled > 0
    pooled, x, y = pooled[used], x[used], y[used]
    m_x, m_y = int(x.sum()), int(y.sum())
    if m_x == 0 or m_y == 0:
        raise ValueError("both samples need at least one observation")

    def z_of(a, b):
        return (((a - b) ** 2 - a - b) / (a + b)).sum(axis=-1)

    z = float(z_of(x, y))
    xs = rng.multivariate_hypergeometric(pooled, m_x, size=n_resamples)
    null = z_of(xs, pooled - xs)
    pvalue = (1 + int((null >= z).sum())) / (n_resamples + 1)
    return ClosenessResult(z, pvalue, m_x, m_y, n_resamples)


def holm(pvalues, alpha: float = 0.01) -> HolmResult:
    """Holm's step-down adjustment; the global-null p-value is the smallest adjusted p-value.

    >>> res = holm([0.001, 0.02, 0.5], alpha=0.01)
    >>> res.adjusted.round(3).tolist(), int(res.statistic)
    ([0.003, 0.04, 0.5], 1)
    """
    pv = np.asarray(pvalues, dtype=np.float64)
    if pv.size == 0:
        return HolmResult(0.0, 1.0, 0, pv)
    order = np.argsort(pv)
    k = len(pv)
    stepped = np.maximum.accumulate(pv[order] * (k - np.arange(k)))
    adjusted = np.empty(k)
    adjusted[order] = np.minimum(1.0, stepped)
    return HolmResult(float((adjusted <= alpha).sum()), float(adjusted.min()), k, adjusted)


def conditional_tests(prefix_keys, next_tokens, law_of, *, pit=None, min_count: int = 200,
                      alpha: float = 0.01, n_pit_bins: int = 10,
                      rng: np.random.Generator | None = None) -> HolmResult:
    """Per-prefix G tests of next-token laws, rare prefixes pooled, combined with Holm.

    Parameters
    ----------
    prefix_keys : array_like, shape (n,)
        A hashable key per sample naming its prefix x_<t (e.g. position and prefix tokens).
    next_tokens : array_like of int, shape (n,)
        The token x_t that followed.
    law_of : callable
        ``law_of(key) -> (V,)``: the exact target conditional p(· | prefix) of a key.
    pit : array_like, shape (n,), optional
        Randomized PIT value of each sample (:func:`randomized_pit`); rare prefixes are pooled
        through them. Without it rare prefixes are left out.
    min_count : int
        Prefixes visited at least this often get their own G test (with tail merging).

    Returns
    -------
    HolmResult
        ``pvalue``: Holm-adjusted global p-value over all per-prefix tests and the pooled test.

    Notes
    -----
    The log-likelihood-ratio of the whole sequence sample decomposes exactly into per-prefix
    conditional G statistics, so testing each visited prefix against its exact conditional and
    combining is a test of the sequence law. Rare prefixes have too few visits for a chi-square
    approximation; their randomized PIT values, i.i.d. Uniform(0, 1) under H0, are binned into
    ``n_pit_bins`` equal bins and tested together with one Pearson test.
    """
    keys = np.asarray(prefix_keys)
    tokens = np.asarray(next_tokens)
    uniq, inverse, visits = np.unique(keys, return_inverse=True, return_counts=True)
    pvalues = []
    for j in np.flatnonzero(visits >= min_count):
        p = np.asarray(law_of(uniq[j]), dtype=np.float64)
        counts = np.bincount(tokens[inverse == j], minlength=len(p))
        res = chisquare_identity(counts, p, statistic="g", rng=rng)
        pvalues.append(res.pvalue)
        if not np.isnan(res.tail_pvalue):
            pvalues.append(res.tail_pvalue)
    rare = visits[inverse] < min_count
    if pit is not None and rare.sum() >= 5 * n_pit_bins:
        binned = np.bincount(np.minimum((np.asarray(pit)[rare] * n_pit_bins).astype(int), n_pit_bins - 1),
                             minlength=n_pit_bins)
        pvalues.append(sps.chisquare(binned).pvalue)
    return holm(pvalues, alpha)


def randomized_pit(cdf_below, p_x, rng: np.random.Generator) -> np.ndarray:
    """u = F(x⁻) + V · p(x), V ~ U(0, 1): i.i.d. Uniform(0, 1) under H0 for any discrete law.

    ``cdf_below`` is Σ_{y < x} p(y) in a fixed token order, ``p_x`` the probability of the drawn x.
    """
    cdf_below = np.asarray(cdf_below, dtype=np.float64)
    return cdf_below + rng.random(cdf_below.shape) * np.asarray(p_x, dtype=np.float64)


def pit_ks_test(u) -> KSResult:
    """Kolmogorov–Smirnov test of randomized PIT values against Uniform(0, 1).

    Notes
    -----
    Under H0 the randomized PIT values of all positions of all samples are i.i.d. uniform (each
    position's u is uniform given the past), so the KS distribution applies exactly.

    >>> pit_ks_test(np.random.default_rng(3).random(1000)).pvalue > 0.01
    True
    """
    u = np.asarray(u, dtype=np.float64).ravel()
    res = sps.kstest(u, "uniform")
    return KSResult(float(res.statistic), float(res.pvalue), len(u))


def logprob_ztest(log_p, entropy, varentropy) -> ZResult:
    """T = Σ_t [log p(x_t | x_<t) + H_t] / √(Σ_t Var_t[log p]); ≈ N(0, 1) under H0, two-sided.

    Parameters
    ----------
    log_p : array_like
        Log target probability of each sampled token (any shape; flattened).
    entropy, varentropy : array_like
        Entropy H_t and variance of −log p under p(· | x_<t) at the same positions.

    Notes
    -----
    Each term has conditional mean 0 and variance Var_t under H0, so the sum is a martingale and the
    normal limit holds. Very sensitive to temperature, top-k and top-p bugs, which shift how
    surprising the sampled tokens are.

    >>> rng = np.random.default_rng(4)
    >>> p = np.array([0.6, 0.3, 0.1]); x = rng.choice(3, size=2000, p=p)
    >>> h = -(p * np.log(p)).sum(); v = (p * np.log(p) ** 2).sum() - h ** 2
    >>> logprob_ztest(np.log(p[x]), np.full(2000, h), np.full(2000, v)).pvalue > 0.01
    True
    """
    lp = np.asarray(log_p, dtype=np.float64).ravel()
    h = np.asarray(entropy, dtype=np.float64).ravel()
    v = np.asarray(varentropy, dtype=np.float64).ravel()
    total_var = v.sum()
    if total_var <= 0:
        return ZResult(0.0, 1.0, len(lp))
    t = float((lp + h).sum() / np.sqrt(total_var))
    return ZResult(t, float(2 * sps.norm.sf(abs(t))), len(lp))


def uniformity_test(pvalues) -> KSResult:
    """Calibration meta-test: p-values of a correct sampler over independent seeds are U(0, 1).

    Use continuous (or mid-) p-values; discrete p-values with atoms make KS conservative.

    >>> uniformity_test(np.random.default_rng(6).random(200)).pvalue > 0.01
    True
    """
    return pit_ks_test(pvalues)


def dirichlet_eprocess(bins, null_probs, *, concentration: float = 1.0, alpha: float = 0.01) -> EProcessResult:
    """Anytime-valid test of a multinomial law: the Dirichlet-mixture e-process.

    Parameters
    ----------
    bins : array_like of int, shape (n,)
        The bin of each observation, in arrival order.
    null_probs : array_like, shape (B,)
        Bin probabilities under H0 (e.g. 1/B for randomized-PIT bins).
    concentration : float
        Dirichlet(a, ..., a) prior on the alternative bin law.

    Returns
    -------
    EProcessResult
        The e-value path; ``rejected_at`` is the first n with E_n >= 1/α.

    Notes
    -----
    E_n = ∫ Π_i θ_{b_i} dDir(θ) / Π_i π_{b_i} is the ratio of the Dirichlet-multinomial marginal
    likelihood to the null likelihood: a nonnegative martingale with mean 1 under H0, so by Ville's
    inequality P(sup_n E_n >= 1/α) <= α. A notebook may stop as soon as E_n crosses 1/α, or at any
    other data-dependent time, and keep its error rate.

    References
    ----------
    Lindon, M. and Malek, A. (2022). Anytime-valid inference for multinomial count data. NeurIPS.

    Examples
    --------
    >>> rng = np.random.default_rng(7)
    >>> dirichlet_eprocess(rng.integers(0, 10, 5000), np.full(10, 0.1)).rejected_at is None
    True
    """
    b = np.asarray(bins, dtype=np.int64)
    pi = np.asarray(null_probs, dtype=np.float64)
    B = len(pi)
    onehot_counts = np.zeros(B)
    log_e = np.empty(len(b))
    running = 0.0
    for i, k in enumerate(b):  # predictive Dirichlet update: P(next = k) = (a + n_k) / (aB + n)
        running += np.log((concentration + onehot_counts[k]) / (concentration * B + i)) - np.log(pi[k])
        onehot_counts[k] += 1
        log_e[i] = running
    threshold = np.log(1.0 / alpha)
    crossed = np.flatnonzero(log_e >= threshold)
    peak = float(log_e.max()) if len(log_e) else 0.0
    return EProcessResult(float(np.exp(log_e[-1])) if len(log_e) else 1.0, float(min(1.0, np.exp(-peak))),
                          log_e, int(crossed[0]) + 1 if len(crossed) else None)
