"""Goodness of fit and equivalence against an exactly known target law p.

The question is never "do two samplers look alike" but "is sampler S's law equal to p", and p is
computable exactly from the target model. So the main tools are identity tests against p, an upper
confidence bound on TV(q, p) (what a "pass" means), and a planner that says how many samples make a
test able to see a given TV. Conventions follow ``scipy.stats``: public functions validate their
input and return named results that unpack as ``(statistic, pvalue)``.

Here the sampler's unknown law is written q̂ (empirical) / q (true) and the target law p; counts
are ``N_i`` over ``m`` samples.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from scipy import stats as sps

# ------------------------------------------------------------------------------------------ results


class _Result:
    """Unpacks like scipy's results: ``statistic, pvalue = result``."""

    def __iter__(self):
        return iter((self.statistic, self.pvalue))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if np.ndim(getattr(self, f.name)) == 0}


@dataclass(frozen=True)
class ChiSquareResult(_Result):
    statistic: float
    pvalue: float
    df: int
    m: int
    n_bins: int
    merged_mass: float  # target probability pooled into the tail bin
    tail_pvalue: float  # ADK test of the law inside the merged tail (nan when it holds < 2 samples)


@dataclass(frozen=True)
class ADKResult(_Result):
    statistic: float
    pvalue: float
    m: int
    support: int  # |A|, cells kept (tokens with p above the floor, plus one pooled rest cell)
    n_resamples: int


@dataclass(frozen=True)
class ClosenessResult(_Result):
    statistic: float
    pvalue: float
    m_x: int
    m_y: int
    n_resamples: int


@dataclass(frozen=True)
class HolmResult(_Result):
    statistic: float  # number of component tests rejected at level alpha after Holm
    pvalue: float  # Holm-adjusted p-value of the global null (smallest adjusted p-value)
    n_tests: int
    adjusted: np.ndarray


@dataclass(frozen=True)
class KSResult(_Result):
    statistic: float
    pvalue: float
    n: int


@dataclass(frozen=True)
class ZResult(_Result):
    statistic: float
    pvalue: float
    n: int


@dataclass(frozen=True)
class TVBound:
    upper: float  # TV(q, p) <= upper with probability >= confidence
    confidence: float
    chi2_upper: float  # upper bound on chi^2(q_A || p_A) on the kept set A
    tail_mass_p: float  # p(T), target mass outside A
    tail_mass_q_upper: float  # Clopper-Pearson upper bound on q(T)
    m: int
    chi2_route: float = float("nan")  # the chi^2 -> TV route's bound, at its share of 1 - confidence
    mcdiarmid_route: float = float("nan")  # TV plug-in + sqrt(ln(1/delta) / 2m), at its share
    binding: str = "chi2"  # the route that gave ``upper``: "chi2" or "mcdiarmid"


@dataclass(frozen=True)
class CollisionResult(_Result):
    statistic: float  # T = C - (m - 1) sum_i P(X_i) + C(m, 2) sum P^2: excess colliding pairs
    pvalue: float
    collisions: int  # C, colliding pairs among the m samples
    expected: float  # E[C] = C(m, 2) sum_x P(x)^2 under i.i.d. draws from P
    sd: float  # exact null standard deviation of T
    m: int
    n_resamples: int


@dataclass(frozen=True)
class EProcessResult(_Result):
    statistic: float  # final e-value
    pvalue: float  # anytime-valid p-value, min(1, 1 / max_n E_n)
    log_e: np.ndarray  # (n,) path of log E_n
    rejected_at: int | None  # first n with E_n >= 1/alpha, None if never


# ------------------------------------------------------------------------------------------ helpers


def _counts_and_law(counts, p) -> tuple[np.ndarray, np.ndarray, int]:
    counts = np.asarray(counts, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    if counts.shape != p.shape or counts.ndim != 1:
        raise ValueError(f"counts {counts.shape} and p {p.shape} must be 1-D arrays of one length")
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    if (p < 0).any() or not np.isclose(p.sum(), 1.0, atol=1e-9):
        raise ValueError(f"p must be a probability vector (non-negative, sums to 1; sums to {p.sum()!r})")
    m = int(counts.sum())
    if m == 0:
        raise ValueError("no samples: counts sum to zero")
    if (counts[p == 0] > 0).any():
        bad = np.flatnonzero((p == 0) & (counts > 0))[:5]
        raise ValueError(f"samples fell on cells of target probability 0 (e.g. {bad.tolist()}): "
                         "the sampler emitted impossible tokens")
    return counts, p, m


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


# ------------------------------------------------------------------------------------------ tests


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


# ------------------------------------------------------------------------------------------ estimates


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


TV_ROUTES = ("combined", "chi2", "mcdiarmid")


def tv_upper_bound(counts, p, *, confidence: float = 0.99, floor: float | None = None,
                   route: str = "combined") -> TVBound:
    """Upper confidence bound on TV(q, p) from m samples of q and the exact p.

    Parameters
    ----------
    counts, p : array_like, shape (V,)
    confidence : float
        Coverage of the bound, e.g. 0.99.
    floor : float, optional
        χ² route: kept set A = {i: p_i >= floor}; by default the floor c/m (c from 0.5 to 100)
        that minimises the bound expected under H0, chosen from p and m alone.
    route : {"combined", "chi2", "mcdiarmid"}
        "chi2" and "mcdiarmid" are the two bounds below, each at the full level; "combined"
        (the default) runs both at half the error δ = 1 − confidence each and keeps the smaller.

    Returns
    -------
    TVBound
        ``upper`` with P(TV(q, p) <= upper) >= confidence; ``chi2_route`` and ``mcdiarmid_route``
        (each at its share of δ), and ``binding``, the route that gave ``upper``.

    Notes
    -----
    **χ² route.** Split TV over the kept set A and its complement T. On A, Cauchy–Schwarz gives
    Σ_A |q − p| <= √(p(A) · χ²_A) with χ²_A = Σ_A (q_i − p_i)² / p_i. Z/m (the ADK statistic over A)
    is unbiased for χ²_A, with Poissonised variance Σ_A [2 q_i²/p_i² + 4 m q_i (q_i − p_i)²/p_i²] / m²,
    estimated with q_i² and (q_i − p_i)² replaced by their unbiased estimates (and never below half
    the null variance 2|A|/m²). χ²_A is bounded by
    Z/m + z · √Var̂, and TV by ½ √(p(A) χ²_A,up) + ½ (p(T) + q(T)_up), where q(T)_up is the
    Clopper–Pearson upper bound on the tail mass. The two one-sided bounds share the route's error
    by Bonferroni. The multinomial variance is below the Poissonised one, which makes the χ² bound
    conservative, and Cauchy–Schwarz is tight only when |q − p| ∝ p: a small mass moved onto one
    low-probability token has a large χ² and a small TV, and this route's bound is then loose.

    **McDiarmid route** (distribution-free). The plug-in TV̂ = ½ Σ |N_i/m − p_i| is convex in the
    empirical law, so E[TV̂] >= TV (Jensen), and one sample changes it by at most 1/m, so McDiarmid's
    inequality gives P(TV̂ <= E[TV̂] − t) <= exp(−2 m t²): TV <= TV̂ + √(ln(1/δ) / (2m)) with
    probability >= 1 − δ. Its weak point is the plug-in's upward bias, about ½ Σ √(2 p_i / (π m)),
    large on a law with many small cells (a joint law of several tokens).

    **Combined.** Each route at δ/2 (Bonferroni), the smaller kept: valid at 1 − δ, and never
    above the better route at its own level δ by more than that route's cost of halving δ (for
    McDiarmid √(ln(2/δ)/2m) − √(ln(1/δ)/2m)).

    Validation: ``tests/test_stats.py::TestTVUpperBound`` plants alternatives with known TV
    (p from a real bundled-model next-token law and from Zipf laws; q = p tilted toward a peaked or a
    flat law, q = p with mass moved onto one rare token, and q = p itself), draws 400 replicate
    samples for each at m from 2,000 to 50,000 and checks each route's miss rate is at most the
    nominal 1 − confidence (plus binomial slack).

    References
    ----------
    Wellek, S. (2010). Testing Statistical Hypotheses of Equivalence and Noninferiority. CRC.
    McDiarmid, C. (1989). On the method of bounded differences. Surveys in Combinatorics 141, 148-188.

    Examples
    --------
    >>> rng = np.random.default_rng(5)
    >>> p = np.full(100, 0.01)
    >>> bound = tv_upper_bound(rng.multinomial(100_000, p), p)
    >>> bound.upper < 0.03, bound.binding
    (True, 'chi2')
    """
    if route not in TV_ROUTES:
        raise ValueError(f"route must be one of {list(TV_ROUTES)}, got {route!r}")
    counts, p, m = _counts_and_law(counts, p)
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0.5, 1), got {confidence!r}")
    delta = 1.0 - confidence
    share = delta / 2 if route == "combined" else delta
    chi2 = _chi2_route(counts, p, m, share, floor) if route != "mcdiarmid" else None
    mcd = tv_plugin(counts, p) + mcdiarmid_margin(m, share) if route != "chi2" else float("nan")
    chi2_upper, chi2_up, p_tail, q_tail_up = chi2 if chi2 is not None else (float("nan"),) * 4
    if route == "chi2" or (route == "combined" and chi2_upper <= mcd):
        upper, binding = chi2_upper, "chi2"
    else:
        upper, binding = mcd, "mcdiarmid"
    return TVBound(float(min(1.0, upper)), confidence, chi2_up, p_tail, q_tail_up, m,
                   float(min(1.0, chi2_upper)), float(min(1.0, mcd)), binding)


def mcdiarmid_margin(m: int, delta: float) -> float:
    """√(ln(1/δ) / (2m)): how far TV can exceed the plug-in TV̂ with probability at most δ.

    >>> round(mcdiarmid_margin(20_000, 0.005), 4)
    0.0115
    """
    return float(np.sqrt(np.log(1.0 / delta) / (2 * m)))


def _chi2_route(counts: np.ndarray, p: np.ndarray, m: int, delta: float, floor: float | None):
    """(upper, χ²_A upper, p(T), q(T) upper) of the χ² → TV bound at error δ."""
    half = delta / 2.0
    floor = _choose_floor(p, m, half) if floor is None else floor
    a = p >= floor
    tail = ~a & (p > 0)
    n_a, p_a = counts[a], p[a]
    q_hat = n_a / m
    z_over_m = float(_adk_statistic(n_a, p_a, m)) / m
    q2 = np.maximum(0.0, q_hat ** 2 - q_hat / m)  # unbiased for q_i²
    d2 = np.maximum(0.0, (q_hat - p_a) ** 2 - q_hat / m)  # ≈ unbiased for (q_i − p_i)²
    var = float((2 * q2 / p_a ** 2 + 4 * m * q_hat * d2 / p_a ** 2).sum()) / m ** 2
    var = max(var, a.sum() / m ** 2)  # never below half the null variance 2|A|/m²
    chi2_up = max(0.0, z_over_m + sps.norm.isf(half) * np.sqrt(var))
    tail_n = int(counts[tail].sum())
    q_tail_up = 0.0
    if tail.any():
        q_tail_up = 1.0 if tail_n == m else float(sps.beta.isf(half, tail_n + 1, m - tail_n))
    p_tail = float(p[tail].sum())
    upper = 0.5 * np.sqrt(p_a.sum() * chi2_up) + (0.5 * (p_tail + q_tail_up) if tail.any() else 0.0)
    return float(upper), float(chi2_up), p_tail, q_tail_up


def _expected_chi2_route(p: np.ndarray, m: int, half: float, floor: float) -> float:
    """The χ² route's bound expected under H0 at a given floor (Z ≈ 0, q(T) ≈ p(T))."""
    z = sps.norm.isf(half)
    a = p >= floor
    p_tail = float(p[~a].sum())
    q_tail = float(sps.beta.isf(half, m * p_tail + 1, m - m * p_tail)) if p_tail > 0 else 0.0
    return 0.5 * np.sqrt(p[a].sum() * z * np.sqrt(2 * a.sum()) / m) + 0.5 * (p_tail + q_tail)


def _choose_floor(p: np.ndarray, m: int, half: float) -> float:
    """The floor minimising the bound expected under H0 — a function of p and m only, never of the
    data, so choosing it costs no validity."""
    floors = [c / m for c in (0.5, 1, 2, 5, 10, 20, 50, 100)]
    return min(floors, key=lambda floor: _expected_chi2_route(p, m, half, floor))


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


def expected_tv_bound(p, m: int, confidence: float = 0.99) -> dict[str, float]:
    """Each route's bound (and the combined one) expected when the sampler is exactly p: what a
    correct sampler's verdict will show at m samples, computed from p and m alone.

    >>> b = expected_tv_bound(np.full(100, 0.01), 100_000)
    >>> bool(b["combined"] == min(b["chi2 (δ/2)"], b["mcdiarmid (δ/2)"]))
    True
    """
    p = np.asarray(p, dtype=np.float64)
    delta = 1.0 - confidence
    out = {}
    for label, share in (("", delta), (" (δ/2)", delta / 2)):
        out["chi2" + label] = float(min(_expected_chi2_route(p, m, share / 2, c / m)
                                        for c in (0.5, 1, 2, 5, 10, 20, 50, 100)))
        out["mcdiarmid" + label] = expected_tv_plugin(p, m) + mcdiarmid_margin(m, share)
    out["combined"] = min(out["chi2 (δ/2)"], out["mcdiarmid (δ/2)"])
    return out


def plan_tv_bound_samples(p, eps: float, confidence: float = 0.99) -> dict[str, int]:
    """Samples m at which a correct sampler's expected bound (:func:`expected_tv_bound`) reaches ε,
    per route: {"chi2", "mcdiarmid", "combined"} (each route at the full level, combined at δ/2 each).

    >>> plan = plan_tv_bound_samples(np.full(100, 0.01), 0.02)
    >>> plan["combined"] <= 1.2 * min(plan["chi2"], plan["mcdiarmid"])
    True
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    plan = {}
    for key in ("chi2", "mcdiarmid", "combined"):
        def ok(m):
            return expected_tv_bound(p, m, confidence)[key] <= eps
        lo, hi = 1, 2
        while not ok(hi):
            lo, hi = hi, hi * 2
            if hi > 2 ** 34:
                raise ValueError(f"no sample size up to 2^34 reaches eps = {eps} by route {key}")
        while hi - lo > max(1, hi // 1000):
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        plan[key] = int(hi)
    return plan


# ------------------------------------------------------------------------------------------ planning


def plan_bound_by_simulation(p, eps: float, *, confidence: float = 0.99, assurance: float = 0.999,
                             draws: int = 200, rng: np.random.Generator | None = None,
                             precision: float = 0.05) -> int:
    """Samples m at which a correct sampler's :func:`tv_upper_bound` is below ε with probability at
    least ``assurance``, found by simulation from p itself.

    For each candidate m, ``draws`` samples of m i.i.d. draws from p give the bound's mean and sd;
    m passes when mean + z_assurance · sd <= ε (the bound's upper tail is lighter than the normal's
    on the laws tried, so this errs toward more samples). Doubling, then bisection on log m to
    ``precision``. Unlike :func:`plan_tv_bound_samples` (the bound at its expectation under H0, which
    the simulated mean exceeds by ≈ 10% on the bundled target's laws), this sizes a run so that a
    correct sampler's verdict is *equivalent* except with probability about 1 − assurance.

    >>> p = np.full(100, 0.01)
    >>> m = plan_bound_by_simulation(p, 0.05, rng=np.random.default_rng(0))
    >>> rng = np.random.default_rng(1)
    >>> max(tv_upper_bound(rng.multinomial(m, p), p).upper for _ in range(200)) <= 0.05
    True
    """
    p = np.asarray(p, dtype=np.float64)
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    if not 0.5 < assurance < 1:
        raise ValueError(f"assurance must lie in (0.5, 1), got {assurance!r}")
    rng = np.random.default_rng() if rng is None else rng
    z = sps.norm.isf(1 - assurance)

    def ok(m: int) -> bool:
        bounds = np.array([tv_upper_bound(rng.multinomial(m, p), p, confidence=confidence).upper
                           for _ in range(draws)])
        return bounds.mean() + z * bounds.std(ddof=1) <= eps

    lo, hi = 0, 1000
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 2 ** 30:
            raise ValueError(f"no sample size up to 2^30 gets the TV bound below eps = {eps}")
    while lo and hi / lo > 1 + precision:
        mid = int(np.sqrt(lo * hi))
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return int(hi)




def power_chisquare(m: int, eps: float, n_bins: int, alpha: float = 0.01) -> float:
    """Power of the Pearson test with n_bins cells against the worst case at TV ε.

    Noncentrality λ = m Σ (q_i − p_i)² / p_i, at least m (2ε)² for any q at TV ε (the worst case,
    by Cauchy–Schwarz); power = P(χ²_{df}(λ) > χ²_{df, 1−α}).

    >>> round(power_chisquare(232_401, 0.01, 256, 0.01), 3)
    0.9
    """
    df = n_bins - 1
    return float(sps.ncx2.sf(sps.chi2.isf(alpha, df), df, m * (2 * eps) ** 2))


def plan_sample_size(eps: float, n_bins: int, alpha: float = 0.01, power: float = 0.9) -> int:
    """Smallest m for which :func:`power_chisquare` reaches ``power`` (bisection).

    >>> plan_sample_size(0.01, 256)
    232401
    >>> plan_sample_size(0.01, 50_000)
    2881610
    """
    if not (0 < eps <= 1 and 0 < alpha < 1 and 0 < power < 1 and n_bins >= 2):
        raise ValueError("need 0 < eps <= 1, 0 < alpha < 1, 0 < power < 1 and n_bins >= 2")
    lo, hi = 1, 2
    while power_chisquare(hi, eps, n_bins, alpha) < power:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_chisquare(mid, eps, n_bins, alpha) >= power else (mid, hi)
    return hi


def plan_equivalence_samples(eps: float, support: int, confidence: float = 0.99) -> int:
    """Samples m for which a correct sampler's expected :func:`tv_upper_bound` is about ε.

    Under H0, Z/m ≈ 0 with sd √(2|A|)/m, so the bound is ≈ ½ √(z √(2|A|) / m); solving for m and
    adding 50% for the tail term and the variance estimate.

    >>> plan_equivalence_samples(0.02, 200) > 30_000
    True
    """
    z = sps.norm.isf((1 - confidence) / 2)
    return int(np.ceil(1.5 * z * np.sqrt(2 * support) / (4 * eps ** 2)))


# ------------------------------------------------------------------------------------------ meta, anytime


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
