"""``make coverage``: the coverage study of the TV bound on the laws of every ``verify`` row.

For each verify row's prompt and settings (T = 1, T = 0.7 and top-p 0.9 after ``"ROMEO:\\n"``; T = 1
after ``"ROMEO.\\n"``, the Medusa rows) it takes the exact first-token law (at the m that ``verify``
plans for ε = 0.02) and the exact two-token joint law (at the m planned for the full scale's joint
tolerance 0.025), plants every alternative of :data:`specdec_lab.stats.coverage.ALTERNATIVES` at
TV = 0.5, 1 and 1.5 times the bound expected under H0, draws ``--reps`` replicate sample sets per case
and counts the replicates whose 99% bound falls below the true TV. With ``--baseline REV`` it also
runs the bound of an earlier commit (its ``specdec_lab/stats.py``, loaded from git) on the first
``--baseline-reps`` sample sets of each case, and plans each row's m with both.

Writes ``reports/coverage/<timestamp>/coverage.{csv,md}`` and prints the table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

from specdec_lab import report, stats
from specdec_lab.models import load_pair
from specdec_lab.sampling import SamplingConfig
from specdec_lab.stats.coverage import ALTERNATIVES, coverage_case
from specdec_lab.laws import two_token_law
from specdec_lab.verify import DEFAULT_PROMPT, MEDUSA_PROMPT, SCALES, VerifyOptions

ROOT = Path(__file__).resolve().parents[1]
TV_MULTIPLES = (0.5, 1.0, 1.5)  # planted TV, in units of the bound expected under H0 at that m


def verify_settings() -> dict[str, tuple[str, SamplingConfig]]:
    """The (prompt, sampling) of every lossless verify row."""
    o = VerifyOptions()
    return {"T=1": (DEFAULT_PROMPT, SamplingConfig(o.temperature)),
            f"T={o.low_temperature}": (DEFAULT_PROMPT, SamplingConfig(o.low_temperature)),
            f"top-p={o.top_p}": (DEFAULT_PROMPT, SamplingConfig(o.temperature, top_p=o.top_p)),
            "Medusa prompt T=1": (MEDUSA_PROMPT, SamplingConfig(o.temperature))}


def verify_laws(pair) -> dict[str, np.ndarray]:
    """'<row> first' and '<row> joint' -> the exact law (V,) or (V * V,)."""
    laws = {}
    for name, (prompt, sampling) in verify_settings().items():
        law = two_token_law(pair, pair.encode(prompt), sampling)
        laws[f"{name} first"], laws[f"{name} joint"] = law.first, law.joint
    return laws


def load_baseline(rev: str) -> types.ModuleType:
    """The ``specdec_lab/stats.py`` of an earlier commit, as a module (the single-file layout)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:specdec_lab/stats.py"],
                            capture_output=True, text=True, check=True).stdout
    name = f"specdec_lab_stats_at_{rev}"
    if name not in sys.modules:  # dataclasses look their module up in sys.modules
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, f"{rev}:specdec_lab/stats.py", "exec"), module.__dict__)
    return sys.modules[name]


def _case(job: dict) -> dict:
    torch.set_num_threads(1)
    baseline = load_baseline(job["baseline"]) if job["baseline"] else None
    rng = np.random.default_rng(job["seed"])
    p, m = job["p"], job["m"]
    plan = stats.BoundPlan(p, m)
    q = ALTERNATIVES[job["alternative"]](p, job["multiple"] * plan.expected_upper(), plan.chosen_floor, rng)
    result = coverage_case(p, q, m, job["reps"], rng, plan=plan,
                           baseline=(lambda c, p_: baseline.tv_upper_bound(c, p_).upper) if baseline else None,
                           baseline_reps=job["baseline_reps"])
    return {"law": job["law"], "alternative": job["alternative"], "TV / H0 bound": job["multiple"], **result}


def plan_table(laws: dict, baseline=None) -> pd.DataFrame:
    """m planned per verify row at default scale (first-token bound <= 0.02, assurance 0.999), and the
    joint law's m at the full scale's 0.025, with this bound and (given) the baseline's."""
    scales = {"first": SCALES["default"].tolerance, "joint": SCALES["full"].joint_tolerance}
    rows = []
    for law, p in laws.items():
        eps = scales[law.rsplit(" ", 1)[1]]
        row = {"law": law, "ε": eps,
               "m planned": stats.plan_bound_by_simulation(p, eps, rng=np.random.default_rng(0))}
        if baseline is not None:
            row["m planned (baseline)"] = baseline.plan_bound_by_simulation(p, eps, rng=np.random.default_rng(0))
            row["ratio"] = row["m planned"] / row["m planned (baseline)"]
        rows.append(row)
        print(row, flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2000, help="replicate sample sets per case")
    parser.add_argument("--baseline", default=None, help="a git revision whose specdec_lab/stats.py to compare with")
    parser.add_argument("--baseline-reps", type=int, default=300)
    parser.add_argument("--laws", default="first,joint", help="which laws: first, joint or both")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--multiples", default=",".join(map(str, TV_MULTIPLES)),
                        help="planted TVs, in units of the bound expected under H0 (joint laws: the first one only "
                             "with --joint-multiples)")
    parser.add_argument("--joint-multiples", default=None, help="planted TVs on the joint laws (default: --multiples)")
    parser.add_argument("--out", type=Path, default=Path("reports/coverage"))
    args = parser.parse_args(argv)
    started = time.time()
    torch.set_num_threads(1)
    kinds = set(args.laws.split(","))
    laws = {k: v for k, v in verify_laws(load_pair("bundled")).items() if k.rsplit(" ", 1)[1] in kinds}
    baseline = load_baseline(args.baseline) if args.baseline else None
    plans = plan_table(laws)  # the cases run at the m this bound plans; the baseline's plans come last
    planned = dict(zip(plans["law"], plans["m planned"]))
    multiples = {"first": [float(v) for v in args.multiples.split(",")]}
    multiples["joint"] = [float(v) for v in (args.joint_multiples or args.multiples).split(",")]
    order = sorted(laws, key=lambda law: law.endswith("joint"))  # the quick first-token laws first
    cases = [(law, alt, mult) for law in order for alt in ALTERNATIVES
             for mult in ((1.0,) if alt == "null" else multiples[law.rsplit(" ", 1)[1]])]
    jobs = [{"law": law, "p": laws[law], "m": int(planned[law]), "alternative": alt, "multiple": mult,
             "reps": args.reps, "baseline": args.baseline, "baseline_reps": args.baseline_reps, "seed": [i, 31]}
            for i, (law, alt, mult) in enumerate(cases)]
    folder = args.out / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.workers) as pool:
        rows = []
        for row in pool.map(_case, jobs):
            rows.append(row)
            pd.DataFrame(rows).to_csv(folder / "coverage.csv", index=False)  # a killed run keeps its cases
            print(f"{row['law']:>26} {row['alternative']:>15} x{row['TV / H0 bound']}: misses {row['misses']}"
                  f"/{row['replicates']}, median {row['median bound']:.4f} (baseline {row['baseline median']:.4f})",
                  flush=True)
        table = pd.DataFrame(rows)
    if baseline is not None:
        plans = plan_table(laws, baseline)
    # a 99% bound's misses are Binomial(reps, <= 0.01): flag a case only when that is rejected at 1%
    table["misses too many"] = sps.binom.sf(table["misses"] - 1, table["replicates"], 0.01) < 0.01
    if baseline is not None:
        table["median / baseline"] = table["median bound"] / table["baseline median"]
    table.to_csv(folder / "coverage.csv", index=False)
    plans.to_csv(folder / "plan.csv", index=False)
    text = (f"# Coverage of the 99% TV bound ({args.reps} replicates per case)\n\n"
            + report.to_markdown(table) + "\n\n## Planned m\n\n"
            + report.to_markdown(plans)
            + f"\n\nworst miss rate {table['miss rate'].max():.4f}; cases with too many misses: "
            + f"{int(table['misses too many'].sum())}; {time.time() - started:.0f} s\n")
    (folder / "coverage.md").write_text(text)
    print(text)
    print(f"written: {folder}")
    return 1 if table["misses too many"].any() else 0


if __name__ == "__main__":
    sys.exit(main())
