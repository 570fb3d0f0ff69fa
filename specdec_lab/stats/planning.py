"""Sample planning: how many samples a verdict needs, before a run.

:func:`plan_bound_by_simulation` sizes a run so that a correct sampler's TV bound is below ε with a
stated assurance; :func:`plan_tv_bound_samples` is the quick version at the bound's expectation;
:func:`power_chisquare` and :func:`plan_sample_size` give the Pearson test's power against the worst
case at a TV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from specdec_lab.stats.bounds import BoundPlan, expected_tv_bound, tv_upper_bound  # noqa: F401 (doctests)
from specdec_lab.stats.plugin import two_sample_tv_upper


# Laws of more than SMALL_LAW_CELLS cells (a joint law) are drawn lumped: the chosen floor's kept set and one cell for
# the rest (BoundPlan.lumped), their bound the Hölder route's (the plug-in route left out, which can only lower it)
SMALL_LAW_CELLS = 16_384
PLAN_DRAWS = 20_000  # simulated bounds per candidate m: the empirical 1 − assurance quantile, no shape assumed
TWO_SAMPLE_DRAWS = 200  # the two-sample planner's draws per m (mean + z sd)
SMALL_LAW_PRECISION, LARGE_LAW_PRECISION = 0.01, 0.05  # bisection on log m; a joint law's step costs ~10x more
# Each m decides early on the first EARLY_DRAWS draws when the answer is plain: fail when so many bounds exceed ε
# that an m meeting the assurance would show as many with probability below EARLY_FAIL_LEVEL (8 of 2,000 at
# assurance 0.999), pass when the bounds' mean + EARLY_PASS_Z sd is below ε (5 sd, not the normal's 3.1: the bound's
# upper tail is heavier than the normal's; the measurement is in docs/method.md, "Library internals").
EARLY_DRAWS, EARLY_FAIL_LEVEL, EARLY_PASS_Z = 2_000, 1e-3, 5.0
_BATCH_CELLS = 4_000_000  # counts drawn per batch: draws x cells


def multinomial_batches(m: int, law: np.ndarray, draws: int, rng: np.random.Generator):
    """``draws`` sample sets of m i.i.d. draws from ``law`` (V,), as count arrays (n, V) of about _BATCH_CELLS
    counts each."""
    batch = max(1, _BATCH_CELLS // law.size)
    for start in range(0, draws, batch):
        yield rng.multinomial(m, law, size=min(batch, draws - start))


def simulated_bounds(plan: BoundPlan, draws: int, rng: np.random.Generator) -> np.ndarray:
    """The bound of ``draws`` sample sets of ``plan.m`` i.i.d. draws from ``plan.p`` itself (draws,). On a law of
    more than :data:`SMALL_LAW_CELLS` cells, the Hölder route's bound from lumped counts (:attr:`BoundPlan.lumped`:
    the same law for the counts it reads, |A| + 1 cells instead of V — 13,000 instead of 262,144 on the T = 1 joint
    law), which is at least the bound: a plan from it errs toward more samples."""
    if plan.p.size <= SMALL_LAW_CELLS or not plan.holder_floors:
        return np.concatenate([plan.uppers(counts) for counts in multinomial_batches(plan.m, plan.p, draws, rng)])
    return np.concatenate([plan.holder_uppers(counts, lumped=True)
                           for counts in multinomial_batches(plan.m, plan.lumped[0], draws, rng)])


def smallest_passing_m(ok, start: int, precision: float, what: str) -> int:
    """The smallest m (to a relative ``precision``) with ``ok(m)``, for an ``ok`` that holds from some m on: doubling
    from ``start``, then bisection on log m."""
    lo, hi = 0, start
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 2 ** 30:
            raise ValueError(f"no sample size up to 2^30 gets {what}")
    while lo and hi / lo > 1 + precision:
        mid = int(np.sqrt(lo * hi))
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return int(hi)


def plan_bound_by_simulation(p, eps: float, *, confidence: float = 0.99, assurance: float = 0.999,
                             draws: int | None = None, rng: np.random.Generator | None = None,
                             precision: float | None = None, at_least: int | None = None) -> int:
    """Samples m at which a correct sampler's :func:`tv_upper_bound` is below ε with probability at
    least ``assurance``, found by simulation from p itself.

    For each candidate m, ``draws`` (20,000) sample sets of m i.i.d. draws from p are bounded, and m passes when
    at most a share 1 − assurance of the bounds exceed ε — the empirical quantile, no shape assumed (the first
    2,000 decide when the answer is plain: :data:`EARLY_FAIL_LEVEL`, :data:`EARLY_PASS_Z`); doubling, then
    bisection on log m, to 1% on laws of up to 16,384 cells (a first-token law) and to 5% on larger (joint) laws,
    whose sample sets are drawn lumped (:func:`simulated_bounds`). With ``at_least``, the search starts there:
    ``at_least`` itself when it passes (one check, usually on the first 2,000 draws) — how a run that already needs
    m samples for another bound asks whether m also serves this one. Unlike
    :func:`plan_tv_bound_samples` (the bound at its expectation under H0), this sizes a run so that a
    correct sampler's verdict is *equivalent* except with probability about 1 − assurance.

    >>> p = np.full(100, 0.01)
    >>> m = plan_bound_by_simulation(p, 0.05, rng=np.random.default_rng(0))
    >>> rng = np.random.default_rng(1)
    >>> bool((BoundPlan(p, m).uppers(rng.multinomial(m, p, size=2_000)) > 0.05).mean() <= 0.002)
    True
    >>> plan_bound_by_simulation(p, 0.05, at_least=4 * m, rng=rng) == 4 * m
    True
    """
    p = np.asarray(p, dtype=np.float64)
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    if not 0.5 < assurance < 1:
        raise ValueError(f"assurance must lie in (0.5, 1), got {assurance!r}")
    if at_least is not None and (not isinstance(at_least, (int, np.integer)) or at_least < 1):
        raise ValueError(f"at_least must be a positive integer, got {at_least!r}")
    rng = np.random.default_rng() if rng is None else rng
    draws = draws or PLAN_DRAWS
    precision = precision or (SMALL_LAW_PRECISION if p.size <= SMALL_LAW_CELLS else LARGE_LAW_PRECISION)

    def ok(m: int) -> bool:
        plan = BoundPlan(p, m, confidence)  # floor and kept-set test: once per m, shared by the draws
        first = simulated_bounds(plan, min(EARLY_DRAWS, draws), rng)
        if (first > eps).sum() > sps.binom.isf(EARLY_FAIL_LEVEL, len(first), 1 - assurance):
            return False
        if first.mean() + EARLY_PASS_Z * first.std(ddof=1) <= eps:
            return True
        bounds = np.concatenate([first, simulated_bounds(plan, draws - len(first), rng)])
        return (bounds > eps).mean() <= 1 - assurance

    return smallest_passing_m(ok, at_least or 1000, precision, f"the TV bound below eps = {eps}")


def plan_two_sample_bound(p, eps: float, *, confidence: float = 0.99, assurance: float = 0.999,
                          draws: int = TWO_SAMPLE_DRAWS, rng: np.random.Generator | None = None,
                          precision: float = LARGE_LAW_PRECISION) -> int:
    """Samples m *per server* at which two correct servers' :func:`two_sample_tv_upper` is below ε with
    probability about ``assurance``: both samples drawn from p itself, ``draws`` pairs per m, m passes when
    mean + z_assurance · sd <= ε; doubling, then bisection on log m to ``precision``. The exact mode's
    counterpart is :func:`plan_bound_by_simulation` (one server, p known); their ratio is what the two-sample mode
    costs (two servers at this m each).

    >>> m = plan_two_sample_bound(np.full(10, 0.1), 0.05, rng=np.random.default_rng(0))
    >>> bool(m >= np.log(100) / 0.05 ** 2)   # the margin alone needs this many
    True
    """
    p = np.asarray(p, dtype=np.float64)
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    rng = np.random.default_rng() if rng is None else rng
    z = sps.norm.isf(1 - assurance)

    def ok(m: int) -> bool:
        bounds = np.concatenate([two_sample_tv_upper(x, y, confidence) for x, y in
                                 zip(multinomial_batches(m, p, draws, rng), multinomial_batches(m, p, draws, rng))])
        return bounds.mean() + z * bounds.std(ddof=1) <= eps

    start = int(np.ceil(np.log(1 / (1 - confidence)) / eps ** 2))  # the margin alone needs this many
    return smallest_passing_m(ok, start, precision, f"the two-sample bound below eps = {eps}")


def plan_tv_bound_samples(p, eps: float, confidence: float = 0.99) -> dict[str, int]:
    """Samples m at which a correct sampler's expected bound (:func:`expected_tv_bound`) reaches ε,
    per route: {"holder", "plugin", "combined"} (each route alone at the full level, combined at
    its shares of δ). A quick guide; :func:`plan_bound_by_simulation` sizes a run.

    >>> plan = plan_tv_bound_samples(np.full(100, 0.01), 0.02)
    >>> plan["combined"] <= 1.2 * min(plan["holder"], plan["plugin"])
    True
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    plan = {}
    for key in ("holder", "plugin", "combined"):
        def ok(m):
            return expected_tv_bound(p, m, confidence, (key,))[key] <= eps
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


@dataclass(frozen=True)
class LookPlan:
    """A row judged in looks: ``sizes`` the cumulative samples at each look; each look's bound at ``confidence`` and its
    tests at Holm's ``alpha``, the run's level split evenly over the looks (Bonferroni), so that whatever look the row
    stops at, its bound holds and its false rejection stays below the run's level."""

    sizes: tuple
    confidence: float
    alpha: float


def plan_looks(p, eps: float, *, looks: int = 3, confidence: float = 0.99, alpha: float = 0.01,
               assurance: float = 0.999, first_assurance: float = 0.6, rng: np.random.Generator | None = None,
               joint=None, joint_eps: float | None = None) -> LookPlan:
    """Looks for a correct row that stops at its first certification: the last look at the size where the bound at the
    spent confidence 1 − (1 − confidence)/looks is below ε with probability ``assurance`` (as the fixed-m plan, at the
    stronger level), the first where it is below ε with probability ``first_assurance``, geometric between.

    With ``joint`` (a two-token law) and ``joint_eps``, each look is also large enough for the joint bound at the same
    probabilities. ``looks`` = 1 is the fixed-m plan (:func:`plan_bound_by_simulation`).

    >>> plan = plan_looks(np.full(100, 0.01), 0.05, rng=np.random.default_rng(0))
    >>> len(plan.sizes), plan.sizes[0] < plan.sizes[-1], round(plan.confidence, 4), round(plan.alpha, 5)
    (3, True, 0.9967, 0.00333)
    """
    if not isinstance(looks, int) or looks < 1:
        raise ValueError(f"looks must be an integer >= 1, got {looks!r}")
    spent = 1 - (1 - confidence) / looks

    def size(sure: float, at_least: int | None = None) -> int:
        m = plan_bound_by_simulation(p, eps, confidence=spent, assurance=sure, rng=rng, at_least=at_least)
        if joint is not None and joint_eps is not None:
            m = plan_bound_by_simulation(joint, joint_eps, confidence=spent, assurance=sure, rng=rng, at_least=m)
        return m

    last = size(assurance)
    if looks == 1:
        return LookPlan((last,), spent, alpha)
    first = min(size(first_assurance), last)
    ratio = (last / first) ** (1 / (looks - 1))
    sizes = tuple(sorted({int(round(first * ratio ** j)) for j in range(looks - 1)} | {last}))
    return LookPlan(sizes, spent, alpha / looks)
