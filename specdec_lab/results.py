"""``results.json``: every command's verdict rows with the provenance that makes them reproducible.

A results document is one JSON object::

    {"kind": "verify" | "audit" | "workload" | "kernel" | ..., "command": "specdec-lab verify --scale smoke",
     "date": "2026-12-07", "commit": "a2f3458…" | null, "machine": "…, 2 cores", "specdec_lab": "0.1.0",
     "settings": {...}, "models": {...}, "exit_status": 0, "rows": [record, ...]}

with one :meth:`specdec_lab.verdicts.Verdict.record` per row (at least ``sampler``, ``m``, ``tv_upper``,
``verdict``). The files under ``results/`` are the runs the README and docs quote; ``make docs`` renders their
tables into the pages (:mod:`specdec_lab.report.docs`).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from specdec_lab import __version__
from specdec_lab.verdicts import Verdict, dumps

REQUIRED = ("sampler", "m", "tv_upper", "verdict")


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would type it: ``specdec-lab`` and the arguments."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["specdec-lab", *argv[1:]])


def commit() -> str | None:
    """The git commit of the checkout the package runs from (``+dirty`` when it has uncommitted changes), or None
    outside a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> str:
    """CPU model (Linux: /proc/cpuinfo), cores and OS, one line."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def provenance(argv: list[str] | None = None) -> dict:
    """Command line, date (UTC), commit, machine and library version of this run."""
    return {"command": command_line(argv), "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit(),
            "machine": machine(), "specdec_lab": __version__, "python": platform.python_version()}


def document(kind: str, rows: Iterable[Verdict], *, settings: Mapping, models: Mapping | None = None,
             exit_status: int | None = None, argv: list[str] | None = None, extra: Mapping | None = None) -> dict:
    """The results document of one run (see the module docstring)."""
    return {"kind": kind, **provenance(argv), "settings": dict(settings), "models": dict(models or {}),
            "exit_status": exit_status, **dict(extra or {}), "rows": [row.record() for row in rows]}


def write(path: str | Path, doc: Mapping) -> Path:
    """Write ``doc`` to ``path`` atomically (a temporary file renamed over it); returns the path."""
    path = Path(path)
    check(doc, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(doc))
    tmp.replace(path)
    return path


def check(doc: Mapping, source: str = "results") -> None:
    """Raise ValueError naming the first missing field of a results document."""
    for key in ("kind", "command", "date", "rows"):
        if key not in doc:
            raise ValueError(f"{source}: missing {key!r}")
    for i, row in enumerate(doc["rows"]):
        missing = [key for key in REQUIRED if key not in row]
        if missing:
            raise ValueError(f"{source}: rows[{i}] lacks {', '.join(missing)}")


def load(path: str | Path) -> dict:
    """A results document, checked."""
    path = Path(path)
    doc = json.loads(path.read_text())
    check(doc, str(path))
    return doc


def model_identity(pair) -> dict:
    """The pair's name and sha256 hashes (``pair.identity``) as plain strings."""
    return {key: str(value) for key, value in pair.identity.items()}
