"""ONNX Runtime GenAI's speculative decoding, audited on the real engine (``onnxruntime-genai``, CPU, own environment).

The engine and its model builder live in their own environment (``make ortgenai``: ``.venv-ortgenai``, or the
per-machine cache ``~/.cache/specdec-lab/venv-ortgenai-<hash of requirements-ortgenai.txt>`` that ``.ci/run``
builds); the main environment never imports it. A worker process of that environment
(:mod:`specdec_lab.adapters.ortgenai_worker`, run by file path) holds one model and answers with token ids and the
engine's own per-request speculative counters (``Generator.get_speculative_stats()``).

The bundled pair in ONNX Runtime GenAI's format: :func:`bundled_models` runs the engine's model builder
(``python -m onnxruntime_genai.models.builder -p fp32 -e cpu``) on the target and on the draft, once per machine,
into ``~/.cache/specdec-lab/ortgenai-<weights sha>-<version>``, and writes a third folder whose
``genai_config.json`` is the target's with the draft's decoder block under ``model.draft`` (the engine's
draft-model configuration; its ONNX files are linked, not copied). :func:`greedy_identity` checks the converted
target's greedy tokens against ours, token for token, before anything is sampled.

Methods: ``none``, ``draft_model`` (``speculative.max_draft_tokens`` = k), ``ngram`` (``speculative.ngram_size`` 3,
no model). Seeds: each request sets ``search.random_seed`` (a 32-bit value here: distinct seeds in [0, 2³¹)).

Where drafts are attributed (:func:`positions_from_stats`): ONNX Runtime GenAI drafts from the prompt (its first
round proposes candidates for tokens 1, 2, …; the counters at L = 1 show one draft token evaluated per request),
and a round proposes at most the tokens still to emit. At L = 2 a request runs one round (its candidate for
token 1 accepted: tokens 1 and 2 both verified candidates, token 2 accepted when both were) or two (token 1's
candidate rejected and corrected, then one candidate for token 2, accepted when the request's accepted count is 1),
so both positions are drafted in every request whose evaluated count is 2.
"""

from __future__ import annotations

import json
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

VERSION = "0.18.0"  # onnxruntime-genai, pinned in requirements-ortgenai.txt
REQUIREMENTS = REPO / "requirements-ortgenai.txt"
ENV_PYTHON = "SPECDEC_LAB_ORTGENAI_PYTHON"  # another environment's python
SEED_HIGH = 2**31
NGRAM_SIZE = 3
METHODS = {
    "none": "no speculation: ONNX Runtime GenAI's own sampler (the reference)",
    "draft_model": "the bundled draft model (speculative.max_draft_tokens = k)",
    "ngram": f"n-gram proposals from the context (speculative.ngram_size {NGRAM_SIZE}), no model",
}
ATTRIBUTED_LENGTH = 2  # the window where the counters place drafts exactly (module docstring)


class OrtGenaiError(EngineError):
    """ONNX Runtime GenAI refused a setting, crashed, or answered something the audit cannot use."""


# its interpreter as OpenVINO's (specdec_lab.adapters.worker.engine_python), with $SPECDEC_LAB_ORTGENAI_PYTHON
ENGINE = Engine("ONNX Runtime GenAI", "ortgenai_worker.py", OrtGenaiError, "ortgenai_version",
                partial(engine_python, ENV_PYTHON, "ortgenai", REQUIREMENTS, REPO))
ortgenai_python, worker, close_workers = ENGINE.python, ENGINE.worker, ENGINE.close_workers


def build_model(source: Path, dest: Path) -> Path:
    """The engine's own model builder on one bundled model: fp32, CPU."""
    return ENGINE.run_tool([str(ortgenai_python()), "-m", "onnxruntime_genai.models.builder", "-m", str(source),
                            "-i", str(source), "-o", str(dest), "-p", "fp32", "-e", "cpu"],
                           dest / "genai_config.json").parent


def write_speculative(target: Path, draft: Path, dest: Path) -> Path:
    """A model folder for draft-model speculation: the target's config with the draft's decoder block under
    ``model.draft`` (its file path relative to the folder), the target's files linked in, the draft's under draft/."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "draft").mkdir(exist_ok=True)
    for path in target.iterdir():
        if path.name != "genai_config.json" and not (dest / path.name).exists():
            (dest / path.name).symlink_to(path)
    for path in draft.glob("model.onnx*"):
        if not (dest / "draft" / path.name).exists():
            (dest / "draft" / path.name).symlink_to(path)
    config = json.loads((target / "genai_config.json").read_text())
    decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["draft"] = {**decoder, "filename": "draft/" + decoder["filename"]}
    (dest / "genai_config.json").write_text(json.dumps(config, indent=1))
    return dest


def bundled_models() -> dict[str, Path]:
    """{"target", "draft", "speculative"} folders of the bundled pair, built on first use and reused (keyed by the
    weights' sha256 and the engine's version)."""
    target, draft = converted_pair("ortgenai", VERSION, "genai_config.json", build_model)
    speculative = write_speculative(target, draft, target.parent / "speculative")
    return {"target": target, "draft": draft, "speculative": speculative}


def engine_settings(method: str, k: int = 4) -> dict:
    """The worker's engine JSON for one method on the bundled pair."""
    if method not in METHODS:
        raise ValueError(f"unknown ONNX Runtime GenAI method {method!r}; valid: {', '.join(METHODS)}")
    if not 1 <= k <= 16:
        raise ValueError(f"k (speculative.max_draft_tokens) must be in 1..16, got {k!r}")
    models = bundled_models()
    model = models["speculative"] if method == "draft_model" else models["target"]
    return {"model": str(model), "method": method, "k": k, "ngram_size": NGRAM_SIZE}


def positions_from_stats(stats: dict, length: int) -> dict:
    """``drafted@1/2`` / ``accepted@1/2`` (0 or 1) of one request from its counters, where they place drafts exactly
    (L = 2; the module docstring), else ``{}``.

    >>> positions_from_stats({"rounds": 1, "draft_tokens_evaluated": 2, "draft_tokens_accepted": 1}, 2)
    {'drafted@1': 1, 'accepted@1': 1, 'drafted@2': 1, 'accepted@2': 0}
    >>> positions_from_stats({"rounds": 2, "draft_tokens_evaluated": 2, "draft_tokens_accepted": 1}, 2)
    {'drafted@1': 1, 'accepted@1': 0, 'drafted@2': 1, 'accepted@2': 1}
    >>> positions_from_stats({"rounds": 0, "draft_tokens_evaluated": 0, "draft_tokens_accepted": 0}, 2)
    {'drafted@1': 0, 'accepted@1': 0, 'drafted@2': 0, 'accepted@2': 0}
    >>> positions_from_stats({"rounds": 1, "draft_tokens_evaluated": 2, "draft_tokens_accepted": 2}, 3)
    {}
    """
    if length != ATTRIBUTED_LENGTH or not stats:
        return {}
    rounds, evaluated, accepted = stats["rounds"], stats["draft_tokens_evaluated"], stats["draft_tokens_accepted"]
    if evaluated < 2:  # a round without two verified candidates (e.g. n-gram without a match): nothing is placed
        first = int(evaluated == 1 and rounds == 1)
        return {"drafted@1": first, "accepted@1": int(first and accepted == 1), "drafted@2": 0, "accepted@2": 0}
    one_round = rounds == 1  # token 1's candidate accepted, token 2's verified in the same round
    return {"drafted@1": 1, "accepted@1": int(one_round), "drafted@2": 1,
            "accepted@2": int(accepted == 2 if one_round else accepted == 1)}


@dataclass(frozen=True)
class OrtGenaiConfig:
    """Settings of one ONNX Runtime GenAI audit (a model in a worker of its environment).

    method: one of :data:`METHODS`; k: ``speculative.max_draft_tokens``; sampling: temperature / top-k / top-p asked of
    the engine (and, by default, the law scored); job_size: requests per worker job.
    """

    method: str = "none"
    sampling: SamplingConfig = SamplingConfig()
    k: int = 4
    job_size: int = 500
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown ONNX Runtime GenAI method {self.method!r}; valid: {', '.join(METHODS)}")
        if not 1 <= self.k <= 16 or self.job_size < 1:
            raise ValueError(f"k must be in 1..16 and job_size >= 1, got {self.k!r}, {self.job_size!r}")

    @property
    def engine(self) -> dict:
        return engine_settings(self.method, self.k)

    def describe(self) -> dict:
        described = {"sampler": "ortgenai", "ortgenai_version": VERSION, "method": self.method,
                     **self.sampling.describe()}
        if self.method != "none":
            described["k"] = self.k
        if self.method == "ngram":
            described["ngram_size"] = NGRAM_SIZE
        return described

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample(prompt, n, length, self, generator)


def sample(prompt: torch.Tensor, n: int, length: int, config: OrtGenaiConfig,
           generator: torch.Generator) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens (jobs of ≤ ``config.job_size`` requests).

    A request the engine raised on is counted (``engine_errors``, ``engine error: <message>``) and replaced by a
    request with a new seed; a job in which every request raised ends the collection with the engine's message.
    Stats also hold ``engine_seconds``, the counters summed (``rounds``, ``draft_tokens_evaluated``, …) and, at L = 2,
    ``drafted@t`` / ``accepted@t`` (:func:`positions_from_stats`).
    """
    check_request(prompt, n, length)
    engine = worker(config.engine)
    rows, totals = [], {"engine_seconds": 0.0, "engine_errors": 0}
    bar = tqdm(total=n, desc=f"ORT GenAI {config.method}", unit="samples", leave=False, disable=not config.progress)
    while len(rows) < n:
        seeds = distinct_seeds(generator, min(config.job_size, n - len(rows)), SEED_HIGH)
        reply = engine.ask(sampling_job(prompt, seeds, length, config.sampling), timeout=600)
        totals["engine_seconds"] += reply["engine_seconds"]
        count_errors(totals, reply["errors"])
        if not reply["tokens"]:
            raise OrtGenaiError(f"ONNX Runtime GenAI raised on every request of a job: {reply['errors'][0]['message']}")
        check_lengths(reply["tokens"], length, ENGINE)
        for stats in reply["stats"]:
            add_counts(totals, stats)
            add_counts(totals, positions_from_stats(stats, length))
        rows += reply["tokens"]
        bar.update(len(reply["tokens"]))
    bar.close()
    totals["emitted_tokens"] = n * length
    if "draft_tokens_evaluated" in totals and totals.get("rounds"):
        totals["target_passes"] = totals["rounds"]  # one target pass per round (prompt pass included)
    return SampleResult(torch.tensor(rows, dtype=torch.long), None, totals)


def greedy_tokens(method: str, prompt: torch.Tensor, length: int, k: int = 4) -> list[int]:
    """ONNX Runtime GenAI's greedy (T = 0) continuation of ``prompt`` ((P,) ids) with ``method``: ``length`` ids."""
    reply = worker(engine_settings(method, k)).ask(sampling_job(prompt, [0], length, SamplingConfig(temperature=0.0)))
    if reply["errors"]:
        raise OrtGenaiError(f"ONNX Runtime GenAI raised: {reply['errors'][0]['message']}")
    return reply["tokens"][0]


def greedy_check(method: str, prompt: torch.Tensor, length: int, k: int = 4) -> dict:
    """Greedy tokens of ``method`` against ONNX Runtime GenAI's own non-speculative greedy tokens
    (:func:`specdec_lab.adapters.worker.greedy_check`)."""
    return compare_greedy(lambda m: greedy_tokens(m, prompt, length, k), method)


def greedy_identity(pair, prompts: list[str], length: int = 32) -> list[dict]:
    """The converted target's greedy tokens (no speculation) against our target's argmax decode, one row per prompt."""
    return compare_identity(pair, prompts, length, lambda ids, n: greedy_tokens("none", ids, n))
