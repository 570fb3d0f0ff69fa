"""The coverage study of :func:`~specdec_lab.stats.tv_upper_bound`: planted alternatives with a known
TV, many replicate sample sets, the share of replicates whose bound falls below the true TV.

A 99% bound must miss at most 1% of the time on *every* law and alternative, including the ones its
construction finds hardest. The alternatives (:data:`ALTERNATIVES`) build q from p at a stated TV:

- ``holder``: d ∝ p^(2/3) with balanced signs on the kept set — Hölder's equality case, where D is
  smallest for the TV (the kept-set test's hardest shape);
- ``cauchy_schwarz``: d ∝ p with balanced signs — the χ² route's equality case (a tilt);
- ``top_pile``: +TV on the most likely token, −TV spread as p^(2/3) — the deviation that maximises
  W's variance;
- ``rare_spike``: TV moved from the likely tokens onto one rare token (p near 1e-4) — where Hölder is
  loose and the shape-free route must carry the bound;
- ``near_floor``: TV moved onto the tokens just above the kept set's floor;
- ``tail_move``: the mass of the tokens below the floor piled onto one of them, plus TV taken from the
  likely tokens into the tail — what the tail's Clopper–Pearson part must cover;
- ``null``: q = p (the bound's size under H0: what a correct sampler's verdict shows).

``make coverage`` runs it on the laws of every verify row (``specdec_lab.experiments.coverage``).
"""

from __future__ import annotations

import numpy as np

from specdec_lab.stats.bounds import BoundPlan
from specdec_lab.stats.planning import multinomial_batches


def _balanced(p: np.ndarray, profile: np.ndarray, tv: float, rng: np.random.Generator) -> np.ndarray:
    """q = p + d with |d| ∝ profile, random signs, positive and negative parts each of mass tv,
    never below 0 (a cell whose share exceeds its p gives what it has; the rest is spread)."""
    idx = np.flatnonzero(profile > 0)
    signs = np.where(rng.permutation(len(idx)) % 2 == 0, 1.0, -1.0)
    d = np.zeros_like(p)
    for sign in (1.0, -1.0):
        cells = idx[signs == sign]
        share = profile[cells] / profile[cells].sum() * tv
        if sign < 0:
            share = _capped(share, p[cells], tv)
        d[cells] = sign * share
    return p + d


def _capped(share: np.ndarray, cap: np.ndarray, total: float) -> np.ndarray:
    """``share`` (summing to ``total``) with each entry capped at ``cap``, the excess spread over the
    others in proportion to their room."""
    share = share.copy()
    for _ in range(50):
        over = share > cap
        if not over.any():
            break
        excess = float((share[over] - cap[over]).sum())
        share[over] = cap[over]
        room = np.where(share < cap, cap - share, 0.0)
        share += excess * room / room.sum()
    if share.sum() < total * (1 - 1e-9):
        raise ValueError("the law cannot give up that much mass")
    return share


def _moved(p: np.ndarray, onto: np.ndarray, weights: np.ndarray, tv: float) -> np.ndarray:
    """Mass tv taken from the likely tokens (∝ p on the top cells) and put on ``onto`` ∝ weights."""
    q = p.copy()
    order = np.argsort(-p)
    donors = order[~np.isin(order, onto)][:20]
    q[donors] -= _capped(p[donors] / p[donors].sum() * tv, p[donors], tv)
    q[onto] += weights / weights.sum() * tv
    return q


def holder(p, tv, floor, rng):
    return _balanced(p, np.where((p >= floor) & (p > 0), p ** (2 / 3), 0.0), tv, rng)


def cauchy_schwarz(p, tv, floor, rng):
    return _balanced(p, np.where(p >= floor, p, 0.0), tv, rng)


def top_pile(p, tv, floor, rng):
    top = int(np.argmax(p))
    rest = np.where((p >= floor) & (np.arange(len(p)) != top), p ** (2 / 3), 0.0)
    q = p.copy()
    q[top] += tv
    cells = np.flatnonzero(rest)
    q[cells] -= _capped(rest[cells] / rest[cells].sum() * tv, p[cells], tv)
    return q


def rare_spike(p, tv, floor, rng):
    cells = np.flatnonzero(p > 0)
    target = cells[np.argmin(np.abs(np.log(p[cells]) - np.log(1e-4)))]
    return _moved(p, np.array([target]), np.ones(1), tv)


def near_floor(p, tv, floor, rng):
    kept = (p >= floor) & (p > 0)
    cells = np.flatnonzero(kept & (p < 4 * floor))
    if not len(cells):  # no cell within 4x the floor (or the floor is 0): the five least likely kept cells
        cells = np.flatnonzero(kept)[np.argsort(p[kept])[:5]]
    return _moved(p, cells, np.ones(len(cells)), tv)


def tail_move(p, tv, floor, rng):
    tail = np.flatnonzero((p > 0) & (p < floor))
    q = p.copy()
    if len(tail):
        q[tail] = 0.0
        q[tail[0]] = p[tail].sum()
        return _moved(q, tail[:1], np.ones(1), tv)
    return _moved(q, np.array([int(np.argmin(np.where(p > 0, p, np.inf)))]), np.ones(1), tv)


def null(p, tv, floor, rng):
    return p.copy()


ALTERNATIVES = {f.__name__: f for f in (null, holder, cauchy_schwarz, top_pile, rare_spike, near_floor, tail_move)}


def tv(q: np.ndarray, p: np.ndarray) -> float:
    return float(0.5 * np.abs(q - p).sum())


def coverage_case(p: np.ndarray, q: np.ndarray, m: int, reps: int, rng: np.random.Generator, *,
                  confidence: float = 0.99, baseline=None, baseline_reps: int = 0,
                  plan: BoundPlan | None = None) -> dict:
    """Draw ``reps`` sample sets of m from q (in batches); bound each against p. Returns the true TV, the miss
    count and rate, the median bound, the shares of replicates bound by the plug-in route and by the coarse floor,
    and (with ``baseline``, a function counts, p -> bound) the baseline's median bound on the first
    ``baseline_reps`` sample sets."""
    plan = BoundPlan(p, m, confidence) if plan is None else plan
    truth = tv(q, p)
    uppers, plugin, coarse, base = [], 0, 0, []
    for counts in multinomial_batches(m, q, reps, rng):  # (n, V)
        parts = plan.routes(counts)
        uppers.append(plan.combined(parts))
        plugin += int((parts["plugin"] < np.fmin(parts["holder"], parts["holder-coarse"])).sum())
        coarse += int((parts["holder-coarse"] < np.fmin(parts["holder"], parts["plugin"])).sum())
        if baseline is not None:
            base += [baseline(c, p) for c in counts[:max(0, baseline_reps - len(base))]]
    uppers = np.concatenate(uppers)
    misses = int((uppers < truth).sum())
    return {"true TV": truth, "m": m, "replicates": reps, "misses": misses, "miss rate": misses / reps,
            "median bound": float(np.median(uppers)), "plug-in binding": plugin / reps, "coarse binding": coarse / reps,
            "baseline median": float(np.median(base)) if base else float("nan"), "floor": plan.chosen_floor}
