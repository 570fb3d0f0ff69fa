"""Promises a server makes that can be checked exactly, from the requests a workload audit sends anyway.

A cell's law is only seen through draws, so certifying it takes thousands of samples; these promises are checked
token by token against the local copy of the model, so a broken one shows in a handful of requests:

- **logprobs** — every log-probability the server returns for a sampled token at positions 1–2 equals the exact
  value under the engine's documented convention (:class:`~specdec_lab.workload.requests.EngineProfile`
  ``logprobs``; both llama-server and vLLM report the *raw* model law, before temperature, penalties and filters)
  within the profile's ``numerics`` (nats). Assumes: the server runs the same weights (the greedy-identity and cell
  checks say so), in a precision whose log-probabilities are within ``numerics`` of fp64.
- **seeds under batching** — a share (:data:`RESEND_SHARE`) of each seeded cell's requests is sent again after the
  run, once alone (one request in flight) and once beside unseeded requests with other settings; the same seed and
  settings must give the same tokens. An engine whose kernels are not batch-invariant may flip a token now and then
  (a logit moves in its last bits and crosses a sampling boundary), so the promise counts as *broken* only when the
  mismatch rate is above :data:`SEED_NUMERICS_SHARE` by a one-sided binomial test at α (and *within numerics* when
  some requests differ but not that many). Assumes the engine documents seeds as reproducible per request
  (the profile's ``seeds`` says where).
- **greedy** — each token of a T = 0 completion is an argmax of the exact model's (penalised) logits, up to a near
  tie: a token whose logit is within ``numerics`` of the largest is a *near-tie flip* (numerics), anything else a
  *real divergence* (broken). With a reference server the two servers' greedy completions are compared the same
  way at their first differing token.
- **acceptance** (a diagnostic, no exit effect: acceptance depends on the draft, not on losslessness) — where the
  server drafts token 2 with the bundled draft model and reports per request whether the draft was accepted
  (llama-server's ``timings.draft_n_accepted``), the exact expected acceptance of that draft under the cell's
  settings: Σ_x1 p(x1, d(x1)) / P(x1 is not end-of-text), d(x1) the draft's greedy proposal after the prompt and
  x1 (llama.cpp's draft takes its top candidate: common/speculative.cpp), beside the reported one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from specdec_lab import stats, verdicts
from specdec_lab.laws.structured import next_logits
from specdec_lab.laws.target import two_token_logits
from specdec_lab.laws.workload import LawBook
from specdec_lab.sampling import apply_penalties
from specdec_lab.workload.cells import Cell, Workload
from specdec_lab.workload.requests import EngineProfile

RESEND_SHARE = 0.025  # of each seeded cell's requests, sent again alone and again mixed (with as many fillers): ≤ 7.5 %
SEED_NUMERICS_SHARE = 0.01  # mismatches a batch-variant but correctly seeded engine may show (see the module docstring)


@dataclass
class Promise:
    """One promise's finding: ``status`` is a :data:`specdec_lab.verdicts.PROMISE_WORDS` word."""

    name: str
    status: str
    checked: int = 0  # tokens, requests or completions compared
    broken: int = 0  # of them, the ones that break the promise
    detail: str = ""
    example: dict = field(default_factory=dict)  # the first one that broke it

    def row(self) -> dict:
        return {"promise": self.name, "status": self.status, "checked": self.checked, "broken": self.broken,
                "detail": self.detail, "first": "; ".join(f"{k} {v}" for k, v in self.example.items())}


def answered(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame["status"] == 200) & (frame["choice"] >= 0)]


# ------------------------------------------------------------------------------------------------- logprobs


def check_logprobs(workload: Workload, frames: dict, laws: LawBook, profile: EngineProfile) -> Promise:
    """Compare every returned logprob of tokens 1–2 with the exact raw log-probability (the profile's convention)."""
    name = "logprobs"
    checked, bad, worst, example = 0, 0, 0.0, {}
    by_position, by_cell = [0, 0], {}
    for cell in workload.cells:
        if cell.observes_text or not cell.logprobs:
            continue
        good = answered(frames[cell.name])
        good = good[good["logprobs"].notna()]
        if good.empty:
            continue
        table = torch.log_softmax(laws.logits(cell.prompt), dim=-1)  # (V, 2, V): row x1, position, token
        for row in good.itertuples():
            tokens, returned = list(row.tokens if row.tokens is not None else []), list(row.logprobs)
            for position in range(min(2, len(tokens), len(returned))):
                exact = float(table[0, 0, tokens[0]] if position == 0 else table[tokens[0], 1, tokens[1]])
                gap = abs(returned[position] - exact)
                checked += 1
                worst = max(worst, gap)
                if gap > profile.numerics:
                    bad += 1
                    by_position[position] += 1
                    by_cell[cell.name] = by_cell.get(cell.name, 0) + 1
                    example = example or {"cell": cell.name, "request": row.request, "position": position + 1,
                                          "token": tokens[position], "returned": round(returned[position], 6),
                                          "exact": round(exact, 6)}
    if not checked:
        return Promise(name, verdicts.NOT_CHECKED, detail="no cell returned log-probabilities with token ids")
    cells = ", ".join(f"{name} {n}" for name, n in by_cell.items())
    detail = (f"{bad} of {checked} returned logprobs off the exact raw value by more than {profile.numerics:g} nats "
              f"(position 1: {by_position[0]}, position 2: {by_position[1]}; largest |Δ| {worst:.3g})"
              + (f"; by cell: {cells}" if cells else ""))
    return Promise(name, verdicts.BROKEN if bad else verdicts.KEPT, checked, bad, detail, example)


# -------------------------------------------------------------------------------------------------- seeds


def resend_plan(workload: Workload, frames: dict, share: float = RESEND_SHARE) -> dict[str, list[int]]:
    """Per seeded cell, the answered requests to send again: ceil(share · requests) of them, evenly spaced.

    >>> f = pd.DataFrame({"request": range(100), "choice": 0, "status": 200})
    >>> resend_plan(Workload("w", (Cell("a", "x"), Cell("b", "y", seeded=False))), {"a": f, "b": f})
    {'a': [0, 33, 66]}
    """
    plan = {}
    for cell in workload.cells:
        if not cell.seeded:
            continue
        done = sorted(answered(frames[cell.name])["request"].unique().tolist())
        if done:
            k = math.ceil(share * len(done))
            plan[cell.name] = [done[i * len(done) // k] for i in range(k)]
    return plan


def resend_jobs(workload: Workload, frames: dict, engine: str, model: str) -> list:
    """The jobs of :func:`resend_plan`'s requests, each with the seed it was first sent with (the cells' rows record
    it), interleaved cell by cell."""
    from specdec_lab.adapters.workload_client import Job
    from specdec_lab.workload.requests import request_body

    cells = {c.name: c for c in workload.cells}
    per_cell = []
    for name, requests in resend_plan(workload, frames).items():
        seeds = frames[name].drop_duplicates("request").set_index("request")["seed"]
        per_cell.append([Job(name, r, request_body(cells[name], engine, model, workload.max_tokens, int(seeds[r])))
                         for r in requests])
    longest = max((len(jobs) for jobs in per_cell), default=0)
    return [jobs[k] for k in range(longest) for jobs in per_cell if k < len(jobs)]


def fillers(workload: Workload, jobs: list, engine: str, model: str) -> list:
    """One unseeded request per job, with another cell's settings: what a resent request is batched beside."""
    from specdec_lab.adapters.workload_client import Job
    from specdec_lab.workload.requests import request_body

    cells = [c for c in workload.cells if not c.choice]
    out = []
    for i, job in enumerate(jobs):
        cell = next((c for c in cells[i % len(cells):] + cells if c.name != job.key), cells[0])
        out.append(Job("filler", i, request_body(cell, engine, model, workload.max_tokens, None)))
    return out


def seed_key(cell: Cell, row) -> tuple:
    """What must replay: the token ids (or the text for a text cell) and how the completion ended."""
    tokens = () if row["tokens"] is None else tuple(int(t) for t in row["tokens"])
    return (row["text"], row["finish"]) if cell.observes_text or not tokens else (tokens, row["finish"])


def check_seeds(workload: Workload, frames: dict, resent: dict[str, dict[str, pd.DataFrame]], alpha: float,
                profile: EngineProfile) -> Promise:
    """Compare the resent requests (``resent[mode][cell]``: rows as :func:`specdec_lab.workload.store.outcome_rows`
    writes them) with the first answers, choice by choice."""
    name = "seeds under batching"
    cells = {c.name: c for c in workload.cells}
    checked, bad, example, per_mode = 0, 0, {}, {}
    for mode, by_cell in resent.items():
        per_mode[mode] = 0
        for cell_name, again in by_cell.items():
            cell = cells[cell_name]
            first = answered(frames[cell_name]).set_index(["request", "choice"])
            for row in answered(again).to_dict("records"):
                key = (row["request"], row["choice"])
                if key not in first.index:
                    continue
                before = seed_key(cell, first.loc[key])
                after = seed_key(cell, row)
                checked += 1
                if before != after:
                    bad += 1
                    per_mode[mode] += 1
                    example = example or {"cell": cell_name, "request": row["request"], "seed": row["seed"],
                                          "resent": mode, "first answer": before, "again": after}
    if not checked:
        return Promise(name, verdicts.NOT_CHECKED, detail="no seeded request was answered twice")
    p_value = stats.binomial_tail(bad, checked, SEED_NUMERICS_SHARE) if bad else 1.0
    status = (verdicts.KEPT if not bad else verdicts.BROKEN if p_value < alpha else verdicts.WITHIN_NUMERICS)
    modes = ", ".join(f"{mode}: {n}" for mode, n in per_mode.items())
    detail = (f"{bad} of {checked} resent choices differ ({modes}); broken when the rate exceeds "
              f"{SEED_NUMERICS_SHARE:g} (binomial p = {p_value:.3g}). The engine: {profile.seeds}")
    return Promise(name, status, checked, bad, detail, example)


# ------------------------------------------------------------------------------------------------- greedy


class GreedyOracle:
    """The exact model's (penalised) logits after any context of a greedy cell, cached."""

    def __init__(self, pair, order: str) -> None:
        self.pair, self.order = pair, order
        self._cache: dict[tuple, torch.Tensor] = {}

    def logits(self, cell: Cell, prompt: list[int], generated: list[int]) -> torch.Tensor:
        key = (tuple(prompt), tuple(generated))
        if key not in self._cache:
            self._cache[key] = next_logits(self.pair, [prompt + generated])[0]  # (V,)
        chain = cell.chain(self.order)
        logits = self._cache[key]
        if chain.penalised:
            logits = apply_penalties(logits, *chain.counts(prompt, generated, self.pair.vocab_size), chain)
        return logits

    def classify(self, cell: Cell, prompt: list[int], tokens: list[int], numerics: float
                 ) -> tuple[str, int, float]:
        """("argmax" | "near tie" | "divergence", first position off the argmax (−1: none), its logit gap)."""
        kind, where, gap = "argmax", -1, 0.0
        for position, token in enumerate(tokens):
            logits = self.logits(cell, prompt, tokens[:position])
            off = float(logits.max() - logits[token])
            if off > numerics:
                return "divergence", position, off
            if off > 0 and kind == "argmax":
                kind, where, gap = "near tie", position, off
        return kind, where, gap


def check_greedy(workload: Workload, frames: dict, laws: LawBook, profile: EngineProfile,
                 reference: dict | None = None) -> Promise:
    """Every T = 0 token-cell completion against the exact argmax (and, with ``reference``, against the reference
    server's completion of the same request)."""
    name = "greedy" if reference is None else "greedy vs reference"
    oracle = GreedyOracle(laws.pair, profile.order)
    checked, counts, first = 0, {"near tie": 0, "divergence": 0}, {}
    for cell in workload.cells:
        if not cell.greedy or cell.observes_text or cell.structured:
            continue
        prompt = laws.prompt_ids(cell.prompt).tolist()
        mine = answered(frames[cell.name]).set_index(["request", "choice"])
        theirs = answered(reference[cell.name]).set_index(["request", "choice"]) if reference is not None else None
        for key, tokens in mine["tokens"].items():
            tokens = [] if tokens is None else [int(t) for t in tokens]
            if theirs is None:
                checked += 1
                kind, where, gap = oracle.classify(cell, prompt, tokens, profile.numerics)
                found = {"cell": cell.name, "request": key[0], "position": where + 1,
                         "token": tokens[where] if where >= 0 else None, "below the largest logit by": round(gap, 6)}
            elif key in theirs.index:
                other = [] if theirs.loc[key, "tokens"] is None else [int(t) for t in theirs.loc[key, "tokens"]]
                checked += 1
                kind, found = compare_greedy(oracle, cell, prompt, tokens, other, profile.numerics)
                found = {"cell": cell.name, "request": key[0], **found}
            else:
                continue
            if kind in counts:
                counts[kind] += 1
                first.setdefault(kind, found)
    if not checked:
        return Promise(name, verdicts.NOT_CHECKED, detail="no greedy token cell" +
                       (" with a reference answer" if reference is not None else ""))
    status = (verdicts.BROKEN if counts["divergence"] else verdicts.WITHIN_NUMERICS if counts["near tie"]
              else verdicts.KEPT)
    detail = (f"{counts['divergence']} real divergences and {counts['near tie']} near-tie flips (a logit within "
              f"{profile.numerics:g} of the largest) in {checked} greedy completions")
    return Promise(name, status, checked, counts["divergence"], detail, first.get("divergence", first.get("near tie", {})))


def compare_greedy(oracle: GreedyOracle, cell: Cell, prompt: list[int], tokens: list[int], other: list[int],
                   numerics: float) -> tuple[str, dict]:
    """("same" | "near tie" | "divergence", what was found) of two greedy completions of one request: at their
    first differing token, a near tie when both tokens' logits are within ``numerics`` of the largest."""
    position = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b), None)
    if position is None:
        return "same", {}
    logits = oracle.logits(cell, prompt, tokens[:position])
    off = {side: float(logits.max() - logits[t[position]]) for side, t in (("server", tokens), ("reference", other))}
    kind = "divergence" if max(off.values()) > numerics else "near tie"
    return kind, {"position": position + 1, "server": tokens[position], "reference": other[position],
                  "logit gap": round(abs(off["server"] - off["reference"]), 6),
                  "off the argmax": ", ".join(side for side, v in off.items() if v > numerics) or "neither"}


# --------------------------------------------------------------------------------------------- acceptance


def acceptance_rows(workload: Workload, results: list, laws: LawBook) -> list[dict]:
    """Per token cell whose server reported per-request drafts at token 2 (llama-server): the exact expected
    acceptance of the bundled draft's greedy proposal under the cell's settings, the reported one, and whether
    the reported one lies in the two-sided 99% binomial range of the exact (see the module docstring)."""
    pair = laws.pair
    V, eos = pair.vocab_size, pair.tokenizer.eos_token_id
    rows = []
    proposals: dict[str, np.ndarray] = {}
    for r in results:
        cell, d = r.cell, r.drafting
        if (cell.observes_text or cell.structured or d.position != 2 or d.acceptance is None or not d.share
                or "per-request" not in d.source):  # aggregate counters: the run's, and maybe not this draft's
            continue
        if cell.prompt not in proposals:
            draft_logits, _ = two_token_logits(pair, laws.prompt_ids(cell.prompt), model=pair.draft)  # (V, 2, V)
            proposals[cell.prompt] = draft_logits[:, 1].argmax(dim=-1).cpu().numpy()  # (V,) d(x1)
        joint = laws.joint(cell).reshape(V, V)
        x1 = np.arange(V) if eos is None else np.flatnonzero(np.arange(V) != eos)
        go_on = joint[x1].sum()
        exact = float(joint[x1, proposals[cell.prompt][x1]].sum() / go_on) if go_on > 0 else float("nan")
        drafted = round(d.share * r.m)
        accepted = round(d.acceptance * drafted)
        low, high = binomial_range(drafted, exact)
        rows.append({"cell": cell.name, "drafted": drafted, "reported acceptance": d.acceptance,
                     "exact acceptance": exact, "gap": d.acceptance - exact,
                     "consistent": bool(low <= accepted <= high)})
    return rows


def binomial_range(n: int, rate: float, confidence: float = 0.99) -> tuple[int, int]:
    """The two-sided ``confidence`` range of a Binomial(n, rate) count."""
    from scipy import stats as sps

    tail = (1.0 - confidence) / 2
    return int(sps.binom.ppf(tail, n, rate)), int(sps.binom.isf(tail, n, rate))


def check_acceptance(rows: list[dict]) -> Promise:
    """The acceptance diagnostic as a promise line (no exit effect)."""
    if not rows:
        return Promise("acceptance", verdicts.NOT_CHECKED, detail="no cell with per-request draft counts at token 2 "
                                                                  "from the bundled draft")
    off = [r for r in rows if not r["consistent"]]
    detail = (f"{len(rows) - len(off)} of {len(rows)} cells' reported acceptance within the 99% range of the exact "
              f"expectation; mean gap {np.mean([r['gap'] for r in rows]):+.3f}")
    first = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in off[0].items()} if off else {}
    return Promise("acceptance", verdicts.DIAGNOSTIC, len(rows), len(off), detail, first)
