"""Named results (scipy-style: ``statistic, pvalue = result``) and input checks shared by the tests."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

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
