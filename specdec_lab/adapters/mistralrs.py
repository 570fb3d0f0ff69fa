"""mistral.rs's speculative decoding, audited on the real engine (PyPI ``mistralrs`` 0.6.0, CPU, own environment).

0.6.0 is the newest release on PyPI whose Python ``Runner`` speculates with a separate draft model
(``which_draft``, ``speculative_gamma``); later releases speculate only through a Gemma 4 MTP assistant, which
needs PagedAttention (not on CPU). docs/audit-mistralrs.md says how the versions were examined.

The engine lives in its own environment (``make mistralrs``: ``.venv-mistralrs``, or the per-machine cache
``~/.cache/specdec-lab/venv-mistralrs-<hash of requirements-mistralrs.txt>`` that ``.ci/run`` builds); the main
environment never imports it. A worker process of that environment (:mod:`specdec_lab.adapters.mistralrs_worker`,
run by file path) holds one ``Runner`` and answers with token ids (mapped from the engine's per-token logprobs
entries) and, per request, the name of the pipeline that served it.

The bundled pair in mistral.rs's format: :func:`bundled_folders` copies each model folder once per machine into
``~/.cache/specdec-lab/mistralrs-<weights sha>-<version>`` with ``rope_theta`` written at the top
level of ``config.json`` (mistral.rs 0.6.0 reads it there; transformers 5 writes it under ``rope_parameters``), and
writes a chat template that renders the prompt alone. :func:`greedy_identity` checks the engine's greedy tokens
against our target's, token for token, before anything is sampled.

Methods: ``none`` and ``draft_model`` (``speculative_gamma`` = gamma). Seeds: the engine takes none per request (its
sampler draws from one Isaac64 stream seeded 0 at engine start: engine/mod.rs:64,163 at v0.6.0); the collection's
draws are successive draws of that stream in one worker, which lives as long as this process. A new process starts
the stream again, so a collection resumed in a new process would repeat its first draws: ``specdec-lab audit
mistralrs`` refuses an unfinished sample file (:func:`specdec_lab.cli.audit_mistralrs.refuse_resume`).

Where drafts are attributed (:func:`positions_from_pipeline`): mistral.rs reports no draft counters. What it does
report, per request, is the pipeline that served it (the response's ``model``: "Speculative: tgt = …, draft = …,
gamma = …"). That pipeline's every step, the prompt's included, runs the draft gamma times and emits only tokens that
came out of verifying them (``SpeculativePipeline::step``, speculative.rs:364–490; the bonus sample after a fully
accepted block is commented out, 575–588), so every emitted position of such a request was drafted. Acceptance is
not reported.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec_lab.adapters.worker import (REPO, Engine, EngineError, add_counts, check_lengths, converted_pair,
                                         count_errors, engine_python, greedy_check as compare_greedy,
                                         greedy_identity as compare_identity, sampling_job)
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request

VERSION = "0.6.0"  # mistralrs, pinned in requirements-mistralrs.txt
SOURCE_TAG = "v0.6.0"  # EricLBuehler/mistral.rs, commit 3410183e: the source lines the docs quote
REQUIREMENTS = REPO / "requirements-mistralrs.txt"
ENV_PYTHON = "SPECDEC_LAB_MISTRALRS_PYTHON"  # another environment's python
METHODS = {
    "none": "no speculation: mistral.rs's own sampler (the reference)",
    "draft_model": "the bundled draft model (speculative_gamma = gamma)",
}
SPECULATIVE_PIPELINE = "Speculative:"  # how the response's model names the draft-model pipeline
TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # the prompt alone


class MistralrsError(EngineError):
    """mistral.rs refused a setting, crashed, or answered something the audit cannot use."""


# its interpreter as OpenVINO's (specdec_lab.adapters.worker.engine_python), with $SPECDEC_LAB_MISTRALRS_PYTHON
ENGINE = Engine("mistral.rs", "mistralrs_worker.py", MistralrsError, "mistralrs_version",
                partial(engine_python, ENV_PYTHON, "mistralrs", REQUIREMENTS, REPO))
mistralrs_python, worker, close_workers = ENGINE.python, ENGINE.worker, ENGINE.close_workers


def copy_for_mistralrs(source: Path, dest: Path) -> Path:
    """One bundled model folder as mistral.rs 0.6.0 loads it: the files copied, ``config.json`` with ``rope_theta``
    at the top level (its Llama config has no ``rope_parameters``), and the prompt-only chat template."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != "config.json":
            shutil.copy2(path, dest / path.name)
    config = json.loads((source / "config.json").read_text())
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    (dest / "chat_template.jinja").write_text(TEMPLATE)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def bundled_folders() -> tuple[Path, Path]:
    """(target, draft) folders of the bundled pair for mistral.rs, written on first use and reused (keyed by the
    weights' sha256 and the engine's version)."""
    return converted_pair("mistralrs", VERSION, "config.json", copy_for_mistralrs)


def engine_settings(method: str, gamma: int = 1) -> dict:
    """The worker's engine JSON for one method on the bundled pair."""
    if method not in METHODS:
        raise ValueError(f"unknown mistral.rs method {method!r}; valid: {', '.join(METHODS)}")
    if gamma < 1:
        raise ValueError(f"gamma (speculative_gamma, --k) must be >= 1, got {gamma!r}")
    target, draft = bundled_folders()
    return {"method": method, "target": str(target), "draft": str(draft), "gamma": gamma,
            "template": str(target / "chat_template.jinja"),
            "vocab_size": json.loads((target / "config.json").read_text())["vocab_size"]}


def positions_from_pipeline(pipeline: str, length: int) -> dict:
    """``drafted@t`` (0 or 1, t = 1..L) of one kept request from the pipeline that served it (module docstring):
    every position when the speculative pipeline served it, none otherwise. No ``accepted@t``: not reported.

    >>> positions_from_pipeline("Speculative: tgt = `t`, draft = `d`, gamma = `1`", 2)
    {'drafted@1': 1, 'drafted@2': 1}
    >>> positions_from_pipeline("/cache/mistralrs/target", 2)
    {'drafted@1': 0, 'drafted@2': 0}
    """
    drafted = int(pipeline.startswith(SPECULATIVE_PIPELINE))
    return {f"drafted@{t}": drafted for t in range(1, length + 1)}


@dataclass(frozen=True)
class MistralrsConfig:
    """Settings of one mistral.rs audit (a ``Runner`` in a worker of mistral.rs's environment).

    method: one of :data:`METHODS`; gamma: ``speculative_gamma``; sampling: temperature / top-k / top-p asked of the
    engine (and, by default, the law scored); job_size: requests per worker job.
    """

    method: str = "none"
    sampling: SamplingConfig = SamplingConfig()
    gamma: int = 1
    job_size: int = 500
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown mistral.rs method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.gamma < 1 or self.job_size < 1:
            raise ValueError(f"gamma and job_size must be >= 1, got {self.gamma!r}, {self.job_size!r}")

    @property
    def engine(self) -> dict:
        return engine_settings(self.method, self.gamma)

    def describe(self) -> dict:
        described = {"sampler": "mistralrs", "mistralrs_version": VERSION, "method": self.method,
                     **self.sampling.describe()}
        if self.method != "none":
            described["gamma"] = self.gamma
        return described

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample(prompt, n, length, self, generator)


def sample(prompt: torch.Tensor, n: int, length: int, config: MistralrsConfig,
           generator: torch.Generator) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens (jobs of ≤ ``config.job_size`` requests).

    A request that ended early (an end-of-text token) or whose tokens could not be mapped is refused and counted
    (``refused_samples``, ``stopped_early``) and another is asked for; a request the engine raised on is counted
    (``engine_errors``, ``engine error: <message>``); a job in which every request raised ends the collection with
    the engine's message (a panic leaves the runner dead). Stats also hold ``engine_seconds``, ``sequences`` (the
    requests the engine completed) and ``drafted@t`` (:func:`positions_from_pipeline`). ``generator`` is not used:
    the engine takes no seed (module docstring).
    """
    check_request(prompt, n, length)
    engine = worker(config.engine)
    rows, totals = [], {"engine_seconds": 0.0, "engine_errors": 0, "refused_samples": 0, "stopped_early": 0}
    bar = tqdm(total=n, desc=f"mistral.rs {config.method}", unit="samples", leave=False, disable=not config.progress)
    while len(rows) < n:
        count = min(config.job_size, n - len(rows))
        reply = engine.ask(sampling_job(prompt, list(range(count)), length, config.sampling), timeout=600)
        totals["engine_seconds"] += reply["engine_seconds"]
        count_errors(totals, reply["errors"])
        if not reply["tokens"]:
            raise MistralrsError(f"mistral.rs raised on every request of a job: {reply['errors'][0]['message']}\n"
                                 f"(log: {engine.log.name})")
        for ids, stopped, pipeline in zip(reply["tokens"], reply["stopped"], reply["pipelines"]):
            if ids is None or stopped:
                add_counts(totals, {"refused_samples": 1, "stopped_early": int(stopped)})
                continue
            check_lengths([ids], length, ENGINE)
            rows.append(ids)
            add_counts(totals, positions_from_pipeline(pipeline, length))
        add_counts(totals, {"sequences": len(reply["tokens"])})
        bar.update(len(rows) - bar.n)
    bar.close()
    totals["emitted_tokens"] = n * length
    return SampleResult(torch.tensor(rows, dtype=torch.long), None, totals)


def greedy_tokens(method: str, prompt: torch.Tensor, length: int, gamma: int = 1) -> list[int]:
    """mistral.rs's greedy (T = 0: its argmax) continuation of ``prompt`` ((P,) ids) with ``method``: at most
    ``length`` ids (fewer when it emitted an end-of-text token)."""
    reply = worker(engine_settings(method, gamma)).ask(sampling_job(prompt, [0], length,
                                                                    SamplingConfig(temperature=0.0)))
    if reply["errors"]:
        raise MistralrsError(f"mistral.rs raised: {reply['errors'][0]['message']}")
    if reply["tokens"][0] is None:
        raise MistralrsError("mistral.rs's greedy tokens could not be mapped to ids")
    return reply["tokens"][0]


def greedy_check(method: str, prompt: torch.Tensor, length: int, gamma: int = 1) -> dict:
    """Greedy tokens of ``method`` against mistral.rs's own non-speculative greedy tokens
    (:func:`specdec_lab.adapters.worker.greedy_check`)."""
    return compare_greedy(lambda m: greedy_tokens(m, prompt, length, gamma), method)


def greedy_identity(pair, prompts: list[str], length: int = 32) -> list[dict]:
    """The engine's greedy tokens (no speculation) against our target's argmax decode, one row per prompt: the check
    that mistral.rs runs our target."""
    return compare_identity(pair, prompts, length, lambda ids, n: greedy_tokens("none", ids, n))
