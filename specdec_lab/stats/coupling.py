"""The coupling certificate: TV between two laws from paired draws, and the exact binomial bounds it needs.

For any pairing (X, Y) of a draw X from law A with a draw Y from law B, TV(A, B) ≤ P(X ≠ Y) (the coupling
inequality: for every event E, A(E) − B(E) = P(X ∈ E) − P(Y ∈ E) ≤ P(X ∈ E, Y ∉ E) ≤ P(X ≠ Y)). A server that
replays plain sampling for a seed pairs its speculative output with its plain output on the same seed, so few
mismatches certify a small TV from a few hundred pairs — where a two-sample test of two independent samples needs
tens of thousands (:func:`specdec_lab.stats.plan_two_sample_bound`). The pairs must be i.i.d.: one pair per
distinct seed, the seeds' outputs independent of one another.
"""

from __future__ import annotations

from scipy import stats as sps


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.99) -> float:
    """Exact one-sided upper confidence bound on a binomial proportion from ``k`` successes in ``n`` trials:
    P(p > bound) ≤ 1 − ``confidence`` (Clopper–Pearson); 1.0 for n = 0.

    >>> round(clopper_pearson_upper(0, 460, 0.99), 5)  # 1 − 0.01^(1/460)
    0.00996
    >>> round(clopper_pearson_upper(3, 1000, 0.99), 5)
    0.01001
    """
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k = {k}, n = {n}")
    if n == 0 or k == n:
        return 1.0
    return float(sps.beta.isf(1.0 - confidence, k + 1, n - k))


def binomial_tail(k: int, n: int, rate: float) -> float:
    """P(K >= k) for K ~ Binomial(n, rate): the one-sided p-value of ``k`` events in ``n`` trials against a rate of
    at most ``rate``.

    >>> round(binomial_tail(1, 100, 0.01), 4), round(binomial_tail(10, 100, 0.01), 8)
    (0.634, 8e-08)
    """
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k = {k}, n = {n}")
    return float(sps.binom.sf(k - 1, n, rate))


def coupling_tv_upper(mismatches: int, pairs: int, confidence: float = 0.99) -> float:
    """Upper confidence bound on TV between two laws from ``pairs`` i.i.d. coupled draws of which ``mismatches``
    differ: the Clopper–Pearson bound on P(X ≠ Y) (see the module docstring)."""
    return clopper_pearson_upper(mismatches, pairs, confidence)


def coupling_pairs_needed(tolerance: float, confidence: float = 0.99) -> int:
    """Pairs with no mismatch at which :func:`coupling_tv_upper` reaches ``tolerance``: ⌈ln(1 − confidence) /
    ln(1 − tolerance)⌉.

    >>> coupling_pairs_needed(0.02, 1 - 0.01 / 32)
    400
    """
    import math

    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - tolerance))
