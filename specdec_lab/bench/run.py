"""Running the whole benchmark: every job in order, then bench.json and bench.md; the vLLM row; the command line.

:func:`run_benchmark` runs :data:`~specdec_lab.bench.jobs.ORDER` and the throughput jobs again after the long
prompt, and writes ``bench.json`` (config, meta, results) and ``bench.md`` under ``out_dir``;
:func:`main` is ``python -m specdec_lab.bench`` (``make bench``, ``benchmarks/run.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from specdec_lab.bench.jobs import JOBS, LONG, ORDER, THROUGHPUT, VLLM_ORDER, run_in_subprocess, run_job
from specdec_lab.bench.measure import FULL, QUICK, BenchConfig
from specdec_lab.bench.tables import render, vllm_table

def run_vllm_benchmark(cfg: BenchConfig) -> str:
    """The vLLM row: :data:`VLLM_ORDER`, each job in its own process; markdown table with the load average."""
    load_before = _load_average()
    results = {name: run_in_subprocess(name, cfg) for name in VLLM_ORDER}
    from specdec_lab.report import to_markdown

    table = to_markdown(vllm_table(results, cfg))
    return (f"{table}\n\nL = {cfg.length}, prompt {cfg.prompt!r}, {cfg.samples} samples per repeat, {cfg.repeats} "
            f"repeats, torch threads {cfg.threads}; load average before {load_before}, after {_load_average()}.")


def run_benchmark(cfg: BenchConfig, out_dir: Path | str | None = None, progress: bool = True,
                  runner: Callable[[str, BenchConfig], dict] = run_in_subprocess) -> tuple[dict, str]:
    """Run every job, write bench.json and bench.md under ``out_dir``; return (data, markdown).

    ``runner`` runs one job: :func:`run_in_subprocess` (default: peak RSS per configuration) or
    :func:`run_job` (in this process; the smoke test's choice, RSS then is cumulative).
    """
    import transformers

    meta = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "load_before": _load_average()}
    results = {}
    for name in ORDER:
        if progress:
            print(f"[bench] {name} …", file=sys.stderr, flush=True)
        results[name] = runner(name, cfg)
    for name in THROUGHPUT:
        if progress:
            print(f"[bench] {name} after the long prompt …", file=sys.stderr, flush=True)
        results[name + LONG] = runner(name, replace(cfg, prompt=cfg.long_prompt))
    meta["load_after"] = _load_average()
    markdown = render(results, cfg, meta)
    if out_dir is None:
        out_dir = Path("reports") / "bench" / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps({"config": asdict(cfg), "meta": meta, "results": results},
                                                   indent=1, default=str))
    (out_dir / "bench.md").write_text(markdown)
    return {"config": asdict(cfg), "meta": meta, "results": results, "dir": str(out_dir)}, markdown


def _load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmarks: sample-collection throughput, work per token, batch-1 "
                                                 "latency, peak memory.")
    parser.add_argument("--quick", action="store_true", help="smoke size (seconds), for tests")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 2; quick: 1)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="samples per throughput repeat")
    parser.add_argument("--out", default=None, help="output folder (default reports/bench/<timestamp>)")
    parser.add_argument("--vllm", action="store_true", help="only the vLLM row: ours vs vLLM offline (needs make vllm)")
    parser.add_argument("--job", choices=sorted(JOBS), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        settings = json.loads(args.settings)
        settings["ks"] = tuple(settings["ks"])
        print(json.dumps(run_job(args.job, BenchConfig(**settings))))
        return 0
    cfg = QUICK if args.quick else FULL
    overrides = {key: value for key, value in (("device", args.device), ("threads", args.threads),
                                               ("repeats", args.repeats), ("samples", args.samples))
                 if value is not None}
    cfg = replace(cfg, **overrides)
    if args.vllm:
        print(run_vllm_benchmark(cfg))
        return 0
    _, markdown = run_benchmark(cfg, args.out)
    print(markdown)
    return 0
