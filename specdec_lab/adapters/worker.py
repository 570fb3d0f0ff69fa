"""A worker process in an engine's own environment, spoken to in JSON lines.

Engines whose pins clash with the main environment (vLLM, OpenVINO GenAI) run in a process of their own
interpreter that holds one engine: its first stdout line is ``{"ready": true, ...}`` (or ``{"error": ...}``
when the engine refused to start), and each job written to its stdin gets one JSON reply line. Everything
the engine prints goes to a log file. The worker scripts are run by file path, so the main environment
never imports the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path


class EngineWorker:
    """One worker process; ``ask(job)`` → reply dict. ``error`` is the exception class its failures raise."""

    def __init__(self, argv: list[str], env: dict, cwd: Path, error: type[Exception], label: str,
                 startup_timeout: float = 600.0) -> None:
        self.error, self.label = error, label
        self.log = tempfile.NamedTemporaryFile(prefix=f"specdec-{label.lower().replace(' ', '-')}-", suffix=".log",
                                               delete=False)
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env=env, cwd=cwd, start_new_session=True)
        self.ready = self._read(startup_timeout)
        if "error" in self.ready:
            self.close()
            raise error(f"{label} refused the engine: {self.ready['error']}\n(log: {self.log.name})")

    def _read(self, timeout: float) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=timeout)
            raise self.error(f"{self.label} worker exited with {self.process.returncode}:\n{self.log_tail()}")
        return json.loads(line)

    def ask(self, job: dict, timeout: float = 60, close_on_error: bool = True) -> dict:
        """Send one job, return its reply; a reply with ``error`` raises (and closes the worker unless told not to:
        an engine that failed a job may be left broken)."""
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        reply = self._read(timeout)
        if "error" in reply:
            if close_on_error:
                self.close()
            raise self.error(f"{self.label} failed the job: {reply['error']}")
        return reply

    def log_tail(self, chars: int = 4000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Close stdin (the worker exits at once); terminate it if it has not within 10 s."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/specdec-lab``: per-machine builds, outside every clone."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec-lab"


def engine_python(env_var: str, name: str, requirements: Path, repo: Path) -> Path:
    """The interpreter of an engine's environment: ``$env_var``, else ``<repo>/.venv-<name>``, else the per-machine
    cache ``.ci/run`` builds (``venv-<name>-<first 16 hex of the requirements file's sha256>``); each counts only
    once its ``.installed`` stamp exists (``make <name>`` writes it last)."""
    if os.environ.get(env_var):
        candidates = [Path(os.environ[env_var])]
    else:
        digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
        candidates = [repo / f".venv-{name}" / "bin" / "python", cache_root() / f"venv-{name}-{digest}" / "bin" / "python"]
    for python in candidates:
        if python.exists() and (python.parent.parent / ".installed").exists():
            return python
    raise FileNotFoundError(f"the {name} environment is missing ({', '.join(map(str, candidates))}); "
                            f"build it with `make {name}`")


class WorkerPool:
    """Running workers keyed by their engine settings: one per setting, started on first use, all stopped by
    ``close()``."""

    def __init__(self, start) -> None:
        self.start, self.workers = start, {}

    def get(self, engine: dict) -> EngineWorker:
        key = json.dumps(engine, sort_keys=True)
        if key not in self.workers or not self.workers[key].alive():
            self.workers[key] = self.start(engine)
        return self.workers[key]

    def close(self) -> None:
        while self.workers:
            self.workers.popitem()[1].close()


def distinct_seeds(generator, count: int, high: int) -> list[int]:
    """``count`` distinct request seeds in [0, high) from the collection's generator.

    >>> import torch
    >>> len(set(distinct_seeds(torch.Generator().manual_seed(0), 1000, 2**32)))
    1000
    """
    import torch

    seeds: list[int] = []
    while len(seeds) < count:
        draw = torch.randint(0, min(high, 2**62), (count,), generator=generator, device=generator.device)
        seeds = list(dict.fromkeys(seeds + draw.tolist()))[:count]
    return seeds


def greedy_decode(pair, prompt, length: int) -> list[int]:
    """Our target's greedy continuation (argmax over the tokenizer's vocabulary at each step): what an engine's
    converted copy of the target must reproduce token for token."""
    import torch

    ids = prompt.to(pair.device)
    with torch.no_grad():
        for _ in range(length):
            logits = pair.target(ids[None]).logits[0, -1, : pair.vocab_size]
            ids = torch.cat([ids, logits.argmax()[None]])
    return ids[len(prompt):].tolist()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (None: identical).

    >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1], [1])
    (1, None)
    """
    different = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return different[0] if different else (None if len(a) == len(b) else min(len(a), len(b)))


def add_counts(totals: dict, counts: dict) -> None:
    """Add integer counts into ``totals`` (a sample set's stats)."""
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value
