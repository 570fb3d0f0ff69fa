"""Worker process of mlx-lm's environment (``make mlx``): the bundled pair in MLX, jobs on stdin, JSON lines out.

Run by file path with that environment's interpreter (``python -P mlx_worker.py '<engine json>'``); it imports only
the standard library, MLX and mlx-lm, never ``specdec_lab``; the request loop and its protocol are
:mod:`~specdec_lab.adapters.worker_loop`'s. The engine JSON: ``target`` / ``draft`` (model folders that
``mlx_lm.load`` reads as they are: the bundled safetensors, fp32), ``method`` ("none": ``generate_step``;
"draft_model": ``speculative_generate_step`` with ``num_draft_tokens`` = ``k``), ``k``.

A sampling job: ``prompt_ids``, ``seeds`` (one request per seed: ``mx.random.seed(seed)`` before it; mlx-lm samples
from MLX's global key), ``length`` (exactly that many tokens: ``max_tokens``; mlx-lm's step generators never stop at
an end-of-text token), ``temperature`` (0: greedy), ``top_p`` (1: off), ``top_k`` (null: off), and optionally
``min_p`` (0: off), ``repetition_penalty`` (1: off) with ``repetition_context_size`` — mlx-lm's own
``make_sampler`` and ``make_logits_processors`` build the chain. Reply: ``tokens`` (one list per seed), ``from_draft``
(per request and token, mlx-lm's own flag: the token was the draft's, accepted), ``engine_seconds``, ``errors``
(none are caught: a raise fails the job).

Prompt cache: without logits processors the prompt's tokens matter only through the KV caches, so the worker
prefills the prompt (all but its last token) once per job, hands mlx-lm the last token with those caches
(``prompt_cache``: target layers, then draft layers) and trims the caches back to the prompt after each request
(``trim_prompt_cache``, as mlx-lm's server reuses a prompt cache). With logits processors every request gets the
whole prompt and fresh caches, so the penalties see what mlx-lm's own callers give them.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

# the shared request loop, loaded by path: this folder is not on sys.path here (worker_loop's docstring)
LOOP = runpy.run_path(str(Path(__file__).with_name("worker_loop.py")))
serve = LOOP["serve"]


def sampler_and_processors(job: dict):
    """mlx-lm's sampler and logits processors for the job's settings (its own factories)."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    top_k = 0 if job["top_k"] is None else job["top_k"]  # 0: off (make_sampler's default)
    top_p = 0.0 if job["top_p"] >= 1.0 else job["top_p"]  # 0: off
    sampler = make_sampler(temp=job["temperature"], top_p=top_p, min_p=job.get("min_p", 0.0), top_k=top_k)
    penalty = job.get("repetition_penalty", 1.0)
    processors = make_logits_processors(
        repetition_penalty=None if penalty == 1.0 else penalty,
        repetition_context_size=job.get("repetition_context_size", 20)) or None
    return sampler, processors


class Pair:
    """The loaded target and draft, and the request generator of the engine's method."""

    def __init__(self, engine: dict) -> None:
        from mlx_lm import load

        self.engine = engine
        self.target, _ = load(engine["target"])
        self.draft = load(engine["draft"])[0] if engine["method"] == "draft_model" else None

    def caches(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.target)
        return cache + (make_prompt_cache(self.draft) if self.draft is not None else [])

    def steps(self, prompt, length: int, sampler, processors, cache):
        """mlx-lm's generator for one request: (token, from_draft) pairs."""
        from mlx_lm.generate import generate_step, speculative_generate_step

        if self.draft is None:
            for token, _ in generate_step(prompt, self.target, max_tokens=length, sampler=sampler,
                                          logits_processors=processors, prompt_cache=cache):
                yield int(token), False
        else:
            for token, _, drafted in speculative_generate_step(
                    prompt, self.target, self.draft, num_draft_tokens=self.engine["k"], max_tokens=length,
                    sampler=sampler, logits_processors=processors, prompt_cache=cache):
                yield int(token), bool(drafted)


def parts(pair: Pair, cache: list) -> list[list]:
    """The target's caches, then the draft's (when it has one): the halves of ``prompt_cache``."""
    layers = len(pair.target.layers)
    return [cache[:layers]] + ([cache[layers:]] if pair.draft is not None else [])


def prefilled(pair: Pair, prompt) -> tuple[list, int]:
    """Caches holding ``prompt`` but its last token (each model fed it once, as ``_prefill`` does); their length."""
    import mlx.core as mx

    cache = pair.caches()
    for model, part in zip((pair.target, pair.draft), parts(pair, cache)):
        if prompt.size > 1:
            model(prompt[:-1][None], cache=part)
            mx.eval([c.state for c in part])
    return cache, prompt.size - 1


def run_job(pair: Pair, job: dict) -> dict:
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    prompt = mx.array(job["prompt_ids"], dtype=mx.uint32)
    sampler, processors = sampler_and_processors(job)
    reuse = processors is None
    cache, kept = prefilled(pair, prompt) if reuse else (None, 0)
    tokens, flags = [], []
    started = time.perf_counter()
    for seed in job["seeds"]:
        mx.random.seed(seed)
        steps = list(pair.steps(prompt[-1:] if reuse else prompt, job["length"], sampler, processors,
                                cache if reuse else None))
        tokens.append([t for t, _ in steps])
        flags.append([d for _, d in steps])
        if reuse:  # back to the prompt: what this request added is cut off each model's caches
            for part in parts(pair, cache):
                trim_prompt_cache(part, part[0].offset - kept)
    return {"tokens": tokens, "from_draft": flags, "engine_seconds": time.perf_counter() - started, "errors": []}


def start(engine: dict) -> Pair:
    return Pair(engine)


def version() -> dict:
    from importlib.metadata import version as installed

    return {"mlx_lm_version": installed("mlx-lm"), "mlx_version": installed("mlx")}


def answer(pair: Pair, job: dict) -> dict:
    return run_job(pair, job)


if __name__ == "__main__":
    sys.exit(serve(start, answer, version))
