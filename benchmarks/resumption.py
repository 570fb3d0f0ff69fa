"""The error rates of a workload cell judged again and again (resumption), with and without the spending rule.

A cell's law is a Zipf law on 64 outcomes. Each replicate draws samples in rounds and judges after every round (a
look), as a user who resumes an inconclusive run would:

- *false rejection*: the server is exact (q = p); a look rejects when the G test's p-value is below α (naive: α at
  every look; spent: α · 6/(π² k²) at look k, :func:`specdec_lab.workload.sequential.spent`);
- *false certification*: the server is off by TV = 1.5 ε (mass moved from the top outcome to the tail); a look
  certifies when the TV bound at confidence 1 − δ (naive) or 1 − δ_k (spent) is ≤ ε.

Prints the share of replicates with *any* such look, against α = δ = 0.01. Usage:
``python benchmarks/resumption.py [--reps 400] [--looks 10] [--round 2000]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from specdec_lab import stats
from specdec_lab.workload.sequential import spent


def zipf(n: int = 64) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1)
    return w / w.sum()


def shifted(p: np.ndarray, tv: float) -> np.ndarray:
    q = p.copy()
    q[0] -= tv
    q[len(q) // 2:] += tv / (len(q) - len(q) // 2)
    return q


def replicate(p, q, looks, size, alpha, eps, rng, test):
    counts = np.zeros(len(p), dtype=np.int64)
    naive = spent_hit = False
    for k in range(1, looks + 1):
        counts += rng.multinomial(size, q)
        if test == "reject":
            pvalue = stats.chisquare_identity(counts, p, statistic="g", rng=rng).pvalue
            naive |= pvalue < alpha
            spent_hit |= pvalue < spent(alpha, k)
        else:
            naive |= stats.tv_upper_bound(counts, p, confidence=1 - alpha).upper <= eps
            spent_hit |= stats.tv_upper_bound(counts, p, confidence=1 - spent(alpha, k)).upper <= eps
    return naive, spent_hit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--looks", type=int, default=10)
    parser.add_argument("--round", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    p, eps, alpha = zipf(), 0.02, 0.01
    for test, q in (("reject", p), ("certify", shifted(p, 1.5 * eps))):
        hits = np.array([replicate(p, q, args.looks, args.round, alpha, eps, rng, test) for _ in range(args.reps)])
        what = "false rejection (q = p)" if test == "reject" else "false certification (TV = 1.5 ε)"
        print(f"{what}, {args.looks} looks of {args.round} samples, {args.reps} replicates: "
              f"naive {hits[:, 0].mean():.3f}, spent {hits[:, 1].mean():.3f} (level 0.01)")


if __name__ == "__main__":
    main()
