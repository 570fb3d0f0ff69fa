"""Equivalence: the certified upper confidence bound on TV(q, p), from counts (V,) of q and the exact p (V,).

A "pass" is never "not rejected": it is an upper confidence bound on TV(q, p) below a tolerance.
In ``specdec_lab.stats`` q is the law the counts were drawn from (these are generic two-law tools); in
the reports, docs and notebooks that law is the sampler's, written *out*, and q is the draft's.
This module holds that bound (:func:`tv_upper_bound`: the floors, the split of δ over its routes, the
tail) and what the planners need to know about it under H0 (:func:`expected_tv_bound`, :class:`BoundPlan`).
Its two routes' pieces live beside it: the Hölder kept-set test in :mod:`~specdec_lab.stats.holder`, the
plug-in estimates and margin in :mod:`~specdec_lab.stats.plugin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import stats as sps

from specdec_lab.stats.holder import KeptSetTest, holder_statistics
from specdec_lab.stats.plugin import expected_tv_plugin, plugin_margin
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
# floor (the one that minimises the bound under H0) is often far lower on large supports (c = 0.01 or 0.1), where
# mass moved onto cells of expected count far below one gives Hölder a large D for a small TV; the coarse
# floor's tail reads that mass as ½ (p(T) + q(T)). Its share goes to the chosen floor's kept-set test when no cell
# with p > 0 lies in [chosen floor, coarse floor) (the two floors would keep the same cells).
COARSE_FLOOR_MULTIPLE = 0.5
# A floor c/m with more than this many cells of p >= c/m (p = 0 included at c = 0) is not a candidate (unless none
# is left): its test's cost grows with |A| (deviation_shapes is (n_shapes, |A|)), for the few cells below c = 0.01
MAX_KEPT_CELLS = 65_536


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
    below 1/m (the kept set then holds many cells whose expected count is far below one). Mass moved onto those
    cells gives Hölder a large D for a small TV (their weights p^(−2/3) are the largest), and the plug-in route
    pays its own upward bias on such a support (:func:`~specdec_lab.stats.plugin.expected_tv_plugin`; both
    measured on verify's laws in docs/method.md, "Library internals"). So the Hölder route runs a second time at the coarse floor ½/m, whose tail
    reads that mass through its count: ½ (p(T) + q(T)). The two floors are fixed by p and m alone.

    **Plug-in route** (distribution-free, exact). With A* = {q > p}, TV = q(A*) − p(A*), and the plug-in
    TV̂ = ½ Σ |N_i/m − p_i| = max_A (N(A)/m − p(A)) is at least N(A*)/m − p(A*); so TV − TV̂ is at most the
    lower deviation q(A*) − N(A*)/m of one binomial proportion, whatever A* is: P(TV > TV̂ + t) <= δ with
    t = :func:`plugin_margin` (m, δ), the largest exact binomial lower δ-deviation over q in [0, 1] (≈ z_δ/2√m,
    16% below McDiarmid's bounded-differences margin √(ln(1/δ)/2m) at δ = 0.001). It keeps the bound
    shape-free: a deviation on one token (where Hölder is loose: a large D for a small TV) costs it only its
    plug-in.

    **Validity.** The tail and plug-in parts hold in finite samples. The kept-set test rests on
    (i) a one-term Cornish–Fisher expansion of W's lower tail, with the skewness bounded below (W's summands are
    right-skewed, so the normal quantile alone sits below W's true lower quantile: docs/method.md, "Library
    internals"); (ii) the Poissonised variance and cumulant — multinomial sampling makes the counts
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
