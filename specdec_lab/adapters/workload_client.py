"""Asynchronous load for a server under audit: many ``/v1/completions`` requests in flight, interleaved.

:func:`run_jobs` sends a list of :class:`Job` (already interleaved across cells by the caller, so a batching
server puts different cells' requests into the same batch) with at most ``concurrency`` requests in flight
(httpx's ``AsyncClient`` over one connection pool), a timeout per request and retries with exponential
backoff for **transport errors only** (connection refused or reset, timeouts, protocol errors): the request
never reached an answer, so sending it again cannot hide anything. An HTTP error status or an unreadable
reply is an answer: it is handed back as an :class:`Outcome` with its status and text, counted by the caller
per cell and never retried (a server that fails 1% of requests under mixed traffic is a finding). A
transport failure that outlasts the retries is an outcome too (status None). After ``down_after`` such failures in
a row the server counts as down (a crashed engine: vLLM's API server exits when its engine core dies): the
jobs left are not sent, and each is handed back as a transport failure saying so, so a crash ends the run in
seconds and shows in every cell's error count instead of hours of retries.

:func:`load_loop` is the plain load loop of the throughput benchmark: the same requests, the same
concurrency, nothing done with the replies.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

import httpx
from tqdm.auto import tqdm

ROUTE = "/v1/completions"


@dataclass(frozen=True)
class ClientSettings:
    """How requests are sent.

    concurrency: requests in flight at once (the server's batch is at most this wide from this client).
    timeout: seconds per request (connect, read and write each).
    retries: tries after the first, for transport errors only; backoff: first wait in seconds, doubling.
    progress: show a progress bar.
    down_after: consecutive transport failures (each after its retries) after which the server counts as down.
    """

    concurrency: int = 8
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5
    progress: bool = True
    down_after: int = 16

    def __post_init__(self) -> None:
        if (self.concurrency < 1 or self.retries < 0 or self.timeout <= 0 or self.backoff < 0
                or self.down_after < 1):
            raise ValueError("need concurrency >= 1, retries >= 0, timeout > 0, backoff >= 0 and down_after >= 1")


@dataclass(frozen=True)
class Job:
    """One request: ``key`` names its cell, ``index`` its place in the cell, ``body`` the JSON sent."""

    key: str
    index: int
    body: dict


@dataclass(frozen=True)
class Outcome:
    """What one request came to: a reply (status 200), an HTTP error (its status and text), or a transport
    failure after every retry (status None)."""

    job: Job
    status: int | None
    reply: dict | None
    error: str | None
    attempts: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.reply is not None


async def _post(client: httpx.AsyncClient, url: str, job: Job, settings: ClientSettings) -> Outcome:
    started = time.monotonic()
    for attempt in range(settings.retries + 1):
        try:
            response = await client.post(url, json=job.body)
        except httpx.TransportError as exc:  # no answer: retry with backoff
            if attempt == settings.retries:
                return Outcome(job, None, None, f"{type(exc).__name__}: {exc}"[:500], attempt + 1,
                               time.monotonic() - started)
            await asyncio.sleep(settings.backoff * 2 ** attempt)
            continue
        if response.status_code != 200:  # an answer: a result, never retried
            return Outcome(job, response.status_code, None, response.text[:500], attempt + 1,
                           time.monotonic() - started)
        try:
            reply = response.json()
        except ValueError:
            return Outcome(job, 200, None, f"unreadable reply: {response.text[:300]}", attempt + 1,
                           time.monotonic() - started)
        return Outcome(job, 200, reply, None, attempt + 1, time.monotonic() - started)
    raise AssertionError("unreachable")


async def _run(base_url: str, jobs: list[Job], settings: ClientSettings, on_outcome: Callable[[Outcome], None],
               skip: Callable[[Job], bool]) -> None:
    url = base_url.rstrip("/") + ROUTE
    limits = httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency)
    pending = iter(jobs)  # shared by the workers: next() runs between awaits, so each job goes to one worker
    bar = tqdm(total=len(jobs), desc="requests", disable=not settings.progress, mininterval=1.0)
    failures = {"in a row": 0}  # transport failures since the last answer
    async with httpx.AsyncClient(timeout=settings.timeout, limits=limits) as client:
        async def worker() -> None:
            for job in pending:
                if not skip(job):
                    if failures["in a row"] >= settings.down_after:
                        outcome = Outcome(job, None, None, f"not sent: the server stopped answering "
                                          f"({failures['in a row']} transport failures in a row)", 0, 0.0)
                    else:
                        outcome = await _post(client, url, job, settings)
                        failures["in a row"] = failures["in a row"] + 1 if outcome.status is None else 0
                    on_outcome(outcome)
                bar.update(1)

        await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    bar.close()


def run_jobs(base_url: str, jobs: list[Job], settings: ClientSettings, on_outcome: Callable[[Outcome], None],
             skip: Callable[[Job], bool] = lambda job: False) -> None:
    """Send ``jobs`` in order with at most ``settings.concurrency`` in flight; call ``on_outcome`` for each
    answer as it arrives (in the event loop's thread), and pass over jobs for which ``skip(job)`` is true when
    their turn comes (a cell the engine refused)."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    asyncio.run(_run(base_url, jobs, settings, on_outcome, skip))


def load_loop(base_url: str, bodies: list[dict], concurrency: int, timeout: float = 60.0) -> dict:
    """The plain load loop: POST every body with ``concurrency`` in flight, keep nothing but counts.

    Returns ``{"requests", "errors", "seconds"}`` (wall time of the whole loop)."""
    counts = {"requests": 0, "errors": 0}

    async def main() -> None:
        url = base_url.rstrip("/") + ROUTE
        pending = iter(bodies)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            async def worker() -> None:
                for body in pending:
                    try:
                        response = await client.post(url, json=body)
                        counts["errors"] += response.status_code != 200
                    except httpx.TransportError:
                        counts["errors"] += 1
                    counts["requests"] += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    started = time.monotonic()
    asyncio.run(main())
    return {**counts, "seconds": time.monotonic() - started}


def get_text(base_url: str, route: str, timeout: float = 10.0) -> str:
    """GET ``route`` (e.g. ``/metrics``) as text."""
    response = httpx.get(base_url.rstrip("/") + route, timeout=timeout)
    response.raise_for_status()
    return response.text
