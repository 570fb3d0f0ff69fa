"""Kernel-audit benchmark (docs/benchmarks.md#kernel-audit): not a timed test, a measurement.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/kernels.py [--vocab 128256] [--samples 200] [--threads 2]

Measures, on the standard heterogeneous batch (10 rows, K = 4) at vocabulary V:
1. our torch kernel's throughput (row-draws per second of kernel time) and the harness's own time
   (drawing drafts, copying inputs, counting) as a share of the kernel's, then the judgement's time;
2. the time ``assert_lossless_kernel`` takes to catch the per-row temperature leak, from scratch
   (scenarios and exact laws included), at the smallest budget of the ladder 25, 50, 100, ... that catches it;
3. the peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from specdec_lab.kernels.harness import AuditSettings, collect, replicas_for
from specdec_lab.kernels.judge import judge
from specdec_lab.kernels.law import row_law
from specdec_lab.kernels.ours import BATCH_FAULTY, LOSSLESS
from specdec_lab.kernels.scenarios import standard_batch
from specdec_lab.testing import assert_lossless_kernel


def throughput(vocab: int, samples: int) -> dict:
    """Our kernel on the standard batch: kernel time, harness time, judgement time."""
    batch = standard_batch(vocab, 4)
    settings = AuditSettings(samples=samples)
    tallies = collect(LOSSLESS, batch, settings)
    started = time.perf_counter()
    verdict = judge(LOSSLESS.name, batch, tuple(row_law(row) for row in batch.rows), tallies, settings)
    draws = tallies.calls * tallies.rows_per_call
    return {"replicas": replicas_for(batch, settings), "calls": tallies.calls, "row_draws": draws,
            "kernel_s": tallies.kernel_seconds, "harness_s": tallies.harness_seconds,
            "judge_s": time.perf_counter() - started, "draws_per_s": draws / tallies.kernel_seconds,
            "harness_share": tallies.harness_seconds / tallies.kernel_seconds, "passed": verdict.passed}


def time_to_catch(vocab: int, sampled_only: bool = False, name: str = "temperature_leak") -> dict:
    """Seconds for ``assert_lossless_kernel`` to reject a batch control, at the smallest budget that does
    (``sampled_only``: without the greedy row, which a leaked temperature of 1 betrays at once)."""
    samples = 25
    while True:
        started = time.perf_counter()
        batch = standard_batch(vocab, 4)
        if sampled_only:
            batch = batch.select(lambda row: row.temperature > 0)
        try:
            assert_lossless_kernel(BATCH_FAULTY[name], samples=samples, scenarios=batch)
        except AssertionError as caught:
            rows = str(caught).split("failing rows: ")[1].split("]")[0] + "]"
            return {"samples": samples, "seconds": time.perf_counter() - started, "failing_rows": rows}
        samples *= 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/kernels.py", description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--samples", type=int, default=200, help="draws per row for the throughput run")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = throughput(args.vocab, args.samples)
    print(f"V = {args.vocab:,}, {args.threads} torch threads, {args.samples} draws per row, replicas {run['replicas']}, "
          f"{run['calls']} calls, {run['row_draws']:,} row-draws")
    print(f"our kernel: {run['draws_per_s']:.1f} row-draws/s of kernel time ({run['kernel_s']:.1f} s); "
          f"harness {run['harness_s']:.2f} s = {run['harness_share']:.1%} of the kernel's; judgement "
          f"{run['judge_s']:.1f} s; verdict {'lossless' if run['passed'] else 'REJECTED'}")
    for sampled_only in (False, True):
        caught = time_to_catch(args.vocab, sampled_only)
        print(f"temperature leak ({'sampled rows only' if sampled_only else 'standard batch'}) caught in "
              f"{caught['seconds']:.1f} s at {caught['samples']} draws per row (failing rows {caught['failing_rows']})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
