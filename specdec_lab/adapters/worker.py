"""A worker process in an engine's own environment, spoken to in JSON lines.

Engines whose pins clash with the main environment (vLLM, OpenVINO GenAI) run in a process of their own
interpreter that holds one engine: its first stdout line is ``{"ready": true, ...}`` (or ``{"error": ...}``
when the engine refused to start), and each job written to its stdin gets one JSON reply line. Everything
the engine prints goes to a log file. The worker scripts are run by file path, so the main environment
never imports the engine.
"""

from __future__ import annotations

import contextlib
import json
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
