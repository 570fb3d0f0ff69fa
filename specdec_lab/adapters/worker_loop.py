"""The JSON-lines request loop of every engine worker script: standard library only.

The worker scripts (:mod:`~specdec_lab.adapters.openvino_worker`, :mod:`~specdec_lab.adapters.ortgenai_worker`,
:mod:`~specdec_lab.adapters.vllm_worker`) run in an engine's own environment, by file path and with ``-P``, where
``specdec_lab`` and its dependencies are absent and this folder is not on ``sys.path`` (its ``vllm.py`` would hide
vLLM). Each loads this file by path (:func:`runpy.run_path`) and hands its engine to :func:`serve`.

Protocol (the main environment's side is :class:`specdec_lab.adapters.worker.EngineWorker`):

- argv[1] is the engine's settings as JSON, or ``--tools`` for a worker without an engine;
- the first line on the reply channel is ``{"ready": true, ...version fields}``, or ``{"error": "..."}`` when the
  engine refused to start (exit status 2);
- then one JSON line in (a job) → one JSON line out (its reply) until stdin closes; a job ``{"tool": name, ...}`` is
  answered by ``tools[name](job)`` without the engine; a job that raises is answered ``{"error": "Type: message"}``;
- the reply channel is the stdout the process was started with; file descriptor 1 is pointed at stderr, so whatever
  the engine prints goes to the log, never into a reply.
"""

from __future__ import annotations

import json
import os
import sys


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, stripped: an engine's message as one stats key."""
    return str(exc).strip().splitlines()[0]


def described(exc: BaseException) -> str:
    """``"TypeName: message"``, the form of every ``error`` reply."""
    return f"{type(exc).__name__}: {exc}"


def reply_channel():
    """A line-buffered writer on the process's original stdout; fd 1 then points at stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return reply


def write(reply, message: dict) -> None:
    reply.write(json.dumps(message) + "\n")


def serve(start, answer, version, tools: dict | None = None, argv: list[str] | None = None) -> int:
    """Run one worker until stdin closes; returns the exit status (0, or 2 when the engine refused to start).

    ``start(engine: dict) -> held``: build the engine (raises on refusal; not called for ``--tools``);
    ``answer(held, job: dict) -> dict``: one sampling job's reply; ``version() -> dict``: the fields of the ready
    line (called after ``start``); ``tools``: name → ``job -> reply`` for tool jobs.
    """
    argv = sys.argv if argv is None else argv
    reply, tools = reply_channel(), tools or {}
    held = None
    if argv[1] != "--tools":
        try:
            held = start(json.loads(argv[1]))
        except Exception as exc:  # the engine's own refusal: the caller raises it
            write(reply, {"error": described(exc)})
            return 2
    write(reply, {"ready": True, **version()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            if "tool" in job:
                result = tools[job["tool"]](job)
            elif argv[1] == "--tools":
                result = {"error": "this worker holds no engine (started with --tools)"}
            else:
                result = answer(held, job)
        except Exception as exc:
            result = {"error": described(exc)}
        write(reply, result)
    reply.flush()
    return 0
