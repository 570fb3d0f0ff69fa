"""Worker process of OpenVINO GenAI's environment (``make openvino``): one pipeline, jobs on stdin, JSON lines out.

Run by file path with that environment's interpreter (``python -P openvino_worker.py '<engine json>'``); it
imports only the standard library, numpy and OpenVINO GenAI, never ``specdec_lab``; the request loop and its
protocol are :mod:`~specdec_lab.adapters.worker_loop`'s. The engine JSON:
``pipeline`` ("llm": ``LLMPipeline``; "continuous-batching": ``ContinuousBatchingPipeline``), ``method``
("none", "draft_model", "prompt_lookup"), ``target`` / ``draft`` (OpenVINO IR directories), ``k``
(``num_assistant_tokens``), ``max_ngram_size`` (prompt lookup), ``prefix_caching`` (null: the pipeline's default;
true/false: ``SchedulerConfig.enable_prefix_caching``).

A sampling job: ``prompt_ids``, ``seeds`` (one request per seed: OpenVINO GenAI refuses parallel sampling,
``num_return_sequences`` > 1, with speculative decoding), ``length`` (exactly that many tokens: ``min_new_tokens``
= ``max_new_tokens``, ``ignore_eos``), ``temperature`` (0: greedy), ``top_p``, ``top_k`` (null: off).
Reply: ``tokens`` (one list per seed), per request the engine's own speculative counters (``counters``: see
:func:`request_counters` and :func:`run_batching`), ``errors`` (the engine's message for each request it raised on, then retried once with
the same seed), ``engine_seconds``.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

# the shared request loop, loaded by path: this folder is not on sys.path here (worker_loop's docstring)
LOOP = runpy.run_path(str(Path(__file__).with_name("worker_loop.py")))
first_line, serve = LOOP["first_line"], LOOP["serve"]


def generation_config(engine: dict, job: dict, seed: int):
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = job["length"]
    config.ignore_eos = True
    if job["temperature"] == 0:
        config.do_sample = False
    else:
        config.do_sample = True
        config.temperature = job["temperature"]
        config.top_p = job["top_p"]
        config.top_k = 0 if job["top_k"] is None else job["top_k"]  # 0: off (OpenVINO's default)
        config.rng_seed = seed
    if engine["method"] != "none":
        config.num_assistant_tokens = engine["k"]
    if engine["method"] == "prompt_lookup":
        config.max_ngram_size = engine["max_ngram_size"]
    return config


def build_pipeline(engine: dict):
    import openvino_genai as ov_genai

    # fp32 compute and KV cache, like the local scorer: OpenVINO's CPU defaults are bf16 inference where the CPU
    # has it and a u8 KV cache, which move the logits (and greedy ties) away from the fp32 target law
    properties = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    extra = dict(properties)
    if engine["method"] == "draft_model":
        extra["draft_model"] = ov_genai.draft_model(engine["draft"], "CPU", **properties)
    if engine["method"] == "prompt_lookup":
        extra["prompt_lookup"] = True
    scheduler = ov_genai.SchedulerConfig()
    if engine["prefix_caching"] is not None:  # None: the pipeline's default
        scheduler.enable_prefix_caching = engine["prefix_caching"]
        extra["scheduler_config"] = scheduler
    if engine["pipeline"] == "llm":
        return ov_genai.LLMPipeline(engine["target"], "CPU", **extra)
    extra.pop("scheduler_config", None)
    return ov_genai.ContinuousBatchingPipeline(engine["target"], scheduler, "CPU", extra)


def request_counters(result, speculative: bool) -> dict:
    """The engine's own counters of one request (``LLMPipeline``: its ``EncodedResults``' metrics): the main model's
    tokens per inference step (``raw_metrics.m_batch_sizes``: a step that emitted b tokens accepted b − 1 drafts) and
    the tokens the draft generated (``SDPerModelsPerfMetrics.draft_model_metrics``; None for prompt lookup, whose results
carry no SD metrics: ``extended_perf_metrics`` is None)."""
    if not speculative:
        return {}
    metrics = result.extended_perf_metrics
    if metrics is None:  # prompt lookup: no draft model, no SD metrics; the main model's steps only
        steps = [int(b) for b in result.perf_metrics.raw_metrics.m_batch_sizes]
        return {"main_step_tokens": steps, "draft_generated": None, "accepted": None}
    return {"main_step_tokens": [int(b) for b in metrics.main_model_metrics.raw_metrics.m_batch_sizes],
            "draft_generated": int(metrics.draft_model_metrics.get_num_generated_tokens()),
            "accepted": int(metrics.get_num_accepted_tokens())}


def run_llm(pipe, engine: dict, job: dict, input_ids) -> dict:
    """One ``LLMPipeline.generate`` per seed (batch 1); an exception is recorded and the request run again once."""
    tokens, counters, errors = [], [], []
    for seed in job["seeds"]:
        config = generation_config(engine, job, seed)
        try:
            result = pipe.generate(input_ids, config)
        except RuntimeError as exc:
            errors.append({"seed": seed, "message": first_line(exc)})
            result = pipe.generate(input_ids, config)
        tokens.append([int(t) for t in result.tokens[0]])
        counters.append(request_counters(result, engine["method"] != "none"))
    return {"tokens": tokens, "counters": counters, "errors": errors}


def run_batching(pipe, engine: dict, job: dict, input_ids) -> dict:
    """Every seed's request added to one ``ContinuousBatchingPipeline`` and stepped together (what its
    ``generate`` does, but holding each request's handle); if a step raises, the whole batch is recorded once and
    run again.

    Counters per request, from its handle (``GenerationHandle.get_perf_metrics``): the main model's tokens per step
    (``main_step_tokens``); the pipeline keeps no per-request speculative metrics (``draft_generated`` and
    ``accepted`` are None; its ``SDPerModelsPerfMetrics`` are the whole call's).
    """
    errors = []
    try:
        return {**step_batch(pipe, engine, job, input_ids), "errors": errors}
    except RuntimeError as exc:
        errors.append({"seed": None, "message": first_line(exc)})
        return {**step_batch(pipe, engine, job, input_ids), "errors": errors}


def step_batch(pipe, engine: dict, job: dict, input_ids) -> dict:
    # request ids 0..n-1 in every job, as generate() numbers them, so prompt lookup gives generate()'s samples (the
    # draft model's samples vary from run to run either way: docs/audit-openvino.md)
    handles = [pipe.add_request(rid, input_ids, generation_config(engine, job, seed))
               for rid, seed in enumerate(job["seeds"])]
    tokens = [[] for _ in handles]
    try:
        while pipe.has_non_finished_requests():
            pipe.step()
            for row, handle in zip(tokens, handles):
                if handle.can_read():
                    for output in handle.read().values():  # one sequence per request
                        row += [int(t) for t in output.generated_ids]
    except RuntimeError:  # as generate() drops its requests when a step raises: cancel them, let them leave
        for handle in handles:
            handle.cancel()
        while pipe.has_non_finished_requests():
            pipe.step()
        raise
    counters = []
    for handle in handles:
        steps = [int(b) for b in handle.get_perf_metrics().raw_metrics.m_batch_sizes]
        counters.append({"main_step_tokens": steps, "draft_generated": None, "accepted": None}
                        if engine["method"] != "none" else {})
    return {"tokens": tokens, "counters": counters}


def run_job(pipe, engine: dict, job: dict) -> dict:
    import numpy as np
    import openvino as ov

    input_ids = ov.Tensor(np.array([job["prompt_ids"]], dtype=np.int64))
    started = time.perf_counter()
    reply = (run_llm if engine["pipeline"] == "llm" else run_batching)(pipe, engine, job, input_ids)
    reply["engine_seconds"] = time.perf_counter() - started
    return reply


def start(engine: dict) -> tuple:
    """The pipeline of ``engine``, held with its settings."""
    return build_pipeline(engine), engine


def version() -> dict:
    import openvino_genai as ov_genai

    return {"openvino_genai_version": ov_genai.__version__}


def answer(held: tuple, job: dict) -> dict:
    pipe, engine = held
    return run_job(pipe, engine, job)


if __name__ == "__main__":
    sys.exit(serve(start, answer, version))
