"""Worker process of ONNX Runtime GenAI's environment (``make ortgenai``): one model, jobs on stdin, JSON lines out.

Run by file path with that environment's interpreter (``python -P ortgenai_worker.py '<engine json>'``); it imports
only the standard library and ``onnxruntime_genai``, never ``specdec_lab``; the request loop and its protocol are
:mod:`~specdec_lab.adapters.worker_loop`'s. The engine JSON: ``model`` (a folder
with ``genai_config.json``: the target alone, or the target with the draft under ``model.draft``), ``method``
("none", "draft_model", "ngram"), ``k`` (``speculative.max_draft_tokens``), ``ngram_size``.

A sampling job: ``prompt_ids``, ``seeds`` (one generator per seed: ``search.random_seed``), ``length`` (exactly that
many tokens: ``min_length`` = ``max_length`` = prompt + length), ``temperature`` (0: greedy), ``top_p``, ``top_k``
(null: off, sent as 0; the engine's own default is 50). Reply: ``tokens`` (one list per seed), ``stats`` (per
request, the engine's ``Generator.get_speculative_stats()`` counters that place drafts: ``rounds``,
``draft_tokens_proposed``, ``draft_tokens_evaluated``, ``draft_tokens_accepted``, ``correction_tokens``,
``bonus_tokens``, ``ngram_lookup_hits``), ``errors`` (the engine's message for each request it raised on; not
retried), ``engine_seconds``.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

# the shared request loop, loaded by path: this folder is not on sys.path here (worker_loop's docstring)
LOOP = runpy.run_path(str(Path(__file__).with_name("worker_loop.py")))
first_line, serve = LOOP["first_line"], LOOP["serve"]

STATS = ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted", "correction_tokens",
         "bonus_tokens", "ngram_lookup_hits")


def search_options(job: dict, seed: int, prompt_length: int) -> dict:
    total = prompt_length + job["length"]
    options = {"max_length": total, "min_length": total}
    if job["temperature"] == 0:
        options["do_sample"] = False
    else:
        options.update(do_sample=True, temperature=job["temperature"], top_p=job["top_p"],
                       top_k=0 if job["top_k"] is None else job["top_k"], random_seed=seed)
    return options


def generate(og, model, engine: dict, job: dict, seed: int) -> tuple[list[int], dict]:
    """One request: append the prompt, step until done; the new tokens and the engine's speculative counters."""
    params = og.GeneratorParams(model)
    params.set_search_options(**search_options(job, seed, len(job["prompt_ids"])))
    if engine["method"] == "draft_model":
        params.set_speculative_options(max_draft_tokens=engine["k"])
    if engine["method"] == "ngram":
        params.set_speculative_options(max_draft_tokens=engine["k"], ngram_size=engine["ngram_size"])
    generator = og.Generator(model, params)
    generator.append_tokens(job["prompt_ids"])
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)][len(job["prompt_ids"]):]
    stats = generator.get_speculative_stats() if engine["method"] != "none" else {}
    return tokens, {key: int(stats[key]) for key in STATS if key in stats}


def run_job(og, model, engine: dict, job: dict) -> dict:
    tokens, stats, errors = [], [], []
    started = time.perf_counter()
    for seed in job["seeds"]:
        try:
            ids, counters = generate(og, model, engine, job, seed)
        except Exception as exc:  # the engine's own refusal or crash: a result, counted by the adapter
            errors.append({"seed": seed, "message": f"{type(exc).__name__}: {first_line(exc)}"})
            continue
        tokens.append(ids)
        stats.append(counters)
    return {"tokens": tokens, "stats": stats, "errors": errors, "engine_seconds": time.perf_counter() - started}


def start(engine: dict) -> tuple:
    """The model of ``engine``, held with its settings."""
    import onnxruntime_genai as og

    return og.Model(engine["model"]), engine


def version() -> dict:
    import onnxruntime_genai as og

    return {"ortgenai_version": og.__version__}


def answer(held: tuple, job: dict) -> dict:
    import onnxruntime_genai as og

    model, engine = held
    return run_job(og, model, engine, job)


if __name__ == "__main__":
    sys.exit(serve(start, answer, version))
