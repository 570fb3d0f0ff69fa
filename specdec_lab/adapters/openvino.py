"""OpenVINO GenAI's speculative decoding, audited on the real engine (``openvino-genai``, CPU, in its own environment).

OpenVINO GenAI's export tools (``optimum-intel``) pin an older transformers, so the engine lives in its own
environment (``make openvino``: ``.venv-openvino``, or the per-machine cache
``~/.cache/specdec-lab/venv-openvino-<hash of requirements-openvino.txt>`` that ``.ci/run`` builds) and the main
environment never imports it. A worker process of that environment
(:mod:`specdec_lab.adapters.openvino_worker`, run by file path) holds one pipeline and answers with token ids
and the engine's own speculative counters.

The bundled pair in OpenVINO's format: :func:`bundled_ir` exports the target and the draft to OpenVINO IR (fp32
weights, with OpenVINO's tokenizer models) with ``optimum-cli export openvino`` of that environment, once per
machine, into ``~/.cache/specdec-lab/openvino-ir-<weights sha>-<version>``; :func:`greedy_identity` checks the
IR's greedy tokens against our target's, token for token, before anything is sampled.

Pipelines (``--pipeline``): ``llm`` (``LLMPipeline``, one request per call, the engine's counters per request) and
``continuous-batching`` (``ContinuousBatchingPipeline``, every request of a job added and stepped together; each
request's handle gives its tokens per step, the pipeline's speculative metrics are the whole call's). Methods:
``none``, ``draft_model`` (``num_assistant_tokens`` = k), ``prompt_lookup``.

Seeds: a request's ``rng_seed`` seeds its own ``std::mt19937`` (``sampler.cpp``: ``RequestSamplerContext``), whose
seeding keeps the low 32 bits; the adapter draws one seed per sample in [0, 2³²) from the collection's generator
(OpenVINO refuses ``num_return_sequences`` > 1 with speculative decoding), so two samples of an m = 20,000 set
share a stream with expected count m²/2³³ ≈ 0.05; the suite's collision test checks the samples.

Where drafts are attributed (:func:`positions_from_counters`): token 1 comes from the prompt's pass, and OpenVINO
validates at most (tokens still to emit) − 1 candidates in a step (``Sampler::sample_from_sequence_group``:
``num_tokens_to_process`` is cut to ``output_seq_len - 1``), so at L = 2 nothing is drafted and at L = 3 only the
step after token 1 carries a candidate, for position 2: a request whose draft generated tokens had token 2
drafted, and its accepted-token count is 1 exactly when that candidate was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.adapters.worker import (REPO, Engine, EngineError, add_counts, check_lengths, converted_pair,
                                         count_errors, engine_python, greedy_check as compare_greedy,
                                         greedy_identity as compare_identity, sampling_job)
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request

VERSION = "2026.4.1.0"  # openvino-genai, pinned in requirements-openvino.txt
REQUIREMENTS = REPO / "requirements-openvino.txt"
ENV_PYTHON = "SPECDEC_LAB_OPENVINO_PYTHON"  # another environment's python
SEED_HIGH = 2**32  # mt19937 keeps the low 32 bits of rng_seed
PIPELINES = ("llm", "continuous-batching")
METHODS = {
    "none": "no speculation: OpenVINO GenAI's own sampler (the reference)",
    "draft_model": "the bundled draft model (num_assistant_tokens = k)",
    "prompt_lookup": "prompt lookup: n-gram matches in the context (max_ngram_size 3), no model",
}
ATTRIBUTED_LENGTH = 3  # the window where the counters attribute drafts to token 2 exactly (module docstring)


class OpenvinoError(EngineError):
    """OpenVINO GenAI refused a setting, crashed, or answered something the audit cannot use."""


# the environment's interpreter: $SPECDEC_LAB_OPENVINO_PYTHON, else .venv-openvino, else the per-machine cache that
# .ci/run builds (engine_python); the running worker of an engine setting; stop them all
ENGINE = Engine("OpenVINO GenAI", "openvino_worker.py", OpenvinoError, "openvino_genai_version",
                partial(engine_python, ENV_PYTHON, "openvino", REQUIREMENTS, REPO))
openvino_python, worker, close_workers = ENGINE.python, ENGINE.worker, ENGINE.close_workers


def export_ir(source: Path, dest: Path) -> Path:
    """``optimum-cli export openvino`` (the environment's own exporter) of one bundled model, fp32 weights."""
    cli = openvino_python().parent / "optimum-cli"
    return ENGINE.run_tool([str(cli), "export", "openvino", "--model", str(source), "--task",
                            "text-generation-with-past", "--weight-format", "fp32", str(dest)],
                           dest / "openvino_model.xml").parent


def bundled_ir() -> tuple[Path, Path]:
    """(target, draft) IR folders of the bundled pair, exported on first use and reused (keyed by the weights'
    sha256 and the engine's version)."""
    return converted_pair("openvino-ir", VERSION, "openvino_model.xml", export_ir)


def engine_settings(method: str, pipeline: str = "llm", k: int = 4, max_ngram_size: int = 3,
                    prefix_caching: bool | None = None) -> dict:
    """The worker's engine JSON for one method on the bundled pair."""
    if method not in METHODS:
        raise ValueError(f"unknown OpenVINO GenAI method {method!r}; valid: {', '.join(METHODS)}")
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown OpenVINO GenAI pipeline {pipeline!r}; valid: {', '.join(PIPELINES)}")
    if k < 1:
        raise ValueError(f"k (num_assistant_tokens) must be >= 1, got {k!r}")
    target, draft = bundled_ir()
    return {"pipeline": pipeline, "method": method, "target": str(target), "draft": str(draft), "k": k,
            "max_ngram_size": max_ngram_size, "prefix_caching": prefix_caching}


def positions_from_counters(counters: dict, length: int, method: str = "draft_model") -> dict:
    """``drafted@t`` / ``accepted@t`` (0 or 1) of one request from its counters, where they attribute exactly
    (L = 3; the module docstring), else ``{}``.

    ``LLMPipeline``'s draft model: token 2 was drafted when the draft generated tokens, and accepted when the
    request's ``get_num_accepted_tokens()`` is 1 (at L = 3 one step verifies, one candidate). The main model's tokens
    per step (``m_batch_sizes``) do not show acceptance there: the sampler counts the iteration that rejects a
    candidate and the one that resamples after it (``sampler.cpp``: ``num_generated_tokens++`` before the
    ``continue``), so a rejected step also reports 2 — which is why, on ``ContinuousBatchingPipeline`` (no
    per-request SD metrics: ``draft_generated`` None), a draft model's token 2 counts as drafted when token 1 came
    alone and the next step reported 2 or more tokens (a candidate was validated at position 2; step lists such as
    (1, 2, 1) occur, so this reads the steps, not the emitted tokens), and its acceptance is unknown (no
    ``accepted@2``); a first step of 2 or more tokens validated a candidate for token 1 (``drafted@1``: the
    pipeline drafts token 1 for requests past the prefill budget, docs/audit-openvino.md finding 3). Prompt lookup
    reports no SD metrics on either pipeline (``draft_generated`` None); a rejected candidate ends its step at once
    there, so a step of 2 tokens is an accepted candidate, and only accepted candidates show: a lower bound on the
    drafted count.

    >>> positions_from_counters({"main_step_tokens": [1, 2], "draft_generated": 4, "accepted": 1}, 3)
    {'drafted@2': 1, 'accepted@2': 1}
    >>> positions_from_counters({"main_step_tokens": [1, 2], "draft_generated": 4, "accepted": 0}, 3)
    {'drafted@2': 1, 'accepted@2': 0}
    >>> positions_from_counters({"main_step_tokens": [1, 1, 1], "draft_generated": None, "accepted": None}, 3,
    ...                         "prompt_lookup")
    {'drafted@1': 0, 'drafted@2': 0, 'accepted@1': 0, 'accepted@2': 0}
    >>> positions_from_counters({"main_step_tokens": [1, 2], "draft_generated": None, "accepted": None}, 3,
    ...                         "draft_model")
    {'drafted@1': 0, 'drafted@2': 1}
    >>> positions_from_counters({"main_step_tokens": [2, 1], "draft_generated": None, "accepted": None}, 3,
    ...                         "draft_model")
    {'drafted@1': 1, 'drafted@2': 0}
    >>> positions_from_counters({"main_step_tokens": [1, 2], "draft_generated": None, "accepted": None}, 3,
    ...                         "prompt_lookup")
    {'drafted@1': 0, 'drafted@2': 1, 'accepted@1': 0, 'accepted@2': 1}
    >>> positions_from_counters({"main_step_tokens": [1, 2], "draft_generated": 4, "accepted": 1}, 5)
    {}
    """
    if length != ATTRIBUTED_LENGTH or not counters:
        return {}
    if counters["draft_generated"] is None:  # no SD metrics for this request: read its main-model steps
        steps = counters["main_step_tokens"]
        first = int(bool(steps) and steps[0] > 1)  # token 1 out of a step that validated a candidate (finding 3)
        second = int(len(steps) > 1 and steps[0] == 1 and steps[1] > 1)  # token 1 alone, then tokens 2–3
        found = {"drafted@1": first, "drafted@2": second}
        if method == "prompt_lookup":  # only accepted candidates make a step of 2
            found.update({"accepted@1": first, "accepted@2": second})
        return found
    drafted = int(counters["draft_generated"] > 0)
    return {"drafted@2": drafted, "accepted@2": int(drafted and counters["accepted"] > 0)}


@dataclass(frozen=True)
class OpenvinoConfig:
    """Settings of one OpenVINO GenAI audit (a pipeline in a worker of OpenVINO's environment).

    method: one of :data:`METHODS`; pipeline: one of :data:`PIPELINES`; k: ``num_assistant_tokens``;
    sampling: temperature / top-k / top-p asked of the engine (and, by default, the law scored);
    job_size: requests per worker job; prefix_caching: None keeps the pipeline's default (on for ``LLMPipeline`` with
    speculative decoding), False/True sets ``SchedulerConfig.enable_prefix_caching``.
    """

    method: str = "none"
    pipeline: str = "llm"
    sampling: SamplingConfig = SamplingConfig()
    k: int = 4
    max_ngram_size: int = 3
    job_size: int = 500
    prefix_caching: bool | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown OpenVINO GenAI method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.pipeline not in PIPELINES:
            raise ValueError(f"unknown OpenVINO GenAI pipeline {self.pipeline!r}; valid: {', '.join(PIPELINES)}")
        if self.k < 1 or self.job_size < 1:
            raise ValueError(f"k and job_size must be >= 1, got {self.k!r}, {self.job_size!r}")

    @property
    def engine(self) -> dict:
        return engine_settings(self.method, self.pipeline, self.k, self.max_ngram_size, self.prefix_caching)

    def describe(self) -> dict:
        described = {"sampler": "openvino_genai", "openvino_genai_version": VERSION, "method": self.method,
                     "pipeline": self.pipeline, **self.sampling.describe()}
        if self.method != "none":
            described["k"] = self.k
        if self.method == "prompt_lookup":
            described["max_ngram_size"] = self.max_ngram_size
        if self.prefix_caching is not None:
            described["prefix_caching"] = self.prefix_caching
        return described

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample(prompt, n, length, self, generator)


def sample(prompt: torch.Tensor, n: int, length: int, config: OpenvinoConfig,
           generator: torch.Generator) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens (jobs of ≤ ``config.job_size`` requests).

    Stats: ``engine_seconds``, ``engine_errors`` (requests the engine raised on; each was run again once with the
    same seed), ``engine error: <the engine's message>`` (the count per message), the speculative counters summed (``draft_generated``,
    ``accepted_tokens``, ``target_passes``: main-model steps; ``continuous-batching`` keeps no per-request
    speculative metrics, so only ``target_passes``) and, at L = 3, ``drafted@t`` / ``accepted@t``
    (:func:`positions_from_counters`).
    """
    check_request(prompt, n, length)
    engine = worker(config.engine)
    seeds = distinct_seeds(generator, n, SEED_HIGH)
    rows, totals = [], {"engine_seconds": 0.0, "engine_errors": 0}
    bar = tqdm(total=n, desc=f"OpenVINO {config.method}", unit="samples", leave=False, disable=not config.progress)
    for start in range(0, n, config.job_size):
        reply = engine.ask(sampling_job(prompt, seeds[start:start + config.job_size], length, config.sampling),
                           timeout=600)
        check_lengths(reply["tokens"], length, ENGINE)
        rows += reply["tokens"]
        totals["engine_seconds"] += reply["engine_seconds"]
        count_errors(totals, reply["errors"])
        for counters in reply["counters"]:
            if counters:
                add_counts(totals, {key: value for key, value in (
                    ("draft_generated", counters["draft_generated"]), ("accepted_tokens", counters["accepted"]),
                    ("target_passes", len(counters["main_step_tokens"]))) if value is not None})
                add_counts(totals, positions_from_counters(counters, length, config.method))
        bar.update(len(reply["tokens"]))
    bar.close()
    totals["emitted_tokens"] = n * length
    return SampleResult(torch.tensor(rows, dtype=torch.long), None, totals)


def greedy_tokens(method: str, prompt: torch.Tensor, length: int, pipeline: str = "llm", k: int = 4) -> list[int]:
    """OpenVINO GenAI's greedy (T = 0) continuation of ``prompt`` ((P,) ids) with ``method``: ``length`` ids."""
    job = sampling_job(prompt, [0], length, SamplingConfig(temperature=0.0))
    return worker(engine_settings(method, pipeline, k)).ask(job)["tokens"][0]


def greedy_check(method: str, prompt: torch.Tensor, length: int, pipeline: str = "llm", k: int = 4) -> dict:
    """Greedy tokens of ``method`` against OpenVINO GenAI's own non-speculative greedy tokens
    (:func:`specdec_lab.adapters.worker.greedy_check`)."""
    return compare_greedy(lambda m: greedy_tokens(m, prompt, length, pipeline, k), method)


def greedy_identity(pair, prompts: list[str], length: int = 32) -> list[dict]:
    """The IR target's greedy tokens (OpenVINO, no speculation) against our target's argmax decode, token for
    token, one row per prompt: the check that the exported model is our target."""
    return compare_identity(pair, prompts, length, lambda ids, n: greedy_tokens("none", ids, n))
