"""A cell's requests: the engine's request dialect (:data:`ENGINES`), distinct seeds, interleaved jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass

from specdec_lab.adapters.endpoint import LLAMA_SERVER_NEUTRAL
from specdec_lab.adapters.workload_client import Job
from specdec_lab.workload.cells import Cell, Workload

SEED_HIGH = 2**32 - 1  # llama.cpp seeds are uint32 (0xFFFFFFFF means "random" there)


@dataclass(frozen=True)
class EngineProfile:
    """How an engine names the request fields, which neutral values it needs, its sampler order, and where its
    drafts are counted: per request in the reply (``counter_rule`` None: llama-server's ``timings.draft_n``) or
    only in its aggregate Prometheus counters (``counter_rule``: a :data:`specdec_lab.drafting.COUNTER_RULES` key)."""

    order: str
    neutral: tuple
    fields: dict  # our field -> the engine's request field
    counter_rule: str | None = None
    choice: str = "grammar"  # how a choice list is asked: "grammar" (GBNF, llama-server) or "structured_outputs" (vLLM)
    logprobs: str = ""  # the law a returned logprob is of ("raw": the model's, before any processing) and where it says so
    numerics: float = 0.01  # nats / logits: the precision tolerance of a returned logprob or a greedy near-tie
    seeds: str = ""  # where the engine documents its seed semantics


ENGINES = {
    # llama.cpp's llama-server (tools/server/server-schema.cpp), and our own batch server, which speaks the same
    "llama.cpp": EngineProfile(
        "llama.cpp", LLAMA_SERVER_NEUTRAL + (("repeat_last_n", 64),), {"repetition_penalty": "repeat_penalty", "n": "n"},
        logprobs="raw: the softmax of the model's logits before sampling (tools/server/server-context.cpp "
                 "populate_token_probs, post_sampling_probs false)",
        seeds="a request's choice k is seeded with seed + k (tools/server/server-task.h); the same seed and settings "
              "replay the same tokens, whatever the batch"),
    # vLLM's OpenAI server (entrypoints/openai/completion/protocol.py at 0.32): top_k, min_p and
    # repetition_penalty are its extra sampling fields; return_token_ids puts the ids in each choice
    "vllm": EngineProfile(
        "vllm", (("return_token_ids", True),), {"repetition_penalty": "repetition_penalty", "n": "n"},
        counter_rule="uncapped", choice="structured_outputs",
        logprobs="raw: log-softmax of the model's logits before any processing (logprobs_mode 'raw_logprobs', the "
                 "default: vllm/config/model.py)",
        seeds="a per-request seed makes its sampling reproducible; batch invariance is not promised on every "
              "platform (docs: reproducibility)"),
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
    if cell.choice:
        body.update({"grammar": choice_grammar(cell.choice)} if profile.choice == "grammar" else
                    {"structured_outputs": {"choice": list(cell.choice)}})
    return body


def choice_grammar(choices: tuple) -> str:
    """A GBNF grammar (llama.cpp's) whose language is exactly ``choices``.

    >>> choice_grammar((" ay", 'say "no"'))
    'root ::= " ay" | "say \\\\"no\\\\""'
    """
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def request_seed(run_seed: int, cell_index: int, request: int) -> int:
    """Distinct uint32 seeds: one block of 2^24 per cell (distinct across cells and requests of one run; runs of
    other ``run_seed`` start their blocks elsewhere).

    >>> request_seed(0, 0, 5), request_seed(0, 1, 0) - request_seed(0, 0, 0)
    (5, 16777216)
    """
    return (run_seed * 4093 * 2**24 + cell_index * 2**24 + request) % SEED_HIGH


def interleaved_jobs(workload: Workload, requests: dict[str, list[int]], engine: str, model: str,
                     run_seed: int, index_of: dict[str, int] | None = None) -> list[Job]:
    """The jobs of every cell, group by group, interleaved request by request within a group. ``index_of``: each
    cell's place in the run's whole workload, which picks its block of seeds (default: its place in ``workload``;
    a round over some of the cells passes the whole workload's, so a cell keeps its block)."""
    jobs = []
    index_of = index_of or {c.name: i for i, c in enumerate(workload.cells)}
    for cells in workload.groups().values():
        longest = max((len(requests.get(c.name, ())) for c in cells), default=0)
        for k in range(longest):
            for cell in cells:
                if k < len(requests.get(cell.name, ())):
                    r = requests[cell.name][k]
                    # seeds spaced by n: llama-server (server-task.h add_child) and vLLM seed a request's choice k
                    # with seed + k, so consecutive seeds would make request r's choice k request r + k's choice 0
                    seed = request_seed(run_seed, index_of[cell.name], r * cell.n) if cell.seeded else None
                    jobs.append(Job(cell.name, r, request_body(cell, engine, model, workload.max_tokens, seed)))
    return jobs
