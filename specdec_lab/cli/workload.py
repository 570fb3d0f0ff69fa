"""``specdec-lab audit workload``: arguments, serving the bundled engines, the printed tables, the exit status."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab.adapters.workload_client import ClientSettings
from specdec_lab.laws.workload import LawBook
from specdec_lab.suite import SuiteSettings
from specdec_lab import results, verdicts
from specdec_lab.workload import (DEFAULT_WORKLOAD, ENGINES, WorkloadRun, audit_workload, load_workload, plan_cells,
                                  throughput, two_sample_results)
from specdec_lab.workload.run import check_promises, pairs_until_decided
from specdec_lab.workload.two_sample import verdict_rows as two_sample_verdicts

BUNDLED = {  # --serve-bundled ENGINE -> (llama-server model alias, its reference without speculation)
    "llama-server": ("target-draft", "target-nodraft"),
    "llama-server-nodraft": ("target-nodraft", "target-nodraft"),  # the same server without speculation
}
# --serve-bundled vllm-METHOD: `vllm serve` of the bundled target with one of vLLM's methods (K = 4; "none": without
# speculation, the confirmation run and the two-sample reference)
VLLM_BUNDLED = ("none", "draft_model", "ngram", "eagle", "eagle3", "medusa")
VLLM_MAX_TOKENS = 2  # vLLM's counters attribute drafts to token 2 exactly at 2 new tokens (drafting.COUNTER_RULES)
SERVE_PARALLEL = 4  # llama-server slots (-np): continuous batching of four sequences
SERVE_BATCH = 128  # llama-server's prefill chunk (-b/-ub); the default workload's long prompts exceed it
EXIT_STATUS = """exit status:
  0  every judged cell certified (equivalent: TV bound <= ε, simultaneously over the cells)
  1  some cell rejected, a promise broken (logprobs, seeds, greedy), or the server failed or refused requests
  3  nothing rejected, but some cell inconclusive (not a pass: more samples needed; --plan says how many)
  2  usage or input error"""


def add_workload_parser(kinds) -> None:
    """``specdec-lab audit workload``."""
    from specdec_lab.models import add_pair_arguments

    w = kinds.add_parser("workload", help="a live server under production traffic: mixed concurrent cells, "
                                          "per-cell verdicts (specdec_lab/workload/)",
                         epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = w.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server under audit, e.g. http://127.0.0.1:8080")
    where.add_argument("--serve-bundled", choices=sorted(BUNDLED) + [f"vllm-{m}" for m in VLLM_BUNDLED],
                       help=f"start it on loopback: llama-server with the bundled draft (K=4), -np {SERVE_PARALLEL}, "
                            f"-b/-ub {SERVE_BATCH} (`make llama-cpp` builds it); llama-server-nodraft: the same "
                            "without speculation (the confirmation run); vllm-METHOD: `vllm serve` (`make vllm`) "
                            "with that speculative method, K=4 (vllm-none: without speculation)")
    w.add_argument("--reference-url", default=None,
                   help="two-sample mode: the same engine without speculation ('bundled' with --serve-bundled: "
                        "start it); each cell compares the two servers' samples")
    w.add_argument("--workload", type=Path, default=None, help=f"YAML/JSON workload (default: {DEFAULT_WORKLOAD.name}, "
                                                              "bundled)")
    w.add_argument("--samples", type=int, default=400, help="samples per cell (choices)")
    w.add_argument("--max-tokens", type=int, default=None,
                   help=f"new tokens per request, overriding the workload's (default with --serve-bundled vllm-*: "
                        f"{VLLM_MAX_TOKENS}, where vLLM's counters attribute drafts to token 2)")
    w.add_argument("--exclude-cell", action="append", default=[], metavar="NAME",
                   help="leave this cell of the workload out (repeatable): e.g. one whose requests crash the engine, "
                        "once that crash is on record, so the other cells get verdicts")
    w.add_argument("--patch", default=None, choices=["vllm-cpu-expand"],
                   help="with --serve-bundled vllm-*: an opt-in fix of ours applied in the server's processes "
                        "(specdec_lab/patches; the installed files stay as they are)")
    w.add_argument("--out", type=Path, default=None,
                   help="folder of the per-cell parquet files (resumes); required unless --plan")
    w.add_argument("--model", default=None, help="the request's model field (default: the served alias, or target)")
    w.add_argument("--engine", default=None, choices=sorted(ENGINES),
                   help="request dialect and sampler order of the server (the exact law follows its order; default "
                        "llama.cpp, vllm with --serve-bundled vllm-*)")
    w.add_argument("--speculative", choices=["yes", "no", "unknown"], default="unknown",
                   help="does the server speculate? 'no': no drafting required for 'equivalent' (--serve-bundled "
                        "sets it)")
    w.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    w.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    w.add_argument("--retries", type=int, default=3, help="retries of transport errors (never of HTTP errors)")
    w.add_argument("--tolerance", type=float, default=0.02, help="ε: a cell is equivalent when its TV bound is <= ε")
    w.add_argument("--alpha", type=float, default=0.01, help="level of the Holm step across cells")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--until-decided", action="store_true",
                   help="sequential decisions: judge every cell after each round of requests, stop a cell once its "
                        "e-process rejects it or its bound certifies it, go on round-robin over the others until "
                        "--budget requests are spent (resuming keeps the error rates: specdec_lab/workload/sequential.py); "
                        "with --reference-url: look 1 at --samples a cell on both servers, then rounds of --samples/4 "
                        "on the cells their pairs have not decided")
    w.add_argument("--budget", type=int, default=20_000, help="with --until-decided: requests in all (default 20,000)")
    w.add_argument("--plan", action="store_true",
                   help="print each cell's planned m (the samples at which a correct server's bound reaches ε with "
                        "probability 0.999) and exit")
    w.add_argument("--bench", action="store_true",
                   help="throughput only: the audit's requests/s against a plain load loop's (same requests, same "
                        "concurrency, same server; order plain, audit, plain); no verdicts")
    w.add_argument("--no-promises", action="store_true",
                   help="skip the exact promises (logprobs, seeds under batching, greedy, acceptance) and the ≤ 7.5%% "
                        "more requests their seed check sends")
    w.add_argument("--quiet", action="store_true")
    add_pair_arguments(w)
    w.set_defaults(func=cmd_workload)


def _print_table(table: pd.DataFrame) -> None:
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def cmd_workload(args) -> int:
    """Run the workload audit; exit 0 when every judged cell is certified, 1 when any is rejected or the server
    failed requests, 3 when none is rejected but some is inconclusive, 2 for usage or input errors."""
    import contextlib

    from specdec_lab.models import pair_from_args

    args.started = time.monotonic()  # the wall time results.json records runs from here
    workload = load_workload(args.workload)  # validated before anything touches the disk
    on_vllm = bool(args.serve_bundled) and args.serve_bundled.startswith("vllm-")
    if args.patch is not None and not on_vllm:
        raise ValueError("--patch applies to a server this command starts: use it with --serve-bundled vllm-*")
    if on_vllm and args.engine not in (None, "vllm"):
        raise ValueError(f"--serve-bundled {args.serve_bundled} speaks vLLM's dialect, not --engine {args.engine}")
    args.engine = args.engine or ("vllm" if on_vllm else "llama.cpp")
    max_tokens = args.max_tokens if args.max_tokens is not None else VLLM_MAX_TOKENS if on_vllm else None
    if max_tokens is not None:
        if not 2 <= max_tokens <= 16:
            raise ValueError(f"--max-tokens must be in [2, 16], got {max_tokens}")
        workload = replace(workload, max_tokens=max_tokens)
    if args.exclude_cell:
        unknown = sorted(set(args.exclude_cell) - {c.name for c in workload.cells})
        if unknown:
            raise ValueError(f"--exclude-cell {unknown[0]}: no such cell in workload {workload.name!r}")
        workload = replace(workload, cells=tuple(c for c in workload.cells if c.name not in args.exclude_cell))
        if not workload.cells:
            raise ValueError("--exclude-cell left no cell")
    if args.samples < 1 or args.concurrency < 1 or not 0 < args.tolerance < 1 or not 0 < args.alpha < 1:
        raise ValueError("need --samples >= 1, --concurrency >= 1, 0 < --tolerance < 1 and 0 < --alpha < 1")
    if args.until_decided and args.budget < 1:
        raise ValueError("--until-decided needs --budget >= 1")
    if args.reference_url == "bundled" and not args.serve_bundled:
        raise ValueError("--reference-url bundled needs --serve-bundled")
    if args.out is None and not args.plan:
        raise ValueError("--out is required (the folder of the per-cell parquet files), unless --plan")
    pair = pair_from_args(args)
    suite = SuiteSettings(alpha=args.alpha, tolerance=args.tolerance, joint_tolerance=args.tolerance, n_resamples=2000)
    if args.plan:
        _print_table(plan_cells(LawBook(pair, ENGINES[args.engine].order), workload, args.tolerance, args.seed,
                                confidence=suite.confidence))
        return 0
    client = ClientSettings(args.concurrency, args.timeout, args.retries, progress=not args.quiet)
    with contextlib.ExitStack() as stack:
        base_url, reference_url, speculative = args.base_url, args.reference_url, args.speculative != "no"
        model = args.model or "target"
        if on_vllm:
            from specdec_lab.adapters import vllm_serve as vllm

            method = args.serve_bundled.removeprefix("vllm-")
            served = stack.enter_context(vllm.served(method, patch=args.patch))
            base_url, model, speculative = served.base_url, args.model or "target", method != "none"
            print(f"serving {vllm.server_label(method, patch=args.patch)} at {base_url}", flush=True)
            if reference_url == "bundled":
                reference_url = stack.enter_context(vllm.served("none")).base_url
        elif args.serve_bundled:
            from specdec_lab.adapters import llamacpp

            alias, reference_alias = BUNDLED[args.serve_bundled]
            served = stack.enter_context(llamacpp.bundled_server(model=alias, parallel=SERVE_PARALLEL,
                                                                 batch=SERVE_BATCH))
            base_url, model, speculative = served.base_url, args.model or alias, alias == "target-draft"
            print(f"serving {llamacpp.server_label(alias)} at {base_url}: -np {SERVE_PARALLEL}, -b/-ub {SERVE_BATCH}",
                  flush=True)
            if reference_url == "bundled":
                reference = stack.enter_context(llamacpp.bundled_server(model=reference_alias,
                                                                        parallel=SERVE_PARALLEL, batch=SERVE_BATCH))
                reference_url = reference.base_url
        run = WorkloadRun(base_url, args.out, args.samples, model, args.engine, args.seed, speculative, client,
                          suite=suite)
        if args.bench:
            bench = throughput(pair, workload, run)
            print(" | ".join(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}" for k, v in bench.items()))
            return 0
        how = (f"{args.samples} samples each, then rounds on the undecided cells' pairs, at most {args.budget:,} "
               "requests" if args.until_decided and reference_url else
               f"until decided, at most {args.budget:,} requests, rounds of {run.round_requests} per cell"
               if args.until_decided else f"{args.samples} samples each")
        print(f"workload {workload.name!r}: {len(workload.cells)} cells in {len(workload.groups())} group(s), {how}, "
              f"{args.concurrency} requests in flight", flush=True)
        reference, two = None, None
        if reference_url:
            # the same seeds as the audited run: each seeded request pairs the two servers' outputs (the coupling
            # certificate); the two-sample route takes independent halves (specdec_lab.workload.two_sample)
            ref_model = (args.model or "target-nodraft") if args.serve_bundled and not on_vllm else model
            ref_run = replace(run, base_url=reference_url, out=args.out / "reference", speculative=False,
                              model=ref_model)
            if args.until_decided:  # rounds on both servers until each cell's pairs decide it
                two = pairs_until_decided(pair, workload, run, ref_run, args.budget, np.random.default_rng(args.seed))
            found = audit_workload(pair, workload, run)  # what is on disk: look 1 holds --samples a cell
            reference = audit_workload(pair, workload, ref_run)
        else:
            found = audit_workload(pair, workload, run, budget=args.budget if args.until_decided else None)
        checks = [] if args.no_promises else check_promises(pair, workload, run, found, reference)
    return report(args, pair, workload, suite, found, reference, two, checks)


def report(args, pair, workload, suite: SuiteSettings, found: dict, reference: dict | None,
           two: pd.DataFrame | None = None, checks: list | None = None) -> int:
    """Print the tables, write ``verdicts.csv``, ``two-sample.csv``, ``summary.txt`` and ``results.json`` into
    ``args.out``; return the exit status (:mod:`specdec_lab.verdicts`)."""
    table = found["table"]
    print(f"\nexact mode: each cell against the exact law of its settings (TV bounds simultaneous over the cells "
          f"at {suite.confidence:.0%}, spent per look)")
    _print_table(table)
    table.to_csv(args.out / "verdicts.csv", index=False)
    for r in found["results"]:
        if verdicts.word(r.verdict) == verdicts.REJECTED:
            print(f"  {r.cell.name}: rejected by {r.rejected_by} (Holm p = {r.holm_p:.3g})")
        if r.errors and r.refused is None:
            print(f"  {r.cell.name}: {r.errors} of {r.requests} requests failed, e.g. {r.error_example}")
        if verdicts.word(r.verdict) == verdicts.INCONCLUSIVE and r.m:
            print(f"  {r.cell.name}: inconclusive at m = {r.m:,} (TV ≤ {r.tv_upper:.4f} > ε = {suite.tolerance:g}); "
                  "`--plan` says how many samples a certificate needs")
    counters = found["counters"]
    if counters.get("verify_steps") is not None:
        print(f"server counters over the run: {int(counters.get('verify_steps', 0))} verification steps, "
              f"{int(counters.get('draft_tokens', 0))} draft tokens, "
              f"{int(counters.get('accepted_tokens', 0))} accepted")
    samples = sum(r.m for r in found["results"])
    print(f"collection: {found['seconds']:.1f} s, {samples / max(found['seconds'], 1e-9):.1f} samples/s (wall time; "
          "this call's requests only)")
    overall = found["workload_bound"]
    if overall["m"]:
        print(f"workload-level certificate: the per-request average TV over the cells (the joint (cell, outcome) law "
              f"under this mix) <= {overall['tv_upper']:.4f} at {suite.confidence:.0%} from {overall['m']:,} "
              f"completions ({overall['route']} route)")
    rows = list(found["rows"])
    status = verdicts.exit_status(r.verdict for r in rows)
    if reference is not None:
        if two is None:  # one look at what both servers answered
            two = two_sample_results(workload, found["frames"], reference["frames"], suite,
                                     pair.tokenizer.eos_token_id, np.random.default_rng(args.seed),
                                     look=max(r.look for r in found["results"]))
        ref_bound = {r.cell.name: r.tv_upper for r in reference["results"]}
        two["TV(server, p) upper"] = [row["TV upper"] + ref_bound[row["cell"]] for _, row in two.iterrows()]
        print(f"\ntwo-sample mode: TV(server, reference) per cell, simultaneous at {suite.confidence:.0%} (route: "
              "coupling of same-seed pairs or two independent samples); TV(server, p) ≤ that + the reference's own "
              "exact bound (both statements together at 98%)")
        _print_table(two)
        two.to_csv(args.out / "two-sample.csv", index=False)
        two_rows = [replace(r, sampler=f"{r.sampler} vs reference") for r in two_sample_verdicts(two, suite.tolerance)]
        rows += two_rows
        exact_rejected = status == verdicts.EXIT_REJECTED
        status = verdicts.EXIT_REJECTED if exact_rejected else verdicts.exit_status(r.verdict for r in two_rows)
    promise_rows = [c.row() for c in checks or []]
    if promise_rows:
        print("\npromises checked exactly (specdec_lab/workload/promises.py): broken is a finding (exit 1)")
        _print_table(pd.DataFrame(promise_rows))
        pd.DataFrame(promise_rows).to_csv(args.out / "promises.csv", index=False)
        status = verdicts.with_promises(status, [c.status for c in checks])
    line = found["summary"]
    (args.out / "summary.txt").write_text(line + "\n")
    print(line)
    if not any((frame["status"] > 0).any() for frame in found["frames"].values()):
        print("error: the server never answered (is it up? see the errors above)")
        return verdicts.EXIT_USAGE
    settings = {key: value for key, value in vars(args).items() if key not in ("func", "started")}
    path = results.write(args.out / "results.json", results.document(
        "audit workload", rows, settings=settings, models=results.model_identity(pair), exit_status=status,
        extra={"workload": workload.describe(), "summary": line, "workload_bound": overall,
               "promises": [verdicts.plain(r) for r in promise_rows],
               "wall_seconds": round(time.monotonic() - getattr(args, "started", time.monotonic()), 1),
               "requests": {"server": sum(r.requests for r in found["results"]),
                            "reference": sum(r.requests for r in reference["results"]) if reference else 0}}))
    print(f"results: {path}")
    print({0: "every judged cell certified (exit 0)",
           1: "a cell is rejected, a promise broken, or the server failed requests (exit 1)",
           3: "nothing rejected, but some cell is inconclusive: not a pass (exit 3)"}[status])
    return status
