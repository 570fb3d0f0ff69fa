"""One workload audit against a live server: send (or resume) the requests, judge every cell; throughput."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab.adapters.endpoint import TokenMap, server_counters
from specdec_lab.adapters.workload_client import ClientSettings, Outcome, get_text, load_loop, run_jobs
from specdec_lab.laws.workload import LawBook
from specdec_lab import verdicts
from specdec_lab.suite import SuiteSettings
from specdec_lab.workload.cells import Workload
from specdec_lab.workload.judge import (CellResult, counter_drafting, final_verdicts, judge_cell, summary_line,
                                        workload_bound)
from specdec_lab.workload import promises
from specdec_lab.workload.requests import ENGINES, interleaved_jobs
from specdec_lab.workload.sequential import LookLedger, eprocess_pvalue, spent
from specdec_lab.workload.store import CellStore, cell_meta, outcome_rows
from specdec_lab.workload.two_sample import two_sample_results


@dataclass(frozen=True)
class WorkloadRun:
    """Settings of one workload audit."""

    base_url: str
    out: Path
    samples: int = 400  # per cell (choices); requests = ceil(samples / n)
    model: str = "target"
    engine: str = "llama.cpp"
    seed: int = 0
    speculative: bool = True
    client: ClientSettings = ClientSettings()
    round_requests: int = 100  # requests per cell between writes to disk
    suite: SuiteSettings = SuiteSettings(n_resamples=2000)
    server_metrics: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if self.samples < 1 or self.round_requests < 1:
            raise ValueError("need samples >= 1 and round_requests >= 1")


def collect_workload(pair, workload: Workload, run: WorkloadRun, folder: Path,
                     answered: dict[str, int] | None = None, requests: dict[str, int] | None = None,
                     whole: Workload | None = None) -> dict[str, pd.DataFrame]:
    """Send the workload's missing requests (resuming from ``folder``), write them per cell; return every cell's
    rows (one per choice, or one per failed request). ``answered``, if given, receives per cell the choices the
    server returned in *this* call (the sequences its counters saw). ``requests``: per cell, how many requests
    (numbered from 0) it should hold, instead of ``run.samples`` / n. ``whole``: the run's whole workload when
    ``workload`` is a round over some of its cells (each cell's seeds come from its place in the whole)."""
    index_of = {c.name: i for i, c in enumerate((whole or workload).cells)}
    token_map = TokenMap(pair.tokenizer, pair.vocab_size)
    cells = {c.name: c for c in workload.cells}
    stores = {c.name: CellStore(folder / "cells" / c.name, cell_meta(c, workload, run.engine, run.model, run.seed))
              for c in workload.cells}
    done = {name: store.load() for name, store in stores.items()}
    wanted = requests or {c.name: math.ceil(run.samples / c.n) for c in workload.cells}
    missing = {c.name: sorted(set(range(wanted[c.name])) - set(done[c.name]["request"].tolist()))
               for c in workload.cells}
    successes = {name: int((frame["status"] == 200).sum()) for name, frame in done.items()}
    refused = {name for name, frame in done.items()  # refused in an earlier run: not asked again
               if len(frame) and successes[name] == 0 and frame["status"].between(400, 499).all()}

    def on_outcome(outcome: Outcome) -> None:
        name = outcome.job.key
        cell = cells[name]
        rows = outcome_rows(outcome, token_map, cell.request_tokens(workload.max_tokens), cell.observes_text)
        stores[name].add(rows)
        if answered is not None:
            answered[name] = answered.get(name, 0) + sum(r["choice"] >= 0 for r in rows)
        if outcome.ok:
            successes[name] += 1
        elif outcome.status is not None and 400 <= outcome.status < 500 and successes[name] == 0:
            refused.add(name)  # the engine refuses the cell's options (a client error): stop sending them

    rounds = max((len(v) for v in missing.values()), default=0)
    for start in range(0, rounds, run.round_requests):
        chunk = {name: todo[start:start + run.round_requests] for name, todo in missing.items()}
        jobs = interleaved_jobs(workload, chunk, run.engine, run.model, run.seed, index_of)
        run_jobs(run.base_url, jobs, run.client, on_outcome, skip=lambda job: job.key in refused)
        for store in stores.values():
            store.flush()
    return {name: store.load() for name, store in stores.items()}


def read_counters(base_url: str) -> dict:
    """The server's Prometheus speculation counters (llama-server, vLLM), or {} where it has none."""
    import httpx

    try:
        return server_counters(get_text(base_url, "/metrics"))
    except (httpx.HTTPError, OSError):
        return {}


def audit_workload(pair, workload: Workload, run: WorkloadRun, *, budget: int | None = None) -> dict:
    """Run (or resume) the workload against ``run.base_url`` and judge every cell.

    Each judgement is a look (:mod:`specdec_lab.workload.sequential`): its levels are spent from α and δ so that
    resuming keeps the error rates, and the TV bounds hold simultaneously over the cells. With ``budget`` (total
    requests), cells are judged after every round of ``run.round_requests`` requests; a cell stops once rejected
    by its e-process or certified, and the undecided ones go on round-robin until the budget is spent; without it,
    ``run.samples`` per cell, judged once.

    Returns ``{"results": [CellResult], "table": DataFrame, "summary": str, "counters": dict, "seconds": float,
    "frames": {cell name: its rows}, "rows": [Verdict], "workload_bound": dict, "laws": LawBook}`` (the workload-level certificate:
    :func:`specdec_lab.workload.judge.workload_bound`).
    """
    laws = LawBook(pair, ENGINES[run.engine].order)
    for cell in workload.cells:  # refuse prompts the server would tokenize differently, before any request
        laws.prompt_ids(cell.prompt)
    before = read_counters(run.base_url) if run.server_metrics else {}
    started = time.monotonic()
    answered: dict[str, int] = {}
    ledger = LookLedger(run.out)
    rng = np.random.default_rng(run.seed)
    if budget is None:
        frames = collect_workload(pair, workload, run, run.out, answered)
        results = judge_all(workload, workload.cells, frames, laws, run, ledger, rng, sequential=False)
    else:
        frames, results = until_decided(pair, workload, run, laws, ledger, rng, budget, answered)
    seconds = time.monotonic() - started
    after = read_counters(run.base_url) if run.server_metrics else {}
    counters = {k: after[k] - before.get(k, 0.0) for k in after}
    rule = ENGINES[run.engine].counter_rule
    if run.speculative and rule is not None:
        counter_drafting(results, answered, counters, workload.max_tokens, rule)
    final_verdicts(results, run.suite)
    table = pd.DataFrame([r.row() for r in results])
    overall = workload_bound([(r.outcome_counts, r.outcome_law) for r in results
                              if r.outcome_counts is not None and r.refused is None], run.suite.confidence)
    return {"results": results, "table": table, "summary": summary_line(results), "counters": counters,
            "seconds": seconds, "frames": frames, "rows": [r.verdict_row(run.suite.tolerance) for r in results],
            "workload_bound": overall, "laws": laws}


def judge_all(workload: Workload, cells, frames: dict, laws: LawBook, run: WorkloadRun, ledger: LookLedger,
              rng: np.random.Generator, sequential: bool) -> list[CellResult]:
    """One look at each of ``cells``: δ spent per cell by its look count and split over the workload's cells, α
    spent by the largest look count (Holm's common level); ``sequential``: the anytime-valid e-process p-value at
    α / cells replaces the suite's (it needs no spending)."""
    looks = ledger.take([c.name for c in cells])
    J = len(workload.cells)
    alpha = run.suite.alpha if sequential else spent(run.suite.alpha, max(looks.values()))
    results = []
    for cell in cells:
        settings = replace(run.suite, alpha=alpha,
                           confidence=1.0 - spent(1.0 - run.suite.confidence, looks[cell.name]) / J)
        result = judge_cell(cell, frames[cell.name], laws, workload, settings, run.speculative, rng)
        result.look, result.alpha = looks[cell.name], alpha
        if sequential and result.m:  # the outcomes judge_cell found, in arrival order
            result.pvalue = min(1.0, J * eprocess_pvalue(result.outcomes, result.outcome_law))  # Bonferroni
            result.rejected_by = "the e-process" if result.pvalue < alpha else ""
            result.family_wise = True
        results.append(result)
    return results


def until_decided(pair, workload: Workload, run: WorkloadRun, laws: LawBook, ledger: LookLedger,
                  rng: np.random.Generator, budget: int, answered: dict) -> tuple[dict, list[CellResult]]:
    """Round-robin over the undecided cells (see :func:`audit_workload`), at most ``budget`` requests in all (those
    of a resumed run included); the last look's result of each cell."""
    final: dict[str, CellResult] = {}
    frames: dict = {}
    undecided = list(workload.cells)
    requests = {c.name: 0 for c in workload.cells}
    while undecided:
        used = sum(requests.values())
        step = min(run.round_requests, (budget - used) // len(undecided))
        if step < 1:
            break
        for cell in undecided:
            requests[cell.name] += step
        part = replace(workload, cells=tuple(undecided))
        frames.update(collect_workload(pair, part, run, run.out, answered,
                                       requests={c.name: requests[c.name] for c in undecided}, whole=workload))
        for cell in undecided:  # a resumed run may already hold more
            requests[cell.name] = max(requests[cell.name], int(frames[cell.name]["request"].nunique()))
        for result in judge_all(workload, list(undecided), frames, laws, run, ledger, rng, sequential=True):
            final[result.cell.name] = result
            rejected = result.pvalue < run.suite.alpha
            certified = result.tv_upper <= run.suite.tolerance
            if rejected or certified or result.refused is not None or result.errors:
                undecided.remove(result.cell)
    for cell in workload.cells:  # a budget too small for one round: judge what is on disk
        if cell.name not in final:
            frames[cell.name] = collect_workload(pair, replace(workload, cells=(cell,)), run, run.out, answered,
                                                 requests={cell.name: 0}, whole=workload)[cell.name]
            final[cell.name] = judge_all(workload, [cell], frames, laws, run, ledger, rng, sequential=True)[0]
    return frames, [final[c.name] for c in workload.cells]


def resend_seeded(pair, workload: Workload, frames: dict, run: WorkloadRun) -> dict[str, dict[str, pd.DataFrame]]:
    """Send a share of each seeded cell's answered requests again (:func:`promises.resend_jobs`), with the same
    bodies and the seeds on record: once alone (one request in flight) and once interleaved with as many unseeded requests of
    other settings at the run's concurrency. Returns ``{"alone" | "mixed": {cell: rows}}`` (rows as
    :func:`outcome_rows` writes them); nothing is written to the cells' files."""
    token_map = TokenMap(pair.tokenizer, pair.vocab_size)
    cells = {c.name: c for c in workload.cells}
    jobs = promises.resend_jobs(workload, frames, run.engine, run.model)
    filler = promises.fillers(workload, jobs, run.engine, run.model)
    mixed = [job for pair_ in zip(jobs, filler) for job in pair_]
    found: dict[str, dict[str, list]] = {}
    for mode, todo, client in (("alone", jobs, replace(run.client, concurrency=1, progress=False)),
                               ("mixed", mixed, replace(run.client, progress=False))):
        rows = found.setdefault(mode, {})

        def keep(outcome: Outcome, rows=rows) -> None:
            cell = cells.get(outcome.job.key)
            if cell is not None:
                rows.setdefault(cell.name, []).extend(outcome_rows(
                    outcome, token_map, cell.request_tokens(workload.max_tokens), cell.observes_text))
        run_jobs(run.base_url, todo, client, keep)
    return {mode: {name: pd.DataFrame(rows) for name, rows in by_cell.items()} for mode, by_cell in found.items()}


def check_promises(pair, workload: Workload, run: WorkloadRun, found: dict,
                   reference: dict | None = None) -> list[promises.Promise]:
    """The exact promises of :mod:`specdec_lab.workload.promises` for one judged run (``found``:
    :func:`audit_workload`'s result, whose exact laws are reused); resends a share of the seeded requests (≤ 7.5 %
    more requests)."""
    laws = found["laws"]
    profile = ENGINES[run.engine]
    frames = found["frames"]
    resent = resend_seeded(pair, workload, frames, run)
    checks = [promises.check_logprobs(workload, frames, laws, profile),
              promises.check_seeds(workload, frames, resent, run.suite.alpha, profile),
              promises.check_greedy(workload, frames, laws, profile)]
    if reference is not None:
        checks.append(promises.check_greedy(workload, frames, laws, profile, reference["frames"]))
    if run.speculative:
        checks.append(promises.check_acceptance(promises.acceptance_rows(workload, found["results"], laws)))
    return checks


def pairs_until_decided(pair, workload: Workload, run: WorkloadRun, reference: WorkloadRun, budget: int,
                        rng: np.random.Generator) -> pd.DataFrame:
    """Two-sample mode's sequential decisions: look 1 at ``run.samples`` per cell on both servers (the same seeds),
    then rounds of ``max(run.round_requests, run.samples / 4)`` more samples per undecided cell, until each cell is
    certified or rejected (or refused, or without samples) or the next round would pass ``budget`` requests to the
    server under audit. Each round is one look (counted in ``<out>/looks.json`` as ``two-sample``, so a resumed run
    goes on spending): its bounds and tests at the spent levels (:func:`two_sample_results`), which keeps "every
    cell's certificate holds" at the run's level however many rounds it takes. Returns the table of each cell's
    deciding (or last) look."""
    ledger = LookLedger(run.out)
    eos = pair.tokenizer.eos_token_id
    requests = {c.name: math.ceil(run.samples / c.n) for c in workload.cells}
    step = max(run.round_requests, math.ceil(run.samples / 4))
    final: dict[str, dict] = {}
    undecided = list(workload.cells)
    while undecided:
        part = replace(workload, cells=tuple(undecided))
        wanted = {c.name: requests[c.name] for c in undecided}
        frames = collect_workload(pair, part, run, run.out, requests=wanted, whole=workload)
        ref_frames = collect_workload(pair, part, reference, reference.out, requests=wanted, whole=workload)
        look = ledger.take(["two-sample"])["two-sample"]
        table = two_sample_results(workload, frames, ref_frames, run.suite, eos, rng, look=look, cells=undecided)
        for row in table.to_dict("records"):
            final[row["cell"]] = row
            if verdicts.word(row["verdict"]) not in (verdicts.INCONCLUSIVE, verdicts.NOT_EXERCISED):
                undecided = [c for c in undecided if c.name != row["cell"]]
        more = {c.name: math.ceil(step / c.n) for c in undecided}
        if sum(requests.values()) + sum(more.values()) > budget:
            break
        for name, extra in more.items():
            requests[name] += extra
    out = pd.DataFrame([final[c.name] for c in workload.cells])
    out.attrs["confidence"] = table.attrs["confidence"]
    return out


def throughput(pair, workload: Workload, run: WorkloadRun) -> dict:
    """Requests/s of the plain load loop (:func:`load_loop`: POST, nothing kept) and of the audit's collection
    (:func:`collect_workload`: the same requests, token mapping, parquet parts) at the same concurrency against the
    same server, in the order plain, audit, plain (the plain rate is the mean of the two, so a server warming up
    or slowing down does not favour either). ``run.out`` must hold no samples (the audit would resume)."""
    requests = {c.name: list(range(math.ceil(run.samples / c.n))) for c in workload.cells}
    bodies = [job.body for job in interleaved_jobs(workload, requests, run.engine, run.model, run.seed)]
    if any((run.out / "cells").glob("*/part-*.parquet")):
        raise ValueError(f"{run.out} already holds samples; the benchmark needs an empty folder")
    before = load_loop(run.base_url, bodies, run.client.concurrency, run.client.timeout)
    started = time.monotonic()
    collect_workload(pair, workload, run, run.out)
    audit_seconds = time.monotonic() - started
    after = load_loop(run.base_url, bodies, run.client.concurrency, run.client.timeout)
    plain = 2 * len(bodies) / (before["seconds"] + after["seconds"])
    audit = len(bodies) / audit_seconds
    return {"requests": len(bodies), "concurrency": run.client.concurrency, "plain requests/s": plain,
            "audit requests/s": audit, "ratio": audit / plain, "plain errors": before["errors"] + after["errors"]}
