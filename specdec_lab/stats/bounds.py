"""Equivalence: plug-in estimates of TV and KL, and the certified upper confidence bound on TV(q, p).

A "pass" is never "not rejected": it is an upper confidence bound on TV(q, p) below a tolerance.
In ``specdec_lab.stats`` q is the law the counts were drawn from (these are generic two-law tools); in
the reports, docs and notebooks that law is the sampler's, written *out*, and q is the draft's.
This module holds that bound (:func:`tv_upper_bound`) and what the planners need to know about it
under H0 (:func:`expected_tv_bound`, :class:`BoundPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from scipy import stats as sps

from specdec_lab.stats.results import _counts_and_law

TV_ROUTES = ("combined", "holder", "plugin")
# How the combined bound spends δ = 1 − confidence (Bonferroni): the Hölder route's kept-set test and its tail
# (Clopper–Pearson) at the chosen floor, the same at the coarse floor, and the shape-free plug-in route. The
# kept-set test is where a correct sampler's bound comes from, so it gets most of δ; the tail holds ≈ m·p(T) <= a
# few samples at the chosen floor, so 0.05δ costs it little; the coarse floor and the plug-in route are the
# fallbacks for deviations that Hölder's weights see badly (mass moved onto cells whose expected count is far below
# one; mass piled on a few tokens), and their margins grow slowly as their share shrinks (the plug-in route's,
# ≈ z_δ / 2√m, only 7% from 0.2δ to 0.1δ).
KEPT_SHARE, TAIL_SHARE, COARSE_SHARE, PLUGIN_SHARE = 0.8, 0.05, 0.05, 0.1
# Candidate floors τ = c / m of the kept set A = {p >= τ} (0: every cell with p > 0; then the tail is empty and its
# share of δ goes to the kept-set test)
FLOOR_MULTIPLES = (0, 0.01, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20)
# The coarse floor, c / m: cells whose expected count under p is below ½ go to its Clopper–Pearson tail. The chosen
# floor (the one that minimises the bound under H0) is often far lower on large supports (0.01/m on the two-token
# laws), where mass moved onto cells of expected count ≈ 0.01–0.04 gives Hölder a large D for a small TV; the coarse
# floor's tail reads that mass as ½ (p(T) + q(T)). Its share goes to the chosen floor's kept-set test when no cell
# with p > 0 lies in [chosen floor, coarse floor) (the two floors would keep the same cells).
COARSE_FLOOR_MULTIPLE = 0.5
# A floor c/m with more than this many cells of p >= c/m (p = 0 included at c = 0) is not a candidate (unless none
# is left): building its test costs seconds (deviation_shapes is (n_shapes, |A|)), for the few cells below c = 0.01
MAX_KEPT_CELLS = 65_536
_GRID_RATIO = 1.002  # the kept-set bound is read off a geometric grid of x: rounded up by at most 0.2%


@dataclass(frozen=True)
class TVBound:
    upper: float  # TV(q, p) <= upper with probability >= confidence
    confidence: float
    m: int
    holder_route: float  # kept-set bound + tail bound at the chosen floor τ, at its share of δ
    plugin_route: float  # TV plug-in + plugin_margin(m, δ_P), at its share of δ
    binding: str  # the route that gave ``upper``: "holder", "holder-coarse" or "plugin"
    kept_upper: float  # upper bound on ½ Σ_A |q_i − p_i| over the kept set A = {p >= τ}
    d_estimate: float  # W, the unbiased estimate of D = Σ_A p_i^(−2/3) (q_i − p_i)²
    tail_mass_p: float  # p(T), target mass outside A
    tail_mass_q_upper: float  # Clopper–Pearson upper bound on q(T)
    floor: float  # τ
    coarse_route: float = float("nan")  # the Hölder route at the coarse floor (NaN where it is left out)
    coarse_floor: float = float("nan")


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
    at δ = 0.001, 16% below McDiarmid's bounded-differences margin √(ln(1/δ) / 2m), which it replaces.

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


# ------------------------------------------------------------------------------------------ the kept-set test


def deviation_shapes(p_a: np.ndarray) -> np.ndarray:
    """Unit-ℓ1 deviation profiles s (rows, shape (n_shapes, |A|)) over which the kept-set test takes
    its least-favourable alternative: q = p + 2x·s has ½ Σ_A |q − p| = x.

    To leading order the test's margin at q is D − z sd with D = Σ a d², a = p^(−2/3), and
    m² Var ≈ 2S + 4m Σ b d², b = p^(−1/3). Its stationary points on the ℓ1 sphere are
    |d_i| ∝ 1/(a_i − κ b_i) for one scalar κ in [0, min a/b) (κ = 0: the Hölder-equality profile
    d ∝ p^(2/3), which minimises D; κ → min a/b: the profile piles onto the most likely token, which
    maximises the variance), so the family holds every κ on a fine grid, the Cauchy–Schwarz-equality
    profile d ∝ p, and mixtures of each of the three most likely tokens with the κ profiles.
    """
    a, b = p_a ** (-2.0 / 3.0), p_a ** (-1.0 / 3.0)
    kappas = float((a / b).min()) * (1.0 - np.geomspace(1.0, 1e-4, 40))  # 0 ... just below min a/b
    spread = 1.0 / (a[None, :] - kappas[:, None] * b[None, :])  # (40, |A|), all positive
    spread /= spread.sum(1, keepdims=True)
    rows = [spread, (p_a / p_a.sum())[None], (np.sqrt(p_a) / np.sqrt(p_a).sum())[None]]
    for j in np.argsort(-p_a)[:3]:
        spike = np.zeros_like(p_a)
        spike[j] = 1.0
        for f in (0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
            rows.append(f * spike[None] + (1 - f) * spread[::4])
    return np.concatenate(rows)


def poisson_quadratic_k3(c: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Third cumulant of Y = (N − μ)² − N for N ~ Poisson(λ) and c = λ − μ (the count's deviation from the
    H0 mean μ = m p): κ3(Y) = 8c³λ + (24c² + 24c + 4)λ² + 8λ³ (from Poisson's cumulant generating function;
    its mean is c² and its variance 4c²λ + 2λ², the terms of W's variance).

    >>> n = np.random.default_rng(0).poisson(30.0, 2_000_000)  # λ = 30, μ = 25: c = 5
    >>> y = (n - 25.0) ** 2 - n
    >>> bool(abs(sps.kstat(y, 3) / poisson_quadratic_k3(np.array(5.0), np.array(30.0)) - 1) < 0.05)
    True
    """
    return 8 * c ** 3 * lam + (24 * c ** 2 + 24 * c + 4) * lam ** 2 + 8 * lam ** 3


SKEW_CAP = 1.0  # the skewness the lift may use is clipped to [0, SKEW_CAP]


def _x_grid() -> np.ndarray:
    """The geometric grid of x on which the kept-set test is inverted: 1e-7 ... 1 in steps of :data:`_GRID_RATIO`."""
    return _GRID_RATIO ** np.arange(int(np.ceil(np.log(1e-7) / np.log(_GRID_RATIO))), 1)


@dataclass(frozen=True)
class _QuantileTerms:
    """The parts of the kept-set test's lower-δ quantile of W that depend on (p_A, m, δ) only."""

    shapes: np.ndarray  # (n_shapes, |A|): deviation_shapes(p_A)
    z: float
    m: int
    S: float
    alpha: np.ndarray  # (n_shapes,): D = alpha x²
    c1: np.ndarray  # (n_shapes,): m² Var(W) at q = p + 2x s (Poissonised) = 2S + c1 x + c2 x² + c3 x³
    c2: np.ndarray
    c3: np.ndarray

    @classmethod
    def of(cls, p_a: np.ndarray, m: int, delta: float) -> "_QuantileTerms":
        a = p_a ** (-2.0 / 3.0)
        shapes = deviation_shapes(p_a)  # (n_shapes, |A|)
        a2 = a ** 2
        return cls(shapes, float(sps.norm.isf(delta)), m, float((p_a ** (2.0 / 3.0)).sum()),
                   4 * (shapes ** 2 * a).sum(1), 8 * (shapes * a2 * p_a).sum(1),
                   8 * (shapes ** 2 * a2).sum(1) + 16 * m * (shapes ** 2 * a2 * p_a).sum(1),
                   32 * m * (shapes ** 3 * a2).sum(1))

    def at(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(normal quantile, sd, m² Var) of W per shape (rows) at each x of ``xs`` (columns)."""
        x = xs[None, :]
        var = 2 * self.S + self.c1[:, None] * x + self.c2[:, None] * x ** 2 + self.c3[:, None] * x ** 3
        sd = np.sqrt(var) / self.m
        return self.alpha[:, None] * x ** 2 - self.z * sd, sd, var


@dataclass(frozen=True)
class KeptSetTest:
    """The Hölder test on the kept set A, inverted into an upper bound on x = ½ Σ_A |q_i − p_i|.

    ``xs`` is a geometric grid of x and ``thresholds[k]`` = t(x_k), the least-favourable
    lower-δ quantile of W over every q in :func:`deviation_shapes` with ½ Σ_A |q − p| = x_k.
    W below t(x) rejects "the kept-set deviation is x"; the bound is the grid point just above
    the largest x not rejected.
    """

    p_a: np.ndarray  # (|A|,) the target law on the kept set
    m: int
    delta: float
    xs: np.ndarray  # (n_grid,)
    thresholds: np.ndarray  # (n_grid,)

    @classmethod
    def build(cls, p_a: np.ndarray, m: int, delta: float, skew: bool = True) -> "KeptSetTest":
        """The test at level δ. ``skew``: lift each normal quantile by W's skewness (Cornish–Fisher,
        :func:`skew_lift`); without it the plain normal quantile."""
        terms = _QuantileTerms.of(p_a, m, delta)
        xs = _x_grid()
        quantiles, sd, var = terms.at(xs)
        if skew:
            quantiles += sd * skew_lift(p_a, terms.shapes, m, terms.z, xs, var)  # the lift is in units of sd
        return cls(p_a, m, delta, xs, quantiles.min(0))

    @staticmethod
    def unskewed_upper_at_zero(p_a: np.ndarray, m: int, delta: float) -> float:
        """``KeptSetTest.build(p_a, m, delta, skew=False).upper(0.0)`` without the grid (the floor search's
        criterion, evaluated at up to ten floors per bound).

        Without the lift each shape's threshold α x² − z sd(x) is <= 0 exactly on (0, r] for one root r:
        α²m²x⁴ − z²(2S + c1 x + c2 x² + c3 x³) has one sign change (c1, c2, c3 >= 0: every shape is >= 0), so
        one positive root (Descartes). So is their minimum, and the grid point sought — the one above the
        largest x_k with t(x_k) <= 0 — is found by bisection over the grid index, each step evaluating the same
        expression as :meth:`build` at one x.

        >>> p = np.random.default_rng(0).dirichlet(np.ones(50))
        >>> KeptSetTest.unskewed_upper_at_zero(p, 5000, 0.01) == KeptSetTest.build(p, 5000, 0.01, False).upper(0.0)
        True
        """
        terms = _QuantileTerms.of(p_a, m, delta)
        xs = _x_grid()

        def at_or_below_zero(k: int) -> bool:
            return bool(terms.at(xs[k:k + 1])[0].min() <= 0)

        if not at_or_below_zero(0):
            return 0.0
        lo, hi = 0, len(xs) - 1  # t(x_lo) <= 0; the answer is the largest such index
        if at_or_below_zero(hi):
            return float(xs[-1])
        while hi - lo > 1:  # t(x_lo) <= 0 < t(x_hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if at_or_below_zero(mid) else (lo, mid)
        return float(xs[hi])

    def upper(self, w: float) -> float:
        """The bound on ½ Σ_A |q − p| given the statistic W."""
        return float(self.uppers(np.array([w]))[0])

    def uppers(self, ws: np.ndarray) -> np.ndarray:
        """:meth:`upper` of each W in ``ws`` (n,): the grid point just above the largest x with t(x) <= W
        (0 when W is below every threshold: every x is rejected, even x = 0)."""
        suffix_min = np.minimum.accumulate(self.thresholds[::-1])[::-1]  # (n_grid,) nondecreasing
        last = np.searchsorted(suffix_min, ws, side="right") - 1  # the largest k with t(x_k) <= W
        return np.where(last < 0, 0.0, self.xs[np.minimum(last + 1, len(self.xs) - 1)])


def skew_lift(p_a: np.ndarray, shapes: np.ndarray, m: int, z: float, xs: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The Cornish–Fisher lift of W's lower z-quantile, (z² − 1) γ / 6 in units of W's sd, per deviation
    shape (rows) at each x of ``xs`` (columns), given ``var`` = m² Var(W) there (n_shapes, n_grid).

    W's summands are right-skewed, so its lower quantile sits above the normal one: q_δ ≈ E W − z sd +
    (z² − 1) γ sd / 6 with γ = κ3(W) / sd³. The lift uses a *lower* bound on γ, so it never lifts more than
    the expansion does: κ3(W) = Σ_A a_i³ κ3(Y_i) / m⁶ (Poissonised) with κ3(Y_i) from
    :func:`poisson_quadratic_k3` at the deviation c_i = ±u_i, u_i = 2 m x s_i. Its odd part in u,
    u³(56μ + 32) + u(48μ² + 8μ), is positive, so the negative sign gives each cell's smaller value whatever
    the signs' pattern (and where it is infeasible, u > μ, it is still below the positive sign's, the true one):
    κ3 >= Σ a³ [8μ³ + 4μ² − (48μ² + 8μ)u + (24μ² + 72μ + 4)u² − (56μ + 32)u³ + 32u⁴], a polynomial in x.
    Over the variance's upper version (``var``), clipped to [0, SKEW_CAP]. The expansion's error at the
    far tail is what the coverage study measures.
    """
    coefficients = skew_k3_coefficients(p_a, shapes, m)  # (5, n_shapes)
    k3 = sum(c[:, None] * xs[None, :] ** j for j, c in enumerate(coefficients))  # (n_shapes, n_grid): m⁶ κ3(W)
    gamma = k3 / (m ** 3 * var ** 1.5)
    return (z ** 2 - 1) * np.clip(gamma, 0.0, SKEW_CAP) / 6


def skew_k3_coefficients(p_a: np.ndarray, shapes: np.ndarray, m: int) -> np.ndarray:
    """(5, n_shapes): the coefficients c_j of x^j in Σ_A a_i³ κ3(−u_i, μ_i − u_i), u_i = 2 m x s_i, μ_i = m p_i
    (:func:`poisson_quadratic_k3` at the negative sign, expanded in x): m⁶ times the lower bound on κ3(W) that
    :func:`skew_lift` uses."""
    a3, mu = p_a ** (-2.0), m * p_a  # a³ = p^(−2)
    t = 2 * m * shapes  # (n_shapes, |A|): u = t x
    return np.stack([np.full(len(shapes), float((a3 * (8 * mu ** 3 + 4 * mu ** 2)).sum())),
                     -(t * (a3 * (48 * mu ** 2 + 8 * mu))).sum(1),
                     (t ** 2 * (a3 * (24 * mu ** 2 + 72 * mu + 4))).sum(1),
                     -(t ** 3 * (a3 * (56 * mu + 32))).sum(1),
                     (t ** 4 * (32 * a3)).sum(1)])


def holder_statistic(counts_a: np.ndarray, p_a: np.ndarray, m: int) -> float:
    """W = Σ_A p_i^(−2/3) [(N_i − m p_i)² − N_i + N_i (N_i − 1)/(m − 1)] / m², unbiased for
    D = Σ_A p_i^(−2/3) (q_i − p_i)² under multinomial sampling (E[N(N − 1)] = m(m − 1) q²)."""
    return float(holder_statistics(counts_a[None], p_a, m)[0])


def holder_statistics(counts_a: np.ndarray, p_a: np.ndarray, m: int) -> np.ndarray:
    """:func:`holder_statistic` of each row of ``counts_a`` (n, |A|) -> (n,)."""
    n = counts_a.astype(np.float64)
    pairs = n * (n - 1) / (m - 1) if m > 1 else np.zeros_like(n)
    return (((n - m * p_a) ** 2 - n + pairs) @ p_a ** (-2.0 / 3.0)) / m ** 2


# ------------------------------------------------------------------------------------------ the bound


@dataclass(frozen=True)
class HolderFloor:
    """The Hölder route at one floor: the kept-set test on A = {p >= floor, p > 0} at level ``kept_delta``, and
    the Clopper–Pearson bound on the tail T (the rest of p's support) at ``tail_delta``."""

    floor: float
    kept: np.ndarray  # (V,) bool
    tail: np.ndarray  # (V,) bool
    p_tail: float
    test: KeptSetTest | None  # None when A is empty
    tail_delta: float

    @classmethod
    def build(cls, p: np.ndarray, m: int, floor: float, kept_delta: float, tail_delta: float) -> "HolderFloor":
        kept = (p >= floor) & (p > 0)
        tail = ~kept & (p > 0)
        test = KeptSetTest.build(p[kept], m, kept_delta) if kept.any() else None
        return cls(float(floor), kept, tail, float(p[tail].sum()), test, tail_delta)

    def parts(self, counts: np.ndarray, p: np.ndarray, m: int) -> dict[str, np.ndarray]:
        """"holder" (the bound), "kept", "w", "q_tail_up", each (n,), for counts (n, V)."""
        n = len(counts)
        w = holder_statistics(counts[:, self.kept], p[self.kept], m) if self.kept.any() else np.zeros(n)
        # W below its H0 mean 0 is read as 0: it says the sample fluctuated low, not that the deviation is
        # smaller than m samples resolve (and it can fall below every threshold: an empty confidence set, a
        # "bound" of 0). Only raising the bound, this keeps it valid.
        kept_up = self.test.uppers(np.maximum(w, 0.0)) if self.test is not None else np.zeros(n)
        tail_up, q_tail_up = tail_parts(self.p_tail, counts[:, self.tail].sum(1), m, self.tail_delta)
        return {"holder": kept_up + tail_up, "kept": kept_up, "w": w, "q_tail_up": q_tail_up}

    def under_h0(self, m: int) -> float:
        """The bound at W = 0 and the tail count at its mean m p(T)."""
        return (self.test.upper(0.0) if self.test is not None else 0.0) + tail_under_h0(self.p_tail, m, self.tail_delta)


def tail_parts(p_tail: float, tail_n: np.ndarray, m: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(½ (p(T) + q(T) upper), q(T) upper at level ``delta``) for each tail count in ``tail_n`` (n,): the tail's
    share of the Hölder route, TV's part on T at most ½ (p(T) + q(T)), with q(T)'s exact Clopper–Pearson bound."""
    if p_tail <= 0 and not tail_n.any():
        return np.zeros(len(tail_n)), np.zeros(len(tail_n))
    n = np.minimum(tail_n, m - 1)
    q_up = np.where(tail_n >= m, 1.0, sps.beta.isf(delta, n + 1, m - n))
    return 0.5 * (p_tail + q_up), q_up


def tail_under_h0(p_tail: float, m: int, delta: float) -> float:
    """The tail's part of the Hölder route at the tail count's mean m p(T)."""
    return float(tail_parts(p_tail, np.array([round(m * p_tail)]), m, delta)[0][0])


@dataclass(frozen=True)
class BoundPlan:
    """Everything :func:`tv_upper_bound` computes from p and m alone (the floors, the kept sets, the
    inverted tests), so that many sample sets of one (p, m) — a planner's simulation — share it."""

    p: np.ndarray
    m: int
    confidence: float = 0.99
    route: str = "combined"
    floor: float | None = None  # None: the c/m in FLOOR_MULTIPLES minimising the expected bound under H0

    def __post_init__(self) -> None:
        if self.route not in TV_ROUTES:
            raise ValueError(f"route must be one of {list(TV_ROUTES)}, got {self.route!r}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must lie in (0.5, 1), got {self.confidence!r}")
        if self.m < 1:
            raise ValueError(f"m must be >= 1, got {self.m!r}")

    @property
    def coarse_floor(self) -> float:
        return COARSE_FLOOR_MULTIPLE / self.m

    @property
    def shares(self) -> dict[str, float]:
        """δ of each part: kept-set test and tail at the chosen floor, the same at the coarse floor, plug-in route."""
        return self._shares(self.chosen_floor)

    def _shares(self, floor: float) -> dict[str, float]:
        """The δ split at a given chosen floor: an empty tail gives its share to its kept-set test, and a coarse
        floor that keeps the same cells as the chosen one gives its share to the chosen floor's kept-set test."""
        support = self.p > 0
        tail_empty = not (support & (self.p < floor)).any()
        coarse = bool((support & (self.p >= floor) & (self.p < self.coarse_floor)).any())
        kept, tail = (KEPT_SHARE + TAIL_SHARE, 0.0) if tail_empty else (KEPT_SHARE, TAIL_SHARE)
        coarse_kept, coarse_tail = (COARSE_SHARE * KEPT_SHARE / (KEPT_SHARE + TAIL_SHARE),
                                    COARSE_SHARE * TAIL_SHARE / (KEPT_SHARE + TAIL_SHARE)) if coarse else (0.0, 0.0)
        if not coarse:
            kept += COARSE_SHARE
        holder = {"kept": kept, "tail": tail, "coarse_kept": coarse_kept, "coarse_tail": coarse_tail}
        delta = 1.0 - self.confidence
        if self.route == "plugin":
            return dict.fromkeys(holder, 0.0) | {"plugin": delta}
        if self.route == "holder":
            total = sum(holder.values())
            return {k: delta * v / total for k, v in holder.items()} | {"plugin": 0.0}
        return {k: delta * v for k, v in holder.items()} | {"plugin": delta * PLUGIN_SHARE}

    @cached_property
    def chosen_floor(self) -> float:
        if self.floor is not None:
            return float(self.floor)
        floors = [c / self.m for c in FLOOR_MULTIPLES if (self.p >= c / self.m).sum() <= MAX_KEPT_CELLS]
        return min(floors or [FLOOR_MULTIPLES[-1] / self.m], key=self._unskewed_under_h0)

    def _unskewed_under_h0(self, floor: float) -> float:
        """The floor search's criterion: the chosen floor's Hölder bound at W = 0 without the skew lift, and the
        tail count at its mean (no grid: :meth:`KeptSetTest.unskewed_upper_at_zero`)."""
        shares = self._shares(floor)
        kept = (self.p >= floor) & (self.p > 0)
        kept_part = KeptSetTest.unskewed_upper_at_zero(self.p[kept], self.m, shares["kept"]) if kept.any() else 0.0
        return kept_part + tail_under_h0(float(self.p[~kept].sum()), self.m, shares["tail"])

    @cached_property
    def holder_floors(self) -> tuple[HolderFloor, ...]:
        """The Hölder route at the chosen floor, then at the coarse floor where it has a share (() for the
        plug-in route alone)."""
        if self.route == "plugin":
            return ()
        shares = self.shares
        floors = [HolderFloor.build(self.p, self.m, self.chosen_floor, shares["kept"], shares["tail"])]
        if shares["coarse_kept"] > 0:
            floors.append(HolderFloor.build(self.p, self.m, self.coarse_floor, shares["coarse_kept"],
                                            shares["coarse_tail"]))
        return tuple(floors)

    @property
    def kept(self) -> np.ndarray:
        """The chosen floor's kept set A = {p >= floor, p > 0} (V,) bool; the tail is the rest of p's support."""
        return self.holder_floors[0].kept if self.holder_floors else (self.p >= self.chosen_floor) & (self.p > 0)

    @property
    def tail(self) -> np.ndarray:
        return ~self.kept & (self.p > 0)

    @property
    def test(self) -> KeptSetTest | None:
        """The chosen floor's kept-set test."""
        return self.holder_floors[0].test if self.holder_floors else None

    @cached_property
    def lumped(self) -> tuple[np.ndarray, tuple[HolderFloor, ...]]:
        """The law on the chosen floor's kept set A plus one cell for the rest of p's support, (|A| + 1,), and the
        Hölder floors restated on it: the counts a Hölder route reads (A's cells, each floor's tail total) are a
        function of the lumped counts, whose law is the multinomial of this law — what the planner draws on a
        large law instead of all V cells (:func:`~specdec_lab.stats.planning.simulated_bounds`)."""
        kept = self.kept
        law = np.append(self.p[kept], self.p[~kept].sum())
        floors = tuple(HolderFloor(f.floor, np.append(f.kept[kept], False), np.append(~f.kept[kept], True),
                                   f.p_tail, f.test, f.tail_delta) for f in self.holder_floors)
        return law, floors

    def holder_uppers(self, counts: np.ndarray, lumped: bool = False) -> np.ndarray:
        """The Hölder route's bound (the smaller floor's), at most 1, for counts (n, V) — or, with ``lumped``, for
        counts on :attr:`lumped`'s law (n, |A| + 1). It is at least :meth:`uppers` (the plug-in route can only
        lower the bound)."""
        p, floors = self.lumped if lumped else (self.p, self.holder_floors)
        return np.minimum(1.0, np.min([f.parts(counts, p, self.m)["holder"] for f in floors], axis=0))

    def expected_upper(self) -> float:
        """The bound when the sampler is exactly p: W at its H0 value 0, the tail counts and the plug-in at
        their means (this plan's route and shares)."""
        holder = min((f.under_h0(self.m) for f in self.holder_floors), default=np.inf)
        plugin = (expected_tv_plugin(self.p, self.m) + plugin_margin(self.m, self.shares["plugin"])
                  if self.route != "holder" else np.inf)
        return float(min(holder, plugin))

    def routes(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """Every part of the bound for a batch of sample sets' counts (n, V) (already checked against p):
        "holder" and "holder-coarse" (the Hölder route at the chosen and coarse floors), "plugin" (NaN where this route
        leaves it out), and the chosen floor's "kept" (the kept-set bound), "w", "q_tail_up", each (n,)."""
        m, n = self.m, len(counts)
        nan = np.full(n, np.nan)
        parts = {"holder": nan, "holder-coarse": nan, "plugin": nan, "kept": nan, "w": nan, "q_tail_up": nan}
        if self.route != "holder":
            plugin = 0.5 * np.abs(counts / m - self.p).sum(1)
            parts["plugin"] = plugin + plugin_margin(m, self.shares["plugin"])
        for name, floor in zip(("holder", "holder-coarse"), self.holder_floors):
            floor_parts = floor.parts(counts, self.p, m)
            parts[name] = floor_parts["holder"]
            if name == "holder":
                parts.update(kept=floor_parts["kept"], w=floor_parts["w"], q_tail_up=floor_parts["q_tail_up"])
        return parts

    def uppers(self, counts: np.ndarray) -> np.ndarray:
        """The bound of each sample set in a batch of counts (n, V) -> (n,)."""
        return self.combined(self.routes(counts))

    @staticmethod
    def combined(parts: dict[str, np.ndarray]) -> np.ndarray:
        """The bound from :meth:`routes`' parts: the smallest route (a route left out is NaN), at most 1."""
        return np.minimum(1.0, np.fmin(np.fmin(parts["holder"], parts["holder-coarse"]), parts["plugin"]))

    def bound(self, counts: np.ndarray) -> TVBound:
        """The bound from one sample set's counts (V,) (already checked against p)."""
        parts = {k: float(v[0]) for k, v in self.routes(np.asarray(counts)[None]).items()}
        candidates = {k: parts[k] for k in ("holder", "holder-coarse", "plugin") if not np.isnan(parts[k])}
        binding = min(candidates, key=candidates.get)  # ties: the first, the chosen floor's Hölder route
        upper = candidates[binding]
        p_tail = self.holder_floors[0].p_tail if self.holder_floors else float("nan")
        coarse = len(self.holder_floors) > 1
        return TVBound(float(min(1.0, upper)), self.confidence, self.m, float(min(1.0, parts["holder"])),
                       float(min(1.0, parts["plugin"])), binding,
                       parts["kept"], parts["w"], p_tail, parts["q_tail_up"], self.chosen_floor,
                       float(min(1.0, parts["holder-coarse"])), self.coarse_floor if coarse else float("nan"))


def tv_upper_bound(counts, p, *, confidence: float = 0.99, floor: float | None = None,
                   route: str = "combined") -> TVBound:
    """Upper confidence bound on TV(q, p) from m samples of q and the exact p.

    Parameters
    ----------
    counts, p : array_like, shape (V,)
    confidence : float
        Coverage of the bound, e.g. 0.99; δ = 1 − confidence.
    floor : float, optional
        The kept set A = {i: p_i >= floor, p_i > 0}; by default the floor c/m (c in :data:`FLOOR_MULTIPLES`)
        that minimises the Hölder route's bound expected under H0 — a function of p and m only,
        never of the data, so choosing it costs no validity.
    route : {"combined", "holder", "plugin"}
        "holder" and "plugin" are the two bounds below, each alone at the full level δ;
        "combined" (the default) spends 0.8δ on the Hölder route's kept-set test at the chosen floor, 0.05δ on
        its tail (0.85δ and 0 when no cell with p > 0 lies below the floor), 0.05δ on the Hölder route at the
        coarse floor ½/m (its kept-set test and tail in the same 16:1 ratio; that share goes to the chosen
        floor's kept-set test when no cell with p > 0 lies between the two floors) and 0.1δ on the plug-in route,
        and keeps the smallest.

    Returns
    -------
    TVBound
        ``upper`` with P(TV(q, p) <= upper) >= confidence; each route (at its share of δ),
        ``binding``, the route that gave ``upper``, and the chosen floor's parts.

    Notes
    -----
    **Hölder route.** Split TV over the kept set A and its complement T (cells with 0 < p < τ):
    TV <= x + ½ (p(T) + q(T)) with x = ½ Σ_A |q_i − p_i|. On A, Hölder's inequality with weights
    a_i = p_i^(−2/3) (Valiant & Valiant's identity-testing weights) gives

        2x = Σ_A |q_i − p_i| <= √(S · D),  S = Σ_A p_i^(2/3),  D = Σ_A p_i^(−2/3) (q_i − p_i)²,

    so any q with kept-set deviation x has D >= 4x²/S. The noise of this route scales with
    S^(3/4) = ‖p_A‖_(2/3)^(1/2), against √|A| for the Cauchy–Schwarz weights 1/p (the χ² route).
    W = Σ_A a_i [(N_i − m p_i)² − N_i + N_i (N_i − 1)/(m − 1)] / m² is exactly unbiased for D
    under multinomial sampling. Its variance is *not estimated*: for each x on a grid, the test
    of "kept-set deviation = x" rejects when W < t(x) = min_q [D(q) − z_{δ_A} sd(q) + lift(q)] over the
    alternatives q of :func:`deviation_shapes` at that x, with sd(q) the Poissonised standard
    deviation of W at q, m² Var = Σ a_i² [2 q_i² + 4 m q_i (q_i − p_i)²] (its positive-deviation
    version, the larger), and lift(q) = (z² − 1) γ sd / 6 the Cornish–Fisher correction for W's right
    skew, with γ a lower bound on W's skewness at q (:func:`skew_lift`: the exact Poissonised third
    cumulant, each cell's smaller value over the deviation's two signs, capped at 1). The bound is the
    largest x not rejected (rounded up to the grid), with W read as max(W, 0): a W below its H0 mean
    can fall below every threshold (an empty confidence set: a "bound" of 0, valid but a claim m samples
    cannot back), and raising it keeps the bound valid. q(T) gets the Clopper–Pearson upper bound at δ_T
    on the tail count, which is exact.

    **Two floors.** The chosen floor minimises the bound expected under H0, which on large supports puts it far
    below 1/m (0.01/m on the two-token laws: the kept set holds thousands of cells whose expected count is
    ≈ 0.01–0.04). Mass moved onto those cells gives Hölder a large D for a small TV (their weights p^(−2/3) are
    the largest), and the plug-in route pays its own upward bias on such a support (E TV̂ ≈ 0.045 on the T = 1
    two-token law at m = 103,070). So the Hölder route runs a second time at the coarse floor ½/m, whose tail
    reads that mass through its count: ½ (p(T) + q(T)). The two floors are fixed by p and m alone.

    **Plug-in route** (distribution-free, exact). With A* = {q > p}, TV = q(A*) − p(A*), and the plug-in
    TV̂ = ½ Σ |N_i/m − p_i| = max_A (N(A)/m − p(A)) is at least N(A*)/m − p(A*); so TV − TV̂ is at most the
    lower deviation q(A*) − N(A*)/m of one binomial proportion, whatever A* is: P(TV > TV̂ + t) <= δ with
    t = :func:`plugin_margin` (m, δ), the largest exact binomial lower δ-deviation over q in [0, 1] (≈ z_δ/2√m,
    16% below McDiarmid's bounded-differences margin √(ln(1/δ)/2m) at δ = 0.001). It keeps the bound
    shape-free: a deviation on one token (where Hölder is loose: a large D for a small TV) costs it only its
    plug-in.

    **Validity.** The tail and plug-in parts hold in finite samples. The kept-set test rests on
    (i) a one-term Cornish–Fisher expansion of W's lower tail, with the skewness bounded below (the normal
    quantile alone sits ≈ 1 sd below W's true lower 1% point on the first-token laws: W's summands are
    right-skewed); (ii) the Poissonised variance and cumulant — multinomial sampling makes the counts
    negatively dependent, which lowers the variance; (iii) the least-favourable search over a family
    holding the stationary points of the leading-order problem. None is a finite-sample proof, so the
    bound was validated by a coverage study: ``make coverage`` (``python -m
    specdec_lab.coverage_study``) draws 2,000 replicates per case on the first-token and two-token
    laws of every verify row, under H0 and least-favourable alternatives (Hölder- and
    Cauchy–Schwarz-equality perturbations, a spike on a rare token, mass moved inside the tail, a
    near-floor perturbation, a deviation piled on the most likely token); the table is in
    ``docs/method.md``; ``tests/test_stats.py::TestTVUpperBound`` runs a small version.

    **Combined.** Bonferroni over the five parts (two kept-set tests, two tails, the plug-in): valid at 1 − δ.

    References
    ----------
    Valiant, G. and Valiant, P. (2017). An automatic inequality prover and instance optimal
    identity testing. SIAM J. Comput. 46(1).
    Wellek, S. (2010). Testing Statistical Hypotheses of Equivalence and Noninferiority. CRC.

    Examples
    --------
    >>> rng = np.random.default_rng(5)
    >>> p = np.full(100, 0.01)
    >>> bound = tv_upper_bound(rng.multinomial(100_000, p), p)
    >>> bound.upper < 0.02, bound.binding
    (True, 'holder')
    """
    counts, p, m = _counts_and_law(counts, p)
    return BoundPlan(p, m, confidence, route, floor).bound(counts)


def expected_tv_bound(p, m: int, confidence: float = 0.99, routes=TV_ROUTES) -> dict[str, float]:
    """Each route's bound when the sampler is exactly p, at W = 0 (D's value under H0), the tail
    count at its mean and the plug-in at its mean: what a correct sampler's verdict shows at m
    samples, from p and m alone. Keys (``routes``): "holder" and "plugin" (each alone at the full
    level) and "combined" (the smaller of the two at their shares of δ).

    >>> b = expected_tv_bound(np.full(100, 0.01), 100_000)
    >>> bool(b["combined"] <= 1.05 * b["holder"])
    True
    """
    p = np.asarray(p, dtype=np.float64)
    return {route: BoundPlan(p, int(m), confidence, route).expected_upper() for route in routes}
