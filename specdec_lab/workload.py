"""Audit a live server under production conditions: ``specdec-lab audit workload``.

A **workload** is a file (YAML or JSON) of cells: prompt × sampling settings × request options. The audit
sends every cell's requests *interleaved and concurrently* (:mod:`specdec_lab.adapters.workload_client`), so a
batching server runs different cells' requests in the same batch — T = 1, T = 0.7 and greedy rows together,
penalties beside plain rows, seeded beside unseeded, n > 1, logprobs asked and not, a stop string, long
prompts and prompts that share a long prefix — and judges each cell against the **exact** law of its own
settings, computed from the local copy of the target with :func:`specdec_lab.sampling.chain_probs` (penalties
and min-p are deterministic functions of the context, so their per-position laws are exact too), in the
engine's documented order (:data:`specdec_lab.sampling.ORDERS`).

What each cell bounds
---------------------
Every request asks for ``max_tokens`` (the workload's; 3 by default) new tokens; the verdict bounds the
**joint law of tokens 1–2** (positions 1 and 2 after the prompt; token 3 is generated but not tested): token
1 comes from the prompt's pass, token 2 is the first position an engine drafts (:mod:`specdec_lab.drafting`),
and llama-server drafts it — one draft token — exactly when ``max_tokens = 3``, which its per-request
``timings.draft_n`` reports (0 or 1), so each cell's drafted share is per request, not inferred. vLLM counts
drafts only in aggregate and drafts whatever remains: at ``max_tokens = 2`` each verification step is one sequence
drafted at token 2, and each cell gets a lower bound on its share (:func:`counter_drafting`). Token 2's
law is computed per first token x1: the penalties at position 2 count the prompt and x1 (llama.cpp: the
last ``repeat_last_n`` = 64 tokens of prompt + x1, all three penalties; vLLM: repetition over prompt + x1,
presence/frequency over x1 alone; :data:`specdec_lab.sampling.PENALTY_SCOPES`).

A **text** cell — one with a stop string, or one without logprobs (whose replies carry no token ids, and
whose text may split into tokens in several ways: dropping those would condition the law) — asks for 2 tokens
and bounds the law of what the client sees: the text of tokens 1–2, cut before the first occurrence of a stop
string (or an end-of-text token), with whether it stopped; the exact law is the push-forward of the joint law
of tokens 1–2 through that map. At 2 tokens llama-server does not draft, so a text cell tests the request path
under mixed batching, not speculation (its verdict is at best *inconclusive (drafting not exercised)*).
A **greedy** (T = 0) cell's law is a point mass: any other output is impossible (rejected), and m outputs all
equal to it bound the TV by 1 − (1 − confidence)^(1/m).

Verdicts
--------
Per cell the suite of :mod:`specdec_lab.suite` (on tokens 1–2 with the cell's exact joint law) gives a
global p-value and the TV upper bound on the joint law; across cells the p-values are adjusted by Holm at α.
A cell is **rejected** when its Holm-adjusted p-value is below α, **equivalent** when not and its TV bound is
≤ ε (and, on a speculative server, token 2 was drafted in at least half of its samples, else *inconclusive
(drafting not exercised)*), **inconclusive** otherwise; **refused by the engine** when the server answered
every request of the cell with a client error (HTTP 4xx; its message is shown), **no samples** when every request
failed (HTTP 5xx or in transport). Server errors are results: counted per cell, shown in the table, never retried
(only transport errors are retried, with backoff), and they make the command exit 1 like a rejection.

Two-sample mode (``--reference-url``): the same requests go to a second server (the same engine without
speculation); each cell compares the two servers' samples of tokens 1–2 with
:func:`specdec_lab.stats.closeness_two_sample` (Holm across cells) and bounds TV between the two laws by
TV̂ + √(ln(1/δ)(1/m₁ + 1/m₂)/2) (McDiarmid: TV̂ between the two empirical laws is ≥ TV in expectation and
moves by ≤ 1/mᵢ per sample; the two samples must be independent, so the reference run uses other seeds),
which needs no exact law and so far more samples.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from specdec_lab import __version__, stats
from specdec_lab import drafting as drafting_
from specdec_lab.adapters.endpoint import LLAMA_SERVER_NEUTRAL, TokenMap, choice_tokens, server_counters
from specdec_lab.adapters.workload_client import ClientSettings, Job, Outcome, get_text, load_loop, run_jobs
from specdec_lab.sampling import ChainConfig, SamplingConfig, chain_probs
from specdec_lab.suite import SuiteSettings, run_suite, scores_from_law, two_token_logits

DEFAULT_WORKLOAD = Path(__file__).resolve().parent / "workloads" / "default.yaml"
BOUNDED_LENGTH = 2  # tokens 1–2: the positions every verdict bounds
SEED_HIGH = 2**32 - 1  # llama.cpp seeds are uint32 (0xFFFFFFFF means "random" there)
REFUSED = "refused by the engine"
NO_SAMPLES = "no samples"
META_KEY = b"specdec_lab"


class WorkloadError(ValueError):
    """A malformed workload file; the message names the field."""


# ------------------------------------------------------------------------------------------ the file format


@dataclass(frozen=True)
class Cell:
    """One cell: a prompt, its sampling settings and its request options.

    name: unique, a file name (letters, digits, ``-``, ``_``).
    group: cells of one group run concurrently, interleaved request by request; groups run one after another.
    prompt: the prompt text (it must survive the local tokenizer's encode → decode).
    temperature, top_k (None: off), top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty:
        the sampler chain (:class:`specdec_lab.sampling.ChainConfig`).
    seeded: send a distinct ``seed`` with every request (False: no seed field, the engine's own randomness).
    n: completions per request (OpenAI's ``n``).
    logprobs: ask for logprobs (the token ids then come from them; else from the text, split unambiguously).
    stop: stop strings (the cell then bounds the text of tokens 1–2 cut at the stop, see the module docstring).
    """

    name: str
    prompt: str
    group: str = "mixed"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seeded: bool = True
    n: int = 1
    logprobs: bool = True
    stop: tuple = ()

    def chain(self, order: str) -> ChainConfig:
        return ChainConfig(SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p),
                           min_p=self.min_p, presence_penalty=self.presence_penalty,
                           frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                           order=order)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def observes_text(self) -> bool:
        """A stop string, or no logprobs (so no token ids): the cell bounds the text of tokens 1–2."""
        return bool(self.stop) or not self.logprobs

    def request_tokens(self, max_tokens: int) -> int:
        """Tokens asked per request: 2 for a text cell (its law is that of tokens 1–2), else the workload's."""
        return BOUNDED_LENGTH if self.observes_text else max_tokens

    def describe(self) -> dict:
        return {**asdict(self), "stop": list(self.stop)}

    def label(self) -> str:
        """Short text of the settings that differ from plain T = 1 sampling.

        >>> Cell("a", "x", temperature=0.7, min_p=0.1, n=4, seeded=False).label()
        'T=0.7 min-p=0.1 n=4 unseeded'
        """
        parts = [f"T={self.temperature:g}"]
        for name, value, neutral, text in (("top_k", self.top_k, None, "top-k"), ("top_p", self.top_p, 1.0, "top-p"),
                                           ("min_p", self.min_p, 0.0, "min-p"),
                                           ("presence", self.presence_penalty, 0.0, "presence"),
                                           ("frequency", self.frequency_penalty, 0.0, "frequency"),
                                           ("repetition", self.repetition_penalty, 1.0, "repetition")):
            if value != neutral:
                parts.append(f"{text}={value:g}")
        if self.n != 1:
            parts.append(f"n={self.n}")
        if not self.seeded:
            parts.append("unseeded")
        if not self.logprobs:
            parts.append("no logprobs")
        if self.stop:
            parts.append("stop=" + "|".join(json.dumps(s) for s in self.stop))
        return " ".join(parts)


@dataclass(frozen=True)
class Workload:
    """A named list of cells; ``max_tokens``: new tokens per request (3: llama-server drafts token 2)."""

    name: str
    cells: tuple
    max_tokens: int = 3

    def groups(self) -> dict[str, list[Cell]]:
        found: dict[str, list[Cell]] = {}
        for cell in self.cells:
            found.setdefault(cell.group, []).append(cell)
        return found

    def describe(self) -> dict:
        return {"name": self.name, "max_tokens": self.max_tokens, "cells": [c.describe() for c in self.cells]}


CELL_FIELDS = {f.name: f for f in fields(Cell)}
_NUMBER_RULES = {  # field -> (check, what it must be)
    "temperature": (lambda v: 0 <= v < math.inf, "a number >= 0"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "repetition_penalty": (lambda v: 0 < v <= 10, "a number in (0, 10]"),
}


def _check_cell(raw, where: str) -> Cell:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: must be a mapping of fields, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(CELL_FIELDS))
    if unknown:
        raise WorkloadError(f"{where}.{unknown[0]}: unknown field; valid: {', '.join(CELL_FIELDS)}")
    for required in ("name", "prompt"):
        if not isinstance(raw.get(required), str) or not raw[required]:
            raise WorkloadError(f"{where}.{required}: required, a non-empty string")
    name = raw["name"]
    if not all(ch.isalnum() or ch in "-_" for ch in name):
        raise WorkloadError(f"{where}.name: {name!r} must use only letters, digits, '-' and '_' (it names a file)")
    values = dict(raw)
    for key, (check, what) in _NUMBER_RULES.items():
        if key in values:
            v = values[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not check(v):
                raise WorkloadError(f"{where}.{key}: must be {what}, got {v!r}")
            values[key] = float(v)
    if "top_k" in values and values["top_k"] is not None:
        v = values["top_k"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise WorkloadError(f"{where}.top_k: must be an integer >= 1 (0 or null: off), got {v!r}")
        values["top_k"] = v or None
    for key in ("seeded", "logprobs"):
        if key in values and not isinstance(values[key], bool):
            raise WorkloadError(f"{where}.{key}: must be true or false, got {values[key]!r}")
    n = values.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise WorkloadError(f"{where}.n: must be an integer in [1, 64], got {n!r}")
    if "group" in values and (not isinstance(values["group"], str) or not values["group"]):
        raise WorkloadError(f"{where}.group: must be a non-empty string, got {values['group']!r}")
    if "stop" in values:
        stop = values["stop"]
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise WorkloadError(f"{where}.stop: must be a non-empty string or a list of at most 4, "
                                f"got {values['stop']!r}")
        values["stop"] = tuple(stop)
    return Cell(**values)


def parse_workload(raw, source: str = "workload") -> Workload:
    """A validated :class:`Workload` from plain data (a parsed YAML/JSON document)."""
    if not isinstance(raw, dict):
        raise WorkloadError(f"{source}: the top level must be a mapping with 'cells', got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"name", "cells", "max_tokens"})
    if unknown:
        raise WorkloadError(f"{source}: {unknown[0]}: unknown field; valid: name, cells, max_tokens")
    cells = raw.get("cells")
    if not isinstance(cells, list) or not cells:
        raise WorkloadError(f"{source}: cells: required, a non-empty list of cells")
    max_tokens = raw.get("max_tokens", 3)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 2 <= max_tokens <= 16:
        raise WorkloadError(f"{source}: max_tokens: must be an integer in [2, 16], got {max_tokens!r}")
    checked = tuple(_check_cell(c, f"cells[{i}]") for i, c in enumerate(cells))
    seen = set()
    for i, cell in enumerate(checked):
        if cell.name in seen:
            raise WorkloadError(f"cells[{i}].name: {cell.name!r} is used twice")
        seen.add(cell.name)
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise WorkloadError(f"{source}: name: must be a string, got {name!r}")
    return Workload(name, checked, max_tokens)


def load_workload(path: str | Path | None = None) -> Workload:
    """Read and validate a workload file (``.yaml``/``.yml`` or ``.json``); None: the bundled default."""
    path = Path(path) if path is not None else DEFAULT_WORKLOAD
    if not path.exists():
        raise WorkloadError(f"{path}: no such workload file")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise WorkloadError(f"{path}: a workload is a .yaml, .yml or .json file")
    except (ValueError, ImportError) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    except Exception as exc:  # yaml.YAMLError
        raise WorkloadError(f"{path}: not valid YAML: {exc}") from exc
    return parse_workload(raw, str(path))


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class EngineProfile:
    """How an engine names the request fields, which neutral values it needs, its sampler order, and where its
    drafts are counted: per request in the reply (``counter_rule`` None: llama-server's ``timings.draft_n``) or
    only in its aggregate Prometheus counters (``counter_rule``: a :data:`specdec_lab.drafting.COUNTER_RULES` key)."""

    order: str
    neutral: tuple
    fields: dict  # our field -> the engine's request field
    counter_rule: str | None = None


ENGINES = {
    # llama.cpp's llama-server (tools/server/server-schema.cpp), and our own batch server, which speaks the same
    "llama.cpp": EngineProfile("llama.cpp", LLAMA_SERVER_NEUTRAL + (("repeat_last_n", 64),),
                               {"repetition_penalty": "repeat_penalty", "n": "n"}),
    # vLLM's OpenAI server (entrypoints/openai/completion/protocol.py at 0.32): top_k, min_p and
    # repetition_penalty are its extra sampling fields; return_token_ids puts the ids in each choice
    "vllm": EngineProfile("vllm", (("return_token_ids", True),),
                          {"repetition_penalty": "repetition_penalty", "n": "n"}, counter_rule="uncapped"),
}


def request_body(cell: Cell, engine: str, model: str, max_tokens: int, seed: int | None) -> dict:
    """The JSON body of one of ``cell``'s requests.

    >>> body = request_body(Cell("a", "Hi", top_k=5, repetition_penalty=1.2, stop=("\\n",)), "llama.cpp", "m", 3, 7)
    >>> body["top_k"], body["repeat_penalty"], body["seed"], body["stop"], body["min_p"]
    (5, 1.2, 7, ['\\n'], 0.0)
    """
    profile = ENGINES[engine]
    max_tokens = cell.request_tokens(max_tokens)
    body = {**dict(profile.neutral), "model": model, "prompt": cell.prompt, "max_tokens": max_tokens,
            "temperature": cell.temperature, "top_p": cell.top_p, "top_k": cell.top_k or 0, "min_p": cell.min_p,
            "presence_penalty": cell.presence_penalty, "frequency_penalty": cell.frequency_penalty,
            profile.fields["repetition_penalty"]: cell.repetition_penalty, profile.fields["n"]: cell.n,
            "stream": False}
    if seed is not None:
        body["seed"] = seed
    if cell.logprobs:
        body["logprobs"] = 1
    if cell.stop:
        body["stop"] = list(cell.stop)
    return body


def request_seed(run_seed: int, cell_index: int, request: int) -> int:
    """Distinct uint32 seeds: one block of 2^24 per cell (distinct across cells and requests of one run; runs of
    other ``run_seed`` start their blocks elsewhere).

    >>> request_seed(0, 0, 5), request_seed(0, 1, 0) - request_seed(0, 0, 0)
    (5, 16777216)
    """
    return (run_seed * 4093 * 2**24 + cell_index * 2**24 + request) % SEED_HIGH


def interleaved_jobs(workload: Workload, requests: dict[str, list[int]], engine: str, model: str,
                     run_seed: int) -> list[Job]:
    """The jobs of every cell, group by group, interleaved request by request within a group."""
    jobs = []
    index_of = {c.name: i for i, c in enumerate(workload.cells)}
    for cells in workload.groups().values():
        longest = max((len(requests[c.name]) for c in cells), default=0)
        for k in range(longest):
            for cell in cells:
                if k < len(requests[cell.name]):
                    r = requests[cell.name][k]
                    # seeds spaced by n: llama-server (server-task.h add_child) and vLLM seed a request's choice k
                    # with seed + k, so consecutive seeds would make request r's choice k request r + k's choice 0
                    seed = request_seed(run_seed, index_of[cell.name], r * cell.n) if cell.seeded else None
                    jobs.append(Job(cell.name, r, request_body(cell, engine, model, workload.max_tokens, seed)))
    return jobs


# ------------------------------------------------------------------------------------------ samples on disk

SCHEMA = pa.schema([("request", pa.int64()), ("choice", pa.int64()), ("seed", pa.int64()), ("status", pa.int64()),
                    ("error", pa.string()), ("tokens", pa.list_(pa.int64())), ("text", pa.string()),
                    ("finish", pa.string()), ("draft_n", pa.int64()), ("draft_accepted", pa.int64()),
                    ("attempts", pa.int64())])


def cell_meta(cell: Cell, workload: Workload, engine: str, model: str, run_seed: int) -> dict:
    return {"cell": cell.describe(), "workload": workload.name, "max_tokens": workload.max_tokens,
            "request_tokens": cell.request_tokens(workload.max_tokens), "engine": engine, "model": model,
            "seed": run_seed, "specdec_lab": __version__}


def _same_settings(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("cell", "max_tokens", "request_tokens", "engine", "model", "seed"))


class CellStore:
    """A cell's samples: part files ``<out>/cells/<name>/part-NNNNN.parquet``, each with the cell's settings in its
    schema metadata; a re-run reads them and sends only the requests not yet answered."""

    def __init__(self, folder: Path, meta: dict) -> None:
        self.folder, self.meta = folder, meta
        self.rows: list[dict] = []

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def load(self) -> pd.DataFrame:
        tables = []
        for part in self.parts():
            table = pq.read_table(part)
            found = json.loads(table.schema.metadata[META_KEY])
            if not _same_settings(found, self.meta):
                raise ValueError(f"{part} holds samples of other settings ({found['cell']}); use another --out")
            tables.append(table)
        if not tables:
            return SCHEMA.empty_table().to_pandas()
        return pa.concat_tables(tables).to_pandas()

    def add(self, rows: list[dict]) -> None:
        self.rows.extend(rows)

    def flush(self) -> None:
        if not self.rows:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self.rows, schema=SCHEMA)
        table = table.replace_schema_metadata({META_KEY: json.dumps(self.meta).encode()})
        path = self.folder / f"part-{len(self.parts()):05d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        self.rows = []


def outcome_rows(outcome: Outcome, token_map: TokenMap, length: int, text_only: bool = False) -> list[dict]:
    """The rows of one answered request: one per choice (token ids unless ``text_only``), or one error row."""
    job = outcome.job
    base = {"request": job.index, "seed": job.body.get("seed", -1), "attempts": outcome.attempts,
            "draft_n": -1, "draft_accepted": -1}
    if not outcome.ok:
        return [{**base, "choice": -1, "status": -1 if outcome.status is None else outcome.status,
                 "error": outcome.error, "tokens": [], "text": "", "finish": ""}]
    reply = outcome.reply
    timings = reply.get("timings") or {}
    if reply.get("choices") is None or len(reply["choices"]) == 0:
        return [{**base, "choice": -1, "status": 200, "error": f"a reply without choices: {str(reply)[:300]}",
                 "tokens": [], "text": "", "finish": ""}]
    if len(reply["choices"]) == 1 and timings.get("predicted_n") is not None:  # llama-server: draft_n only when > 0
        base["draft_n"] = int(timings.get("draft_n", 0))
        base["draft_accepted"] = int(timings.get("draft_n_accepted", 0))
    rows = []
    for position, choice in enumerate(reply["choices"]):
        ids = None if text_only else choice_tokens(choice, token_map, length)
        rows.append({**base, "choice": int(choice.get("index", position)), "status": 200, "error": None,
                     "tokens": [] if ids is None else ids, "text": choice.get("text", ""),
                     "finish": choice.get("finish_reason") or ""})
    return rows


# ------------------------------------------------------------------------------------------ exact laws


class LawBook:
    """Exact laws of the cells: the target's logits after each prompt are computed once (V + 1 chains) and shared
    by the cells that use the prompt."""

    def __init__(self, pair, order: str) -> None:
        self.pair, self.order = pair, order
        self._logits: dict[str, torch.Tensor] = {}
        self.texts = [pair.decode([i]) for i in range(pair.vocab_size)]

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        ids = self.pair.encode(prompt)
        if self.pair.encode(self.pair.decode(ids.tolist())).tolist() != ids.tolist():
            raise ValueError(f"prompt {prompt[:40]!r}... does not survive decode → encode; the server would see "
                             "other tokens")
        return ids

    def logits(self, prompt: str) -> torch.Tensor:
        if prompt not in self._logits:
            logits, _ = two_token_logits(self.pair, self.prompt_ids(prompt))
            self._logits[prompt] = logits.cpu()  # (V, 2, V)
        return self._logits[prompt]

    def joint(self, cell: Cell) -> np.ndarray:
        """The exact joint law (V * V,) of tokens 1–2 under ``cell``'s sampler chain, cell x1 * V + x2."""
        V = self.pair.vocab_size
        chain = cell.chain(self.order)
        prompt = self.prompt_ids(cell.prompt).tolist()
        logits = self.logits(cell.prompt)
        first = chain_probs(logits[0, 0], chain, *chain.counts(prompt, [], V))  # (V,)
        if chain.penalised:  # position 2 counts the prompt and x1, for each x1
            counts = [chain.counts(prompt, [x1], V) for x1 in range(V)]
            context = torch.stack([c for c, _ in counts])  # (V, V)
            output = torch.stack([o for _, o in counts])  # (V, V)
            cond = chain_probs(logits[:, 1], chain, context, output)
        else:
            cond = chain_probs(logits[:, 1], chain)  # (V, V) row x1
        return (first[:, None] * cond).reshape(-1).numpy()

    def stop_outcomes(self, cell: Cell) -> tuple[dict, np.ndarray]:
        """The client-visible outcomes of a text cell (text of tokens 1–2 cut before the first stop string, if any,
        or an end-of-text token, and whether it stopped) → index, and their exact law (push-forward of
        :meth:`joint`)."""
        V, eos = self.pair.vocab_size, self.pair.tokenizer.eos_token_id
        joint = self.joint(cell)
        index: dict = {}
        law: list[float] = []
        for cell_id in np.flatnonzero(joint > 0):
            x1, x2 = divmod(int(cell_id), V)
            key = stop_outcome([x1, x2], self.texts, cell.stop, eos)
            if key not in index:
                index[key] = len(law)
                law.append(0.0)
            law[index[key]] += float(joint[cell_id])
        return index, np.array(law)


def stop_outcome(tokens: list[int], texts: list[str], stop: tuple, eos: int | None) -> tuple[str, bool]:
    """(text shown, stopped) of generated tokens under stop strings: the text up to the first stop string or
    end-of-text token.

    >>> stop_outcome([0, 1], ["a,", "b"], (",",), None), stop_outcome([1, 2], ["a", "b", "c"], (",",), 2)
    (('a', True), ('b', True))
    """
    text = ""
    for token in tokens:
        if eos is not None and token == eos:
            return text, True
        text += texts[token]
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return text[: min(hits)], True
    return text, False


# ------------------------------------------------------------------------------------------ verdicts


@dataclass
class CellResult:
    """One cell's evidence and verdict."""

    cell: Cell
    requests: int
    errors: int
    error_example: str
    refused: str | None
    m: int
    ended_early: int
    unmapped: int
    pvalue: float = float("nan")
    tv_upper: float = float("nan")
    tv_plugin: float = float("nan")
    rejected_by: str = ""
    drafting: drafting_.Drafting = field(default_factory=lambda: drafting_.Drafting(False))
    holm_p: float = float("nan")
    verdict: str = ""

    def row(self) -> dict:
        d = self.drafting.columns()
        return {"cell": self.cell.name, "group": self.cell.group, "settings": self.cell.label(),
                "bounded": "text of 1–2" if self.cell.observes_text else "tokens 1–2 (joint)",
                "requests": self.requests, "errors": self.errors, "m": self.m,
                "dropped": self.ended_early + self.unmapped, "TV upper 99%": self.tv_upper,
                "Holm p": self.holm_p, "drafted share": d["drafted share"], "acceptance": d["acceptance"],
                "verdict": self.verdict}


def judge_categorical(counts: np.ndarray, law: np.ndarray, settings: SuiteSettings,
                      rng: np.random.Generator) -> tuple[float, float, float, str]:
    """(p-value, TV upper bound, TV plug-in, rejecting test) of counts over outcomes against their exact law."""
    m = int(counts.sum())
    impossible = int(counts[law <= 0].sum())
    plugin = 0.5 * float(np.abs(counts / m - law).sum())
    if impossible:
        return 0.0, 1.0, plugin, f"{impossible} outcome(s) of probability 0"
    if int((law > 0).sum()) == 1:  # a point mass: m hits of it bound TV by Clopper–Pearson
        return 1.0, 1.0 - (1.0 - settings.confidence) ** (1.0 / m), 0.0, ""
    tests = {"ADK": stats.adk_identity(counts, law, n_resamples=settings.n_resamples, rng=rng).pvalue,
             "G": stats.chisquare_identity(counts, law, statistic="g", rng=rng).pvalue}
    holm = stats.holm(list(tests.values()), settings.alpha)
    bound = stats.tv_upper_bound(counts, law, confidence=settings.confidence)
    worst = min(tests, key=tests.get)
    return holm.pvalue, bound.upper, plugin, worst if holm.pvalue < settings.alpha else ""


def cell_drafting(frame: pd.DataFrame, m: int, max_tokens: int, speculative: bool) -> drafting_.Drafting:
    """Where the server drafted within tokens 1–2, from its per-request ``timings.draft_n`` (llama-server): with
    ``max_tokens = 3`` a request drafts at most one token, for position 2 (``get_n_draft_max``); with 2 none."""
    if not speculative:
        return drafting_.Drafting(False)
    good = frame[(frame["status"] == 200) & (frame["choice"] >= 0)]
    known = good[good["draft_n"] >= 0]
    source = "llama-server's per-request timings.draft_n"
    if len(known) == 0 or len(known) < len(good) or max_tokens > 3:
        return drafting_.Drafting(True, source=source, reason="no per-request draft counts (or max_tokens > 3)")
    stats_ = {"drafted@1": 0, "drafted@2": int((known["draft_n"] >= 1).sum()),
              "accepted@2": int((known["draft_accepted"] >= 1).sum()), "sequences": len(known)}
    return drafting_.drafting_evidence(stats_, m, True, source)


def counter_drafting(results: list[CellResult], answered: dict[str, int], counters: dict, max_tokens: int,
                     rule: str) -> None:
    """Each cell's drafted share at token 2 from the server's *aggregate* counters (vLLM), where they attribute.

    At ``max_tokens`` within the rule's exact window (``uncapped``, vLLM: 2) every sequence has one step after its
    prompt's pass, and each verification step is one sequence whose token 2 was drafted
    (:func:`specdec_lab.drafting.position_two_from_counters`). The counters do not say which cell a step belonged
    to, so each cell gets a **lower bound**: every sequence of the run that was not drafted is charged to it,
    share ≥ 1 − (sequences − drafted) / (the cell's sequences). The acceptance is the run's. Outside the window,
    or with no counters, the cells keep "not attributable" and cannot be equivalent.

    >>> r = [CellResult(Cell("a", "x"), 10, 0, "", None, 10, 0, 0), CellResult(Cell("b", "y"), 30, 0, "", None, 30, 0, 0)]
    >>> counter_drafting(r, {"a": 10, "b": 30}, {"verify_steps": 38, "accepted_first": 19}, 2, "uncapped")
    >>> [(d.drafting.share, d.drafting.acceptance) for d in r]
    [(0.8, 0.5), (0.9333333333333333, 0.5)]
    """
    found = drafting_.position_two_from_counters(counters, max_tokens, rule) if counters else {}
    sequences = sum(answered.values())
    if not found or not sequences or found["drafted@2"] > sequences:  # > : other traffic, or the rule does not hold
        reason = (drafting_.UNATTRIBUTED if not found or not sequences else
                  f"the counters saw {found['drafted@2']} verification steps for {sequences} sequences: not this run's")
        for r in results:
            r.drafting = drafting_.Drafting(True, source="the server's aggregate counters", reason=reason)
        return
    drafted = found["drafted@2"]
    undrafted = sequences - drafted
    acceptance = found["accepted@2"] / drafted if drafted else None
    source = (f"the server's spec_decode counters over the run ({drafted} of {sequences} sequences drafted at "
              "token 2), a lower bound per cell")
    for r in results:
        own = answered.get(r.cell.name, 0)
        if own:
            r.drafting = drafting_.Drafting(True, drafting_.BOUNDED, 2, max(0, own - undrafted) / own, acceptance,
                                            source)


def judge_cell(cell: Cell, frame: pd.DataFrame, laws: LawBook, workload: Workload, settings: SuiteSettings,
               speculative: bool, rng: np.random.Generator) -> CellResult:
    """The evidence of one cell (before the Holm step across cells)."""
    answered = frame[frame["status"] == 200]
    failed = frame[frame["status"] != 200]
    requests = int(frame["request"].nunique())
    errors = int(failed["request"].nunique())
    example = "" if failed.empty else f"HTTP {failed['status'].iloc[0]}: {failed['error'].iloc[0]}"[:300]
    # refused: every request answered with a client error (4xx: the engine refuses an option); a 5xx is the server failing
    refused = (example if requests and errors == requests and failed["status"].between(400, 499).all() else None)
    good = answered[answered["choice"] >= 0]
    if cell.observes_text:
        index, law = laws.stop_outcomes(cell)
        keys = [(t, f == "stop") for t, f in zip(good["text"], good["finish"])]
        unknown = sum(k not in index for k in keys)
        counts = np.bincount([index[k] for k in keys if k in index], minlength=len(law))
        counts = np.concatenate([counts, [unknown]])
        law = np.concatenate([law, [0.0]])  # an outcome the exact law cannot produce
        result = CellResult(cell, requests, errors, example, refused, len(keys), 0, 0)
        if len(keys):
            result.pvalue, result.tv_upper, result.tv_plugin, result.rejected_by = judge_categorical(
                counts, law, settings, rng)
    else:
        lengths = good["tokens"].map(len)
        full = good[lengths >= BOUNDED_LENGTH]
        ended = int(((lengths < BOUNDED_LENGTH) & (good["finish"] == "stop")).sum())
        unmapped = int(len(good) - len(full) - ended)
        tokens = np.array([t[:BOUNDED_LENGTH] for t in full["tokens"]], dtype=np.int64).reshape(-1, BOUNDED_LENGTH)
        result = CellResult(cell, requests, errors, example, refused, len(tokens), ended, unmapped)
        if len(tokens):
            joint = laws.joint(cell)
            V = laws.pair.vocab_size
            if cell.greedy:
                counts = np.bincount(tokens[:, 0] * V + tokens[:, 1], minlength=V * V)
                result.pvalue, result.tv_upper, result.tv_plugin, result.rejected_by = judge_categorical(
                    counts, joint, settings, rng)
            else:
                suite = run_suite(cell.name, tokens, scores_from_law(tokens, joint, settings.min_prefix_count),
                                  settings, rng)
                result.pvalue, result.tv_plugin = suite.global_pvalue, suite.joint_tv_plugin
                result.tv_upper = suite.joint_bound.upper
                result.rejected_by = ", ".join(suite.rejected_by)
    result.drafting = cell_drafting(frame, result.m, cell.request_tokens(workload.max_tokens), speculative)
    return result


def final_verdicts(results: list[CellResult], settings: SuiteSettings) -> None:
    """Holm across the cells with samples, then each cell's verdict (see the module docstring)."""
    judged = [r for r in results if r.refused is None and r.m > 0]
    if judged:
        holm = stats.holm([r.pvalue for r in judged], settings.alpha)
        for r, adjusted in zip(judged, holm.adjusted):
            r.holm_p = float(adjusted)
    for r in results:
        if r.refused is not None:
            r.verdict = f"{REFUSED}: {r.refused}"
        elif r.m == 0:
            r.verdict = NO_SAMPLES
        elif r.holm_p < settings.alpha:
            r.verdict = "rejected"
        elif r.tv_upper <= settings.tolerance:
            r.verdict = drafting_.engine_verdict("equivalent", r.drafting)
        else:
            r.verdict = "inconclusive"


def summary_line(results: list[CellResult]) -> str:
    verdicts = [r.verdict for r in results]
    count = {name: sum(v.startswith(name) for v in verdicts)
             for name in ("rejected", "inconclusive", "equivalent", REFUSED, NO_SAMPLES)}
    errors = sum(r.errors for r in results)
    requests = sum(r.requests for r in results)
    return (f"{len(results)} cells: {count['rejected']} rejected, {count['inconclusive']} inconclusive, "
            f"{count['equivalent']} equivalent, {count[REFUSED]} refused by the engine, {count[NO_SAMPLES]} without "
            f"samples; {errors} of {requests} requests failed")


# ------------------------------------------------------------------------------------------ the run


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
                     answered: dict[str, int] | None = None) -> dict[str, pd.DataFrame]:
    """Send the workload's missing requests (resuming from ``folder``), write them per cell; return every cell's
    rows (one per choice, or one per failed request). ``answered``, if given, receives per cell the choices the
    server returned in *this* call (the sequences its counters saw)."""
    token_map = TokenMap(pair.tokenizer, pair.vocab_size)
    cells = {c.name: c for c in workload.cells}
    stores = {c.name: CellStore(folder / "cells" / c.name, cell_meta(c, workload, run.engine, run.model, run.seed))
              for c in workload.cells}
    done = {name: store.load() for name, store in stores.items()}
    wanted = {c.name: math.ceil(run.samples / c.n) for c in workload.cells}
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
        jobs = interleaved_jobs(workload, chunk, run.engine, run.model, run.seed)
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


def audit_workload(pair, workload: Workload, run: WorkloadRun) -> dict:
    """Run (or resume) the workload against ``run.base_url`` and judge every cell.

    Returns ``{"results": [CellResult], "table": DataFrame, "summary": str, "counters": dict, "seconds": float,
    "frames": {cell name: its rows}}``.
    """
    laws = LawBook(pair, ENGINES[run.engine].order)
    for cell in workload.cells:  # refuse prompts the server would tokenize differently, before any request
        laws.prompt_ids(cell.prompt)
    before = read_counters(run.base_url) if run.server_metrics else {}
    started = time.monotonic()
    answered: dict[str, int] = {}
    frames = collect_workload(pair, workload, run, run.out, answered)
    seconds = time.monotonic() - started
    after = read_counters(run.base_url) if run.server_metrics else {}
    counters = {k: after[k] - before.get(k, 0.0) for k in after}
    rng = np.random.default_rng(run.seed)
    results = [judge_cell(c, frames[c.name], laws, workload, run.suite, run.speculative, rng) for c in workload.cells]
    rule = ENGINES[run.engine].counter_rule
    if run.speculative and rule is not None:
        counter_drafting(results, answered, counters, workload.max_tokens, rule)
    final_verdicts(results, run.suite)
    table = pd.DataFrame([r.row() for r in results])
    return {"results": results, "table": table, "summary": summary_line(results), "counters": counters,
            "seconds": seconds, "frames": frames}


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


# ------------------------------------------------------------------------------------------ two-sample mode


def two_sample_results(workload: Workload, frames: dict, reference: dict, settings: SuiteSettings,
                       vocab_size: int, rng: np.random.Generator) -> pd.DataFrame:
    """Per cell: the two servers' samples of tokens 1–2 (or stop outcomes) compared without an exact law —
    :func:`stats.closeness_two_sample` (Holm across cells) and the McDiarmid bound on TV between the two laws."""
    rows = []
    for cell in workload.cells:
        keys = []
        for frame in (frames[cell.name], reference[cell.name]):
            good = frame[(frame["status"] == 200) & (frame["choice"] >= 0)]
            if cell.observes_text:
                keys.append([f"{t}\x00{f == 'stop'}" for t, f in zip(good["text"], good["finish"])])
            else:
                keys.append([tuple(t[:BOUNDED_LENGTH]) for t in good["tokens"] if len(t) >= BOUNDED_LENGTH])
        index = {k: i for i, k in enumerate(dict.fromkeys(keys[0] + keys[1]))}
        a, b = (np.bincount([index[k] for k in ks], minlength=len(index)) for ks in keys)
        row = {"cell": cell.name, "settings": cell.label(), "m": int(a.sum()), "m reference": int(b.sum())}
        if a.sum() and b.sum():
            test = stats.closeness_two_sample(a, b, n_resamples=settings.n_resamples, rng=rng)
            plugin = 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())
            upper = float(stats.two_sample_tv_upper(a, b, settings.confidence))
            row.update({"closeness p": test.pvalue, "TV plug-in": plugin, "TV upper 99%": upper})
        rows.append(row)
    table = pd.DataFrame(rows)
    if "closeness p" in table:
        judged = table["closeness p"].notna()
        table.loc[judged, "Holm p"] = stats.holm(table.loc[judged, "closeness p"].tolist(), settings.alpha).adjusted
        table["verdict"] = [
            NO_SAMPLES if pd.isna(r.get("Holm p")) else "rejected" if r["Holm p"] < settings.alpha
            else "equivalent" if r["TV upper 99%"] <= settings.tolerance else "inconclusive"
            for _, r in table.iterrows()]
    return table


# ------------------------------------------------------------------------------------------ command line

BUNDLED = {  # --serve-bundled ENGINE -> (llama-server model alias, its reference without speculation)
    "llama-server": ("target-draft", "target-nodraft"),
    "llama-server-nodraft": ("target-nodraft", "target-nodraft"),  # the same server without speculation
}
# --serve-bundled vllm-METHOD: `vllm serve` of the bundled target with one of vLLM's methods (K = 4; "none": without
# speculation, the confirmation run and the two-sample reference)
VLLM_BUNDLED = ("none", "draft_model", "ngram", "eagle", "eagle3", "medusa")
VLLM_MAX_TOKENS = 2  # vLLM's counters attribute drafts to token 2 exactly at 2 new tokens (drafting.COUNTER_RULES)
SERVE_PARALLEL = 4  # llama-server slots (-np): continuous batching of four sequences
SERVE_BATCH = 128  # llama-server's prefill chunk (-b/-ub); the default workload's long prompts exceed it


def add_workload_parser(kinds) -> None:
    """``specdec-lab audit workload``."""
    from specdec_lab.models import add_pair_arguments

    w = kinds.add_parser("workload", help="a live server under production traffic: mixed concurrent cells, "
                                          "per-cell verdicts (specdec_lab/workload.py)")
    where = w.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server under audit, e.g. http://127.0.0.1:8080")
    where.add_argument("--serve-bundled", choices=sorted(BUNDLED) + [f"vllm-{m}" for m in VLLM_BUNDLED],
                       help=f"start it on loopback: llama-server with the bundled draft (K=4), -np {SERVE_PARALLEL}, "
                            f"-b/-ub {SERVE_BATCH} (`make llama-cpp` builds it); llama-server-nodraft: the same "
                            "without speculation (the confirmation run); vllm-METHOD: `vllm serve` (`make vllm`) "
                            "with that speculative method, K=4 (vllm-none: without speculation)")
    w.add_argument("--reference-url", default=None,
                   help="two-sample mode: the same engine without speculation ('bundled' with --serve-bundled: "
                        "start it); each cell compares the two servers' samples")
    w.add_argument("--workload", type=Path, default=None, help=f"YAML/JSON workload (default: {DEFAULT_WORKLOAD.name}, "
                                                              "bundled)")
    w.add_argument("--samples", type=int, default=400, help="samples per cell (choices)")
    w.add_argument("--max-tokens", type=int, default=None,
                   help=f"new tokens per request, overriding the workload's (default with --serve-bundled vllm-*: "
                        f"{VLLM_MAX_TOKENS}, where vLLM's counters attribute drafts to token 2)")
    w.add_argument("--exclude-cell", action="append", default=[], metavar="NAME",
                   help="leave this cell of the workload out (repeatable): e.g. one whose requests crash the engine, "
                        "once that crash is on record, so the other cells get verdicts")
    w.add_argument("--patch", default=None, choices=["vllm-cpu-expand"],
                   help="with --serve-bundled vllm-*: an opt-in fix of ours applied in the server's processes "
                        "(specdec_lab/patches; the installed files stay as they are)")
    w.add_argument("--out", type=Path, default=None,
                   help="folder of the per-cell parquet files (resumes); required unless --plan")
    w.add_argument("--model", default=None, help="the request's model field (default: the served alias, or target)")
    w.add_argument("--engine", default=None, choices=sorted(ENGINES),
                   help="request dialect and sampler order of the server (the exact law follows its order; default "
                        "llama.cpp, vllm with --serve-bundled vllm-*)")
    w.add_argument("--speculative", choices=["yes", "no", "unknown"], default="unknown",
                   help="does the server speculate? 'no': no drafting required for 'equivalent' (--serve-bundled "
                        "sets it)")
    w.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    w.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    w.add_argument("--retries", type=int, default=3, help="retries of transport errors (never of HTTP errors)")
    w.add_argument("--tolerance", type=float, default=0.02, help="ε: a cell is equivalent when its TV bound is <= ε")
    w.add_argument("--alpha", type=float, default=0.01, help="level of the Holm step across cells")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--plan", action="store_true",
                   help="print each cell's planned m (the samples at which a correct server's bound reaches ε with "
                        "probability 0.999) and exit")
    w.add_argument("--bench", action="store_true",
                   help="throughput only: the audit's requests/s against a plain load loop's (same requests, same "
                        "concurrency, same server; order plain, audit, plain); no verdicts")
    w.add_argument("--quiet", action="store_true")
    add_pair_arguments(w)
    w.set_defaults(func=cmd_workload)


def plan_cells(laws: LawBook, workload: Workload, tolerance: float, seed: int = 0) -> pd.DataFrame:
    """Per cell: m at which a correct server's TV bound is <= ``tolerance`` with probability 0.999
    (:func:`stats.plan_bound_by_simulation` on the cell's exact law; greedy cells: the Clopper–Pearson m), and what
    two-sample mode needs from *each* of its two servers for the same (:func:`stats.plan_two_sample_bound`)."""
    rows = []
    for cell in workload.cells:
        law = laws.stop_outcomes(cell)[1] if cell.observes_text else laws.joint(cell)
        law = law[law > 0]
        if cell.greedy and not cell.observes_text:
            m = math.ceil(math.log(0.01) / math.log(1 - tolerance))
        else:
            m = stats.plan_bound_by_simulation(law, tolerance, rng=np.random.default_rng(seed))
        two = stats.plan_two_sample_bound(law, tolerance, rng=np.random.default_rng(seed))
        rows.append({"cell": cell.name, "settings": cell.label(), "m planned": m,
                     "two-sample m (each server)": two, "two-sample cost": 2 * two / m})
    return pd.DataFrame(rows)


def _print_table(table: pd.DataFrame) -> None:
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def cmd_workload(args) -> int:
    """Run the workload audit; exit 0 when no cell is rejected, 1 when any is, 2 for usage or input errors."""
    import contextlib

    from specdec_lab.models import pair_from_args

    workload = load_workload(args.workload)  # validated before anything touches the disk
    on_vllm = bool(args.serve_bundled) and args.serve_bundled.startswith("vllm-")
    if args.patch is not None and not on_vllm:
        raise ValueError("--patch applies to a server this command starts: use it with --serve-bundled vllm-*")
    if on_vllm and args.engine not in (None, "vllm"):
        raise ValueError(f"--serve-bundled {args.serve_bundled} speaks vLLM's dialect, not --engine {args.engine}")
    args.engine = args.engine or ("vllm" if on_vllm else "llama.cpp")
    max_tokens = args.max_tokens if args.max_tokens is not None else VLLM_MAX_TOKENS if on_vllm else None
    if max_tokens is not None:
        if not 2 <= max_tokens <= 16:
            raise ValueError(f"--max-tokens must be in [2, 16], got {max_tokens}")
        workload = replace(workload, max_tokens=max_tokens)
    if args.exclude_cell:
        unknown = sorted(set(args.exclude_cell) - {c.name for c in workload.cells})
        if unknown:
            raise ValueError(f"--exclude-cell {unknown[0]}: no such cell in workload {workload.name!r}")
        workload = replace(workload, cells=tuple(c for c in workload.cells if c.name not in args.exclude_cell))
        if not workload.cells:
            raise ValueError("--exclude-cell left no cell")
    if args.samples < 1 or args.concurrency < 1 or not 0 < args.tolerance < 1 or not 0 < args.alpha < 1:
        raise ValueError("need --samples >= 1, --concurrency >= 1, 0 < --tolerance < 1 and 0 < --alpha < 1")
    if args.reference_url == "bundled" and not args.serve_bundled:
        raise ValueError("--reference-url bundled needs --serve-bundled")
    if args.out is None and not args.plan:
        raise ValueError("--out is required (the folder of the per-cell parquet files), unless --plan")
    pair = pair_from_args(args)
    suite = SuiteSettings(alpha=args.alpha, tolerance=args.tolerance, joint_tolerance=args.tolerance, n_resamples=2000)
    if args.plan:
        _print_table(plan_cells(LawBook(pair, ENGINES[args.engine].order), workload, args.tolerance, args.seed))
        return 0
    client = ClientSettings(args.concurrency, args.timeout, args.retries, progress=not args.quiet)
    with contextlib.ExitStack() as stack:
        base_url, reference_url, speculative = args.base_url, args.reference_url, args.speculative != "no"
        model = args.model or "target"
        if on_vllm:
            from specdec_lab.adapters import vllm

            method = args.serve_bundled.removeprefix("vllm-")
            served = stack.enter_context(vllm.served(method, patch=args.patch))
            base_url, model, speculative = served.base_url, args.model or "target", method != "none"
            print(f"serving {vllm.server_label(method, patch=args.patch)} at {base_url}", flush=True)
            if reference_url == "bundled":
                reference_url = stack.enter_context(vllm.served("none")).base_url
        elif args.serve_bundled:
            from specdec_lab.adapters import llamacpp

            alias, reference_alias = BUNDLED[args.serve_bundled]
            served = stack.enter_context(llamacpp.bundled_server(model=alias, parallel=SERVE_PARALLEL,
                                                                 batch=SERVE_BATCH))
            base_url, model, speculative = served.base_url, args.model or alias, alias == "target-draft"
            print(f"serving {llamacpp.server_label(alias)} at {base_url}: -np {SERVE_PARALLEL}, -b/-ub {SERVE_BATCH}",
                  flush=True)
            if reference_url == "bundled":
                reference = stack.enter_context(llamacpp.bundled_server(model=reference_alias,
                                                                        parallel=SERVE_PARALLEL, batch=SERVE_BATCH))
                reference_url = reference.base_url
        run = WorkloadRun(base_url, args.out, args.samples, model, args.engine, args.seed, speculative, client,
                          suite=suite)
        if args.bench:
            bench = throughput(pair, workload, run)
            print(" | ".join(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}" for k, v in bench.items()))
            return 0
        print(f"workload {workload.name!r}: {len(workload.cells)} cells in {len(workload.groups())} group(s), "
              f"{args.samples} samples each, {args.concurrency} requests in flight", flush=True)
        found = audit_workload(pair, workload, run)
        reference_frames = None
        if reference_url:
            # other seeds than the audited run's: llama-server's speculation consumes its RNG like plain sampling, so
            # equal seeds give (nearly) equal outputs and the two samples would not be independent
            ref_model = (args.model or "target-nodraft") if args.serve_bundled and not on_vllm else model
            ref_run = replace(run, base_url=reference_url, out=args.out / "reference", speculative=False,
                              seed=run.seed + 1, model=ref_model)
            reference_frames = collect_workload(pair, workload, ref_run, ref_run.out)
    table = found["table"]
    _print_table(table)
    table.to_csv(args.out / "verdicts.csv", index=False)
    for r in found["results"]:
        if r.verdict == "rejected":
            print(f"  {r.cell.name}: rejected by {r.rejected_by} (Holm p = {r.holm_p:.3g})")
        if r.errors and r.refused is None:
            print(f"  {r.cell.name}: {r.errors} of {r.requests} requests failed, e.g. {r.error_example}")
    counters = found["counters"]
    if counters.get("verify_steps") is not None:
        print(f"server counters over the run: {int(counters.get('verify_steps', 0))} verification steps, "
              f"{int(counters.get('draft_tokens', 0))} draft tokens, "
              f"{int(counters.get('accepted_tokens', 0))} accepted")
    samples = sum(r.m for r in found["results"])
    print(f"collection: {found['seconds']:.1f} s, {samples / found['seconds']:.1f} samples/s (wall time; this "
          "call's requests only)")
    if reference_frames is not None:
        two = two_sample_results(workload, found["frames"], reference_frames, suite, pair.vocab_size,
                                 np.random.default_rng(args.seed))
        print("\ntwo-sample mode: each cell's samples against the reference server's")
        _print_table(two)
        two.to_csv(args.out / "two-sample.csv", index=False)
    line = found["summary"]
    (args.out / "summary.txt").write_text(line + "\n")
    print(line)
    frames = found["frames"].values()
    if not any((frame["status"] > 0).any() for frame in frames):
        print("error: the server never answered (is it up? see the errors above)")
        return 2
    failed = sum(r.errors for r in found["results"] if r.refused is None)
    if failed:  # server errors (5xx), and requests it stopped answering: a finding, like a rejection
        print(f"the server failed {failed} requests (HTTP 5xx, or no answer once it was up): a finding (exit 1)")
    return 1 if failed or any(r.verdict == "rejected" for r in found["results"]) else 0
