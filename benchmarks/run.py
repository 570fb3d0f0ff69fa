"""Reproduce the benchmark tables of docs/benchmarks.md: `make bench` (full size) or `python benchmarks/run.py --quick`.

Everything lives in :mod:`specdec_lab.bench` (so the smoke test exercises the same code); on a GPU
machine run `python benchmarks/run.py --device cuda`. Results go to reports/bench/<timestamp>/.
"""

import sys

from specdec_lab.bench import main

if __name__ == "__main__":
    sys.exit(main())
