"""Worker process of mistral.rs's environment (``make mistralrs``): one ``Runner``, jobs on stdin, JSON lines out.

Run by file path with that environment's interpreter (``python -P mistralrs_worker.py '<engine json>'``); it imports
only the standard library and ``mistralrs``, never ``specdec_lab``; the request loop and its protocol are
:mod:`~specdec_lab.adapters.worker_loop`'s. The engine JSON: ``target`` / ``draft`` (model folders),
``template`` (a chat template that renders the message's content alone), ``method`` ("none", "draft_model"),
``gamma`` (``speculative_gamma``), ``vocab_size``.

mistral.rs 0.6.0's Python API takes text, not ids, and returns text: the prompt goes in as the one user message of a
chat request (the template adds nothing, so the engine tokenizes exactly the prompt text; checked against the ids),
and each emitted token comes back as its own logprobs entry (``logprobs=True``), a piece of text mapped to its id by
the vocabulary's decoded pieces. Pieces that several ids decode to (pieces of a multi-byte character) are told apart
by the entry's logprob among ``top_logprobs`` (every id's, ``top_logprobs`` = V − 1); a piece still ambiguous makes
the sample unmappable (null).

A sampling job: ``prompt_ids``, ``seeds`` (one request each; the engine takes no per-request seed: its sampler draws
from one Isaac64 stream seeded 0 when the engine starts, and ``Runner(seed=…)`` is refused on CPU), ``length``
(``max_tokens``; the engine emits one token more, cut here), ``temperature`` (0: the engine's argmax), ``top_p``,
``top_k`` (null: off), ``min_p`` (optional). Reply: ``tokens`` (per request: the first ``length`` ids, or null when
a piece was unmappable), ``stopped`` (per request: fewer than ``length`` tokens, an end-of-text token),
``pipelines`` (per request: the response's ``model``, which names the pipeline that served it — "Speculative: tgt
= …, draft = …, gamma = …" for draft-model speculation), ``errors`` (the engine's message for each request it
raised on), ``engine_seconds``.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

# the shared request loop, loaded by path: this folder is not on sys.path here (worker_loop's docstring)
LOOP = runpy.run_path(str(Path(__file__).with_name("worker_loop.py")))
first_line, serve = LOOP["first_line"], LOOP["serve"]
REPLACEMENT = "\ufffd"  # a piece of a multi-byte character decodes to it


def plain(mr, folder: str):
    """``Which.Plain`` of a local Llama folder, fp32 (mistral.rs's default on CPU is f16)."""
    return mr.Which.Plain(model_id=folder, arch=mr.Architecture.Llama, tokenizer_json=f"{folder}/tokenizer.json",
                          dtype=mr.ModelDType.F32)


def build_runner(mr, engine: dict):
    # max_seqs=1: the speculative pipeline asserts one sequence per step (speculative.rs:360 at v0.6.0)
    extra = {}
    if engine["method"] == "draft_model":
        extra = {"which_draft": plain(mr, engine["draft"]), "speculative_gamma": engine["gamma"]}
    return mr.Runner(which=plain(mr, engine["target"]), token_source="none", max_seqs=1,
                     jinja_explicit=engine["template"], **extra)


def piece_table(runner, vocab_size: int) -> dict[str, list[int]]:
    """Decoded piece → the ids that decode to it."""
    table: dict[str, list[int]] = {}
    for i in range(vocab_size):
        table.setdefault(runner.detokenize_text([i], False), []).append(i)
    return table


def entry_id(entry, table: dict) -> int | None:
    """The id of one logprobs entry: its piece's only id, else the candidate whose listed logprob is the entry's."""
    ids = table.get(entry.token, [])
    if len(ids) == 1:
        return ids[0]
    listed = {t.token: t.logprob for t in entry.top_logprobs}
    matches = [i for i in ids if listed.get(i) == entry.logprob]
    return matches[0] if len(matches) == 1 else None


def request(mr, runner, text: str, job: dict, vocab_size: int):
    top_p = job["top_p"]
    return runner.send_chat_completion_request(mr.ChatCompletionRequest(
        messages=[{"role": "user", "content": text}], model="mistralrs", max_tokens=job["length"],
        temperature=job["temperature"], top_p=None if top_p >= 1.0 else top_p, top_k=job["top_k"],
        min_p=job.get("min_p"), logprobs=True, top_logprobs=vocab_size - 1))


def run_job(mr, held: dict, job: dict) -> dict:
    runner, table, engine = held["runner"], held["table"], held["engine"]
    text = runner.detokenize_text(job["prompt_ids"], False)
    if runner.tokenize_text(text, False, None) != job["prompt_ids"]:
        raise ValueError("the prompt ids do not survive detokenize → tokenize in the engine")
    tokens, stopped, pipelines, errors = [], [], [], []
    started = time.perf_counter()
    for seed in job["seeds"]:
        try:
            response = request(mr, runner, text, job, engine["vocab_size"])
        except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException (a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            errors.append({"seed": seed, "message": f"{type(exc).__name__}: {first_line(exc)}"})
            continue
        if response.usage.prompt_tokens != len(job["prompt_ids"]):
            raise ValueError(f"the engine saw {response.usage.prompt_tokens} prompt tokens, "
                             f"not {len(job['prompt_ids'])}")
        ids = [entry_id(entry, table) for entry in response.choices[0].logprobs.content][: job["length"]]
        stopped.append(len(ids) < job["length"])
        tokens.append(None if None in ids else ids)
        pipelines.append(response.model)
    return {"tokens": tokens, "stopped": stopped, "pipelines": pipelines, "errors": errors,
            "engine_seconds": time.perf_counter() - started}


def start(engine: dict) -> dict:
    """The runner of ``engine`` and its piece table, held with its settings."""
    import mistralrs as mr

    runner = build_runner(mr, engine)
    return {"runner": runner, "table": piece_table(runner, engine["vocab_size"]), "engine": engine}


def version() -> dict:
    from importlib.metadata import version as installed

    return {"mistralrs_version": installed("mistralrs")}


def answer(held: dict, job: dict) -> dict:
    import mistralrs as mr

    return run_job(mr, held, job)


if __name__ == "__main__":
    sys.exit(serve(start, answer, version))
