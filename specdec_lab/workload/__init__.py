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

Every outcome counted
---------------------
A token cell judges the law of (token 1, token 2, how the completion ended): an ending by EOS is an outcome with its
exact probability; a completion cut short, stopped with neither EOS nor stop string, or unmappable is an outcome of
probability 0 that rejects (:mod:`specdec_lab.workload.judge`). Nothing answered is dropped.

Verdicts
--------
The words and rules are :mod:`specdec_lab.verdicts` (``engine_row``): Holm across cells for rejection, the TV bounds
simultaneous over the cells (δ split), each judgement a look whose levels are spent so that resuming keeps the error
rates, and ``--until-decided`` with an anytime-valid e-process (:mod:`specdec_lab.workload.sequential`). Beside the
cells, a workload-level certificate bounds the per-request average TV under the workload's mix
(:func:`specdec_lab.workload.judge.workload_bound`).

Two-sample mode (``--reference-url``) sends the same seeded requests to a reference server and certifies
TV(server, reference) per cell by coupling same-seed pairs, or by two independent samples where they mismatch too
often (:mod:`specdec_lab.workload.two_sample`).
"""

from specdec_lab.workload.cells import (BOUNDED_LENGTH, DEFAULT_WORKLOAD, Cell, Workload, WorkloadError, load_workload,
                                        parse_workload)
from specdec_lab.workload.judge import (CellResult, cell_drafting, counter_drafting, final_verdicts, judge_categorical,
                                        judge_cell, plan_cells, summary_line, workload_bound)
from specdec_lab.workload.requests import ENGINES, EngineProfile, interleaved_jobs, request_body, request_seed
from specdec_lab.workload.run import WorkloadRun, audit_workload, collect_workload, read_counters, throughput
from specdec_lab.workload.store import SCHEMA, CellStore, outcome_rows
from specdec_lab.workload.two_sample import two_sample_results

__all__ = ["BOUNDED_LENGTH", "DEFAULT_WORKLOAD", "ENGINES", "SCHEMA", "Cell", "CellResult", "CellStore", "EngineProfile",
           "Workload", "WorkloadError", "WorkloadRun", "audit_workload", "cell_drafting", "collect_workload",
           "counter_drafting", "final_verdicts", "interleaved_jobs", "judge_categorical", "judge_cell", "load_workload",
           "outcome_rows", "parse_workload", "plan_cells", "read_counters", "request_body", "request_seed",
           "summary_line", "throughput", "two_sample_results", "workload_bound"]
