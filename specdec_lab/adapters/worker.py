"""Worker processes in engines' own environments, seen from the main environment: start, ask, stop.

Engines whose pins clash with the main environment (vLLM, OpenVINO GenAI, ONNX Runtime GenAI) run in a process of
their own interpreter that holds one engine. :class:`Engine` is one such engine: where its interpreter is, the
environment its workers get, and its running workers (one per engine setting, started on first use, all stopped
at exit or by ``close_workers()``). A worker script is run by file path (``python -P <script> '<engine json>'``), so
the main environment never imports the engine; it speaks the protocol of
:mod:`~specdec_lab.adapters.worker_loop`: a first line ``{"ready": true, ...}`` (or ``{"error": ...}`` when the
engine refused to start), then one JSON reply line per job written to its stdin. Everything the engine prints goes
to a log file.

Also here, shared by those adapters: the sampling job every worker takes (:func:`sampling_job`), the bundled pair
converted once per machine into an engine's format (:func:`converted_pair`), and the greedy checks (our target's
argmax decode against an engine's converted copy; an engine's speculative greedy against its own plain greedy).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ERROR_PREFIX = "engine error: "  # stats key prefix of the count of one engine message (count_errors)


class EngineError(RuntimeError):
    """An engine refused a setting, crashed, or answered something the audit cannot use (each engine's adapter
    raises a subclass of its own)."""


class EngineWorker:
    """One worker process; ``ask(job)`` → reply dict. ``error`` is the exception class its failures raise;
    ``ready`` the worker's first line (the engine's version among its fields)."""

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

    def ask(self, job: dict, timeout: float = 60, close_on_error: bool | None = None) -> dict:
        """Send one job, return its reply; a reply with ``error`` raises ``self.error``.

        On an error the worker is closed (an engine that failed a job may be left broken, and can spin), except
        after a tool job (``{"tool": ...}``: no engine touched) or when ``close_on_error`` is False."""
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        reply = self._read(timeout)
        if "error" in reply:
            if close_on_error if close_on_error is not None else "tool" not in job:
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


def worker_env(extra: dict[str, str] | None = None) -> dict:
    """A worker's environment: this one, one OpenMP thread, quiet tokenizers, no ``PYTHONPATH`` (the engine's own
    packages only), plus ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": "", **(extra or {})}


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

    def running(self) -> EngineWorker | None:
        """Any worker still alive (None: none)."""
        return next((w for w in self.workers.values() if w.alive()), None)

    def close(self) -> None:
        while self.workers:
            self.workers.popitem()[1].close()


class Engine:
    """One engine in its own environment: its interpreter, its workers' environment, its running workers.

    label: the engine's name in messages ("OpenVINO GenAI"); script: the worker script's file name in this folder;
    error: the exception class its failures raise; version_key: the ready line's field holding the engine's version
    (each worker's ``version``); python: returns the environment's interpreter (raises FileNotFoundError when the
    environment is missing); env: extra variables of the workers' environment; startup_timeout: seconds a worker may
    take to answer its ready line. Workers are stopped when this process exits.
    """

    def __init__(self, label: str, script: str, error: type[Exception], version_key: str,
                 python: Callable[[], Path], env: dict[str, str] | None = None,
                 startup_timeout: float = 300.0) -> None:
        self.label, self.script, self.error, self.version_key = label, HERE / script, error, version_key
        self.python, self.extra_env, self.startup_timeout = python, env, startup_timeout
        self.pool = WorkerPool(self.start)
        atexit.register(self.close_workers)

    def env(self) -> dict:
        """The environment of this engine's worker processes (and of its tools: exporters, model builders)."""
        return worker_env(self.extra_env)

    def start(self, engine: dict | None) -> EngineWorker:
        """A new worker holding ``engine`` (the worker script's settings JSON; None: a worker without an engine,
        for tool jobs); raises ``error`` when the engine refuses to start."""
        argv = [str(self.python()), "-P", str(self.script), "--tools" if engine is None else json.dumps(engine)]
        worker = EngineWorker(argv, self.env(), REPO, self.error, self.label, self.startup_timeout)
        worker.version = worker.ready[self.version_key]
        return worker

    def worker(self, engine: dict | None) -> EngineWorker:
        """The running worker of this engine setting (started on first use)."""
        return self.pool.get(engine)

    def tools(self) -> EngineWorker:
        """A running worker to answer tool jobs: any worker already started (the engine is imported there), else
        a worker without an engine."""
        return self.pool.running() or self.worker(None)

    def close_workers(self) -> None:
        """Stop every worker of this engine that this process started."""
        self.pool.close()

    def run_tool(self, argv: list[str], made: Path) -> Path:
        """Run one of the environment's own programs (an exporter, a model builder) that should make ``made``;
        raises ``error`` with the end of its stderr when it fails or ``made`` is missing afterwards."""
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env())
        if done.returncode != 0 or not made.exists():
            raise self.error(f"`{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return made


def sampling_job(prompt, seeds: list[int], length: int, sampling) -> dict:
    """The sampling job every worker takes: one request per seed, each exactly ``length`` tokens after ``prompt``
    (a (P,) tensor of ids), with the temperature / top-p / top-k of ``sampling`` (a SamplingConfig; top-k None: off).
    vLLM's job adds ``n_per_request``."""
    return {"prompt_ids": prompt.tolist(), "seeds": seeds, "length": length, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": sampling.top_k}


def count_errors(totals: dict, errors: list[dict]) -> None:
    """Count a reply's per-request engine errors (``{"message": ...}`` each) into a sample set's stats:
    ``engine_errors``, and per message ``engine error: <message>`` (stats hold numbers only: collect sums them).

    >>> totals = {}
    >>> count_errors(totals, [{"message": "Check failed"}] * 2)
    >>> totals
    {'engine_errors': 2, 'engine error: Check failed': 2}
    """
    totals["engine_errors"] = totals.get("engine_errors", 0) + len(errors)
    for error in errors:
        add_counts(totals, {f"{ERROR_PREFIX}{error['message']}": 1})


def check_lengths(tokens: list[list[int]], length: int, engine: Engine) -> None:
    """Raise ``engine.error`` unless every returned row has exactly ``length`` tokens."""
    for ids in tokens:
        if len(ids) != length:
            raise engine.error(f"{engine.label} returned {len(ids)} tokens, asked for exactly {length}")


def converted_pair(prefix: str, version: str, marker: str, convert: Callable[[Path, Path], Path]) -> tuple[Path, Path]:
    """(target, draft) folders of the bundled pair in an engine's format, converted once per machine and reused.

    ``convert(source, dest)`` converts one bundled model folder into ``dest``; a folder counts as done once it holds
    ``marker``. The folders live in ``<cache_root()>/<prefix>-<16 hex of the weights' sha256>-<version>``, so new
    weights or a new engine version convert anew; a conversion is written to ``<name>.partial`` and renamed.
    """
    from specdec_lab.models import BUNDLED_DIR, verify_manifest

    manifest = verify_manifest(BUNDLED_DIR)
    key = hashlib.sha256((manifest["files"]["target/model.safetensors"]
                          + manifest["files"]["draft/model.safetensors"]).encode()).hexdigest()[:16]
    root = cache_root() / f"{prefix}-{key}-{version}"
    for name in ("target", "draft"):
        if not (root / name / marker).exists():
            convert(BUNDLED_DIR / name, root / f"{name}.partial")
            (root / f"{name}.partial").rename(root / name)
    return root / "target", root / "draft"


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


def greedy_check(greedy_tokens: Callable[[str], list[int]], method: str) -> dict:
    """An engine's greedy tokens with ``method`` against its own non-speculative ("none") greedy tokens, where
    ``greedy_tokens(method)`` decodes one fixed prompt and length.

    >>> greedy_check(lambda method: [1, 2, 3] if method == "none" else [1, 2, 4], "draft_model")["first_difference"]
    2
    """
    reference = greedy_tokens("none")
    speculative = reference if method == "none" else greedy_tokens(method)
    return {"reference": reference, "speculative": speculative, "identical": reference == speculative,
            "first_difference": first_difference(reference, speculative)}


def greedy_identity(pair, prompts: list[str], length: int, plain_tokens: Callable) -> list[dict]:
    """An engine's converted target against ours: ``plain_tokens(prompt_ids, length)`` (the engine's greedy
    decode, no speculation) against our target's argmax decode, token for token, one row per prompt."""
    rows = []
    for text in prompts:
        ids = pair.encode(text)
        ours, theirs = greedy_decode(pair, ids, length), plain_tokens(ids, length)
        rows.append({"prompt": text, "identical": ours == theirs, "first_difference": first_difference(ours, theirs)})
    return rows


def add_counts(totals: dict, counts: dict) -> None:
    """Add integer counts into ``totals`` (a sample set's stats)."""
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value
