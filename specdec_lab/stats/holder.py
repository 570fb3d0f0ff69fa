"""The Hölder kept-set test: W, its least-favourable quantiles, and its inversion into a bound.

On a kept set A (cells with p_i >= a floor, given as ``p_a`` of shape (|A|,)) and m samples, the statistic
W = Σ_A p_i^(−2/3) [(N_i − m p_i)² − N_i + N_i (N_i − 1)/(m − 1)] / m² (:func:`holder_statistic`) is unbiased
for D = Σ_A p_i^(−2/3) (q_i − p_i)². :class:`KeptSetTest` inverts the test of "½ Σ_A |q − p| = x" on a
geometric grid of x into an upper bound on x at level δ. The maths (Hölder's inequality, the deviation shapes,
the Cornish–Fisher lift) is in :func:`~specdec_lab.stats.bounds.tv_upper_bound`'s Notes; this module holds the
parts that depend on (p_A, m, δ) only, plus W. Shapes: ``shapes`` (n_shapes, |A|), grids (n_grid,).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

_GRID_RATIO = 1.002  # the kept-set bound is read off a geometric grid of x: rounded up by at most 0.2%


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
