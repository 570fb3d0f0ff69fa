"""What judging a lossless verify row in looks costs against one fixed m, for a correct sampler.

For each lossless setting of ``specdec-lab verify`` (the first-token law after its prompt, ε = 0.02): the fixed-m plan
(:func:`specdec_lab.stats.plan_bound_by_simulation`, the bound at 99% below ε with probability 0.999), the looks
(:func:`specdec_lab.stats.plan_looks`, the bound at 1 − 0.01/J per look), and, over ``--reps`` simulated correct runs
(counts grown look by look from the exact law), the share certified by the last look and the expected samples spent.
Usage: ``python benchmarks/looks.py [--reps 2000] [--looks 3]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from specdec_lab import stats
from specdec_lab.laws import two_token_law
from specdec_lab.models import load_pair
from specdec_lab.stats.bounds import BoundPlan
from specdec_lab.verify import VerifyOptions, samplers_to_run


def simulate(p: np.ndarray, sizes: tuple, confidence: float, eps: float, reps: int, rng) -> tuple[float, float]:
    """(share certified by the last look, mean samples spent) of ``reps`` correct runs judged at each of ``sizes``."""
    plans = [BoundPlan(p, m, confidence) for m in sizes]
    counts = np.zeros((reps, len(p)), dtype=np.int64)
    spent = np.full(reps, sizes[-1], dtype=np.float64)
    open_ = np.ones(reps, dtype=bool)
    drawn = 0
    for plan, size in zip(plans, sizes):
        counts += rng.multinomial(size - drawn, p, size=reps)
        drawn = size
        certified = open_ & (plan.uppers(counts) <= eps)
        spent[certified] = size
        open_ &= ~certified
    return 1 - open_.mean(), spent.mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--looks", type=int, default=3)
    parser.add_argument("--eps", type=float, default=0.02)
    args = parser.parse_args()
    pair = load_pair("bundled")
    options = VerifyOptions(medusa=False)
    settings = {s.sampling: name for name, s, lossless in samplers_to_run(options) if lossless}
    print("| rows' settings | fixed m | looks | certified by the last look | expected m, looks | ratio |")
    print("|---|---|---|---|---|---|")
    for sampling, name in settings.items():
        rng = np.random.default_rng(0)
        p = two_token_law(pair, pair.encode(options.prompt), sampling).first
        fixed = stats.plan_bound_by_simulation(p, args.eps, rng=rng)
        plan = stats.plan_looks(p, args.eps, looks=args.looks, rng=rng)
        share, spent = simulate(p, plan.sizes, plan.confidence, args.eps, args.reps, rng)
        print(f"| {name} | {fixed:,} | {', '.join(f'{m:,}' for m in plan.sizes)} | {share:.4f} | {spent:,.0f} | "
              f"{spent / fixed:.2f} |")


if __name__ == "__main__":
    main()
