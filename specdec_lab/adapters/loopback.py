"""Servers an audit starts on loopback (llama.cpp's, vLLM's): a free port, start-and-wait, the log, stop.

Contract: a :class:`LoopbackServer` is one process we started in a session of its own, serving at ``base_url``
(``http://127.0.0.1:<port>``), writing its output to ``log``; :func:`wait_until_up` returns it once ``route``
answers HTTP 200, and otherwise stops it and raises with the end of its log; ``stop()`` ends that process only.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LoopbackServer:
    """A running server process; ``stop()`` ends it (and only it): SIGTERM, then SIGKILL after ``stop_timeout`` s."""

    process: subprocess.Popen | None
    base_url: str
    log: Path | None = None
    argv: list[str] | None = None  # the command line it was started with, where the caller keeps it
    stop_timeout: float = 20.0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log and self.log.exists() else ""


def wait_until_up(server: LoopbackServer, route: str, startup_timeout: float, label: str,
                  error: type[Exception] = RuntimeError, poll: float = 0.2) -> LoopbackServer:
    """Poll ``route`` every ``poll`` s until it answers 200 and return ``server``; raise ``error`` (naming the server
    ``label``) with the end of its log when the process exits or ``startup_timeout`` s pass (then it is stopped)."""
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise error(f"{label} exited with {server.process.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(server.base_url + route, timeout=2) as response:
                if response.status == 200:
                    return server
        time.sleep(poll)
    server.stop()
    raise error(f"{label} did not answer within {startup_timeout:.0f} s:\n{server.log_tail()}")
