"""Audit an implementation we did not write: collect → score against the exact p → suite → table.

Any sampler with ``describe()``/``draw()`` works (see :mod:`specdec_lab.adapters`): Hugging Face
``generate`` with an assistant model or prompt lookup, an OpenAI-compatible server, or our own
samplers as a reference. The samples go through :func:`specdec_lab.collect.collect` (resumable
parquet with the implementation's settings and version in the metadata), are scored under the
exact target law p at ``scored_at`` (by default the settings the implementation was asked for),
and judged by the same suite as :mod:`specdec_lab.verify`: **equivalent** (not rejected and the TV
upper bound on the joint law of tokens 1–2 ≤ ε), **rejected**, or **inconclusive**.

Engines draw token 1 with the target alone, so an engine verdict bounds the joint law of tokens 1–2
(the first bounded law that holds a drafted position), reports the token-1 bound as a control of the
engine's plain sampling, and needs the engine's own counters to show that a bounded position was drafted
in at least half of the samples: otherwise an equivalent speculative row is *inconclusive (drafting not
exercised)* (:mod:`specdec_lab.drafting`). Every summary row carries ``bounded positions``,
``drafted share`` and ``acceptance``.

A negative control runs through the same path: ask the implementation for one setting and score
it at another (e.g. HF at T = 0.7 scored at T = 1); it must come out rejected, which shows the
audit can see a wrong law through that adapter.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab import drafting as drafting_
from specdec_lab.collect import SampleSet, collect
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteResult, SuiteSettings, run_suite, score

# Default prompts of the engine audits (``--prompt`` overrides). An engine verdict bounds the joint law of tokens
# 1–2, which costs samples in proportion to that law's spread; after a speaker tag the target's token 1 is the
# newline (p = 0.995 at T = 1, 1.000 at T = 0.7 and with top-p 0.9), so the joint law is about the law of token
# 2 alone and the joint bound costs about what a single-token bound costs (at ε = 0.02 with assurance 0.999,
# about the token-1 bound's m after "ROMEO:\n"), while token 2 — the first drafted one — keeps
# a broad law (top token 0.13), so drafts are rejected often enough to exercise the residual.
DEFAULT_PROMPT = "HAMLET."
# Prompt lookup drafts only where the context's last n-gram recurs in it, and keeps drafting only while the
# continuation follows the context: this prompt repeats a line the target knows and stops inside a word, so
# token 1 is concentrated ("u", p = 0.992), the lookup finds "plag" + "u" earlier and drafts the rest of the line
# ("e o' both your houses!"), token 2 is that draft's "e" with p = 0.84, and later steps keep finding the line.
# (After a repeated speaker tag, "HAMLET.\n…\nHAMLET.", token 2 is drafted in every sample too, but the target
# rarely copies the line — 4 of 300 accepted — so only 60% of the later steps find an n-gram to draft from.)
LOOKUP_PROMPT = "MERCUTIO.\nA plague o' both your houses!\nMERCUTIO.\nA plag"
EXPECTED = ("lossless", "negative control")
NEGATIVE_CONTROL_SAMPLES = 3000  # a wrong law at TV ≈ 0.1 is rejected with power ≈ 1 at this size


def plan_audit_samples(pair, prompt: str, sampling: SamplingConfig, tolerance: float = 0.02,
                       assurance: float = 0.999, seed: int = 0) -> int:
    """Samples m at which a correct engine's bound on the joint law of tokens 1–2 is below ``tolerance`` with
    probability ``assurance`` (:func:`stats.plan_bound_by_simulation` on the exact joint law after ``prompt``
    at ``sampling``, as ``verify`` plans its rows)."""
    from specdec_lab import stats
    from specdec_lab.suite import two_token_law

    law = two_token_law(pair, pair.encode(prompt), sampling)
    return stats.plan_bound_by_simulation(law.joint, tolerance, assurance=assurance,
                                          rng=np.random.default_rng(seed))


def settings_label(sampling: SamplingConfig) -> str:
    """Short text for a sampling configuration.

    >>> settings_label(SamplingConfig(temperature=0.7, top_p=0.9))
    'T=0.7 top-p=0.9'
    """
    parts = [f"T={sampling.temperature:g}"]
    if sampling.top_k is not None:
        parts.append(f"top-k={sampling.top_k}")
    if sampling.top_p < 1.0:
        parts.append(f"top-p={sampling.top_p:g}")
    return " ".join(parts)


def extra_label(extra: dict) -> str:
    """Request fields that are not llama.cpp's neutral values (e.g. its own sampler defaults).

    >>> extra_label({"top_k": 40, "min_p": 0.0})
    ' top_k=40'
    """
    from specdec_lab.adapters.endpoint import LLAMA_CPP_NEUTRAL, LLAMA_SERVER_NEUTRAL

    neutral = {**dict(LLAMA_CPP_NEUTRAL), **dict(LLAMA_SERVER_NEUTRAL)}
    return "".join(f" {k}={v}" for k, v in sorted(extra.items()) if neutral.get(k, object()) != v)


def implementation_label(described: dict) -> str:
    """Name of the implementation from a sampler's ``describe()``."""
    if described.get("sampler") == "hf_generate":
        k = f" K={described['k']}" if "k" in described else ""
        return f"HF transformers {described['transformers_version']} {described['mode']}{k}"
    if described.get("sampler") == "vllm_offline":
        k = f" K={described['k']}" if "k" in described else ""
        patch = f" + our {described['patch']} fix" if described.get("patch") else ""
        return f"vLLM {described['vllm_version']} offline, {described['method']}{k}{patch}"
    if described.get("sampler") == "openvino_genai":
        k = f" K={described['k']}" if "k" in described else ""
        cache = {None: "", True: ", prefix caching on", False: ", prefix caching off"}[described.get("prefix_caching")]
        return (f"OpenVINO GenAI {described['openvino_genai_version']} {described['pipeline']}, "
                f"{described['method']}{k}{cache}")
    if described.get("sampler") == "ortgenai":
        k = f" K={described['k']}" if "k" in described else ""
        return f"ONNX Runtime GenAI {described['ortgenai_version']}, {described['method']}{k}"
    if described.get("sampler") == "endpoint":
        server = described.get("server") or "OpenAI-compatible server"
        return f"{server} `{described['model']}`"
    return described.get("verifier", described.get("sampler", "sampler"))


@dataclass
class AuditResult:
    """One audited setting: the suite's verdict, the samples and what they were scored against."""

    name: str
    expected: str
    suite: SuiteResult
    samples: SampleSet
    scored_at: SamplingConfig
    seconds: float
    notes: dict = field(default_factory=dict)
    collect_seconds: float = float("nan")  # wall time of this call's collection (≈ 0 when a finished file was reloaded)

    @property
    def drafting(self) -> drafting_.Drafting:
        """Where the engine drafted within the bounded positions (tokens 1–2), from its own counters."""
        described = self.samples.meta["sampler"]
        stats = dict(self.samples.meta.get("stats") or {})
        if described.get("sampler") == "vllm_offline" and "requests" in stats:  # whole requests of n ran
            stats.setdefault("sequences", stats["requests"] * described["n_per_request"])
        return drafting_.drafting_evidence(stats, self.suite.m,
                                           drafting_.speculates(described), drafting_.counter_source(described))

    @property
    def verdict(self) -> str:
        """The suite's verdict, made *inconclusive (drafting not exercised)* for an equivalent speculative
        row whose bounded positions were not shown to be drafted in at least half of the samples."""
        return drafting_.engine_verdict(self.suite.verdict, self.drafting)

    def summary(self) -> dict:
        """One table row: implementation × settings → verdict, TV bound, samples."""
        described = self.samples.meta["sampler"]
        asked = SamplingConfig(temperature=described["temperature"], top_k=described["top_k"],
                               top_p=described["top_p"])
        settings = settings_label(asked) + extra_label(described.get("extra") or {})
        if settings_label(self.scored_at) != settings_label(asked):
            settings += f", scored at {settings_label(self.scored_at)}"
        from specdec_lab.adapters.endpoint import speculation_summary

        stats = self.samples.meta.get("stats") or {}
        per_pass = (stats["emitted_tokens"] / stats["target_passes"] if stats.get("target_passes")
                    and "emitted_tokens" in stats else np.nan)
        if stats.get("draft_steps"):  # vLLM's own counters: mean acceptance length per verification pass
            per_pass = 1 + stats["accepted_tokens"] / stats["draft_steps"]
        s, drafted, verdict = self.suite, self.drafting, self.verdict
        joint = float("nan") if s.joint_bound is None else s.joint_bound.upper
        words = s.verdict_text + "; " + drafted.words()
        if verdict != s.verdict:
            words = f"{verdict}: {words}"
        return {"implementation": self.name, "settings": settings, "expected": self.expected,
                "L": self.samples.meta["length"], "m": s.m, **drafted.columns(),
                "TV plug-in": s.joint_tv_plugin, "TV upper 99%": joint,
                "TV upper 99% (token 1)": s.tv_bound.upper, "KL (MM)": s.kl, "Holm p": s.global_pvalue,
                "tokens/pass": per_pass, "refused": stats.get("refused_samples", 0),
                **speculation_summary(stats), **engine_errors(stats),
                "verdict": verdict, "correct call": correct_call(verdict, self.expected),
                "in words": words, "seconds": round(self.seconds, 1),
                "samples/s": samples_per_second(s.m, stats, self.collect_seconds)}

    def tests(self) -> pd.DataFrame:
        """Every test's statistic and p-value."""
        return pd.DataFrame(self.suite.rows())


def engine_errors(stats: dict) -> dict:
    """Requests the engine raised on (each run again with the same seed: OpenVINO GenAI's worker) and its messages
    (stats keys ``engine error: <message>``); empty for an engine that does not count them.

    >>> engine_errors({"engine_errors": 2, "engine error: Check failed": 2})
    {'engine errors': 2, 'engine messages': 'Check failed (2)'}
    """
    if "engine_errors" not in stats:
        return {}
    messages = [f"{key.split(': ', 1)[1]} ({int(count)})" for key, count in stats.items()
                if key.startswith("engine error: ")]
    return {"engine errors": int(stats["engine_errors"]), "engine messages": "; ".join(messages)}


def samples_per_second(m: int, stats: dict, collect_seconds: float) -> float:
    """Throughput of the audited engine: m over the engine's own time where it reports one (vLLM's
    offline worker: ``engine_seconds``, the generate calls alone), else over this call's collection
    wall time (requests, retries and the adapter included); NaN for a reloaded file.

    >>> samples_per_second(1000, {"engine_seconds": 2.0}, 9.0), samples_per_second(1000, {}, 4.0)
    (500.0, 250.0)
    """
    if stats.get("engine_seconds"):
        return m / stats["engine_seconds"]
    return m / collect_seconds if collect_seconds > 1.0 else float("nan")


def correct_call(verdict: str, expected: str) -> bool:
    """A lossless implementation must be equivalent; a negative control must be rejected."""
    return verdict == ("equivalent" if expected == "lossless" else "rejected")


def audit(pair, sampler, n: int, length: int, path: str | Path, *, prompt: str = DEFAULT_PROMPT,
          seed: int = 0, scored_at: SamplingConfig | None = None, name: str | None = None,
          expected: str = "lossless", settings: SuiteSettings = SuiteSettings(), batch_size: int = 500,
          progress: bool = True) -> AuditResult:
    """Collect ``n`` samples of ``length`` tokens from ``sampler`` and judge them against p.

    The verdict bounds the joint law of tokens 1–2 at ``settings.tolerance`` (``settings.joint_tolerance``
    when set) and, for a speculative sampler, needs its drafting shown at a bounded position
    (:attr:`AuditResult.verdict`).

    Parameters
    ----------
    pair : ModelPair
        The local copy of the target (and draft): the exact law p comes from ``pair.target``.
    sampler : object with ``describe()``, ``draw()`` and ``sampling``
        An adapter from :mod:`specdec_lab.adapters` (or any of our samplers).
    n, length : int
        Samples and new tokens per sample.
    path : path
        Parquet file of the samples; an interrupted collection resumes, a finished one is reloaded.
    scored_at : SamplingConfig, optional
        The target law to test against; default ``sampler.sampling``.
    expected : {"lossless", "negative control"}
        What a correct call is; recorded in the summary's "correct call" column.
    batch_size : int
        Samples per resumable part file (500 ≈ 15 s of HF generate here).

    Returns
    -------
    AuditResult
        ``.summary()`` is one table row; ``.suite`` holds every test.
    """
    if expected not in EXPECTED:
        raise ValueError(f"unknown expectation {expected!r}; valid: {', '.join(EXPECTED)}")
    if length < 2:
        raise ValueError("an audit bounds the joint law of tokens 1–2 (engines draft from token 2 on): "
                         f"length must be >= 2, got {length}")
    if settings.joint_tolerance is None:
        settings = replace(settings, joint_tolerance=settings.tolerance)
    started = time.time()
    samples = collect(pair, sampler, prompt, n, length, seed, path, batch_size=batch_size, progress=progress)
    collected = time.time() - started
    tokens = samples.tokens()  # (n, L)
    scored_at = scored_at or sampler.sampling
    name = name or implementation_label(samples.meta["sampler"])
    scores = score(pair, pair.encode(prompt), tokens, scored_at, settings.min_prefix_count)
    suite = run_suite(name, tokens, scores, settings, np.random.default_rng(seed))
    return AuditResult(name, expected, suite, samples, scored_at, time.time() - started,
                       collect_seconds=collected)


def second_token_bounds(pair, prompt: str, tokens: np.ndarray, sampling: SamplingConfig, top: int = 3,
                        confidence: float = 0.99) -> pd.DataFrame:
    """TV upper bounds on the law of token 2 given each of the ``top`` most frequent first tokens.

    For engines that never speculate on the first token (llama-server samples it from the prompt's pass),
    token 2 is the first drafted position, so these bounds speak for the speculative path where the
    first-token bound of the verdict cannot. Each is a bound for that one prefix, at ``confidence``.
    """
    import torch

    from specdec_lab import stats
    from specdec_lab.sampling import to_probs

    ids = pair.encode(prompt)
    first, counts = np.unique(tokens[:, 0], return_counts=True)
    rows = []
    for x1 in first[np.argsort(-counts)][:top]:
        following = tokens[tokens[:, 0] == x1, 1]
        with torch.no_grad():
            logits = pair.target(torch.cat([ids, torch.tensor([int(x1)])])[None].to(pair.device)).logits
        p = to_probs(logits[0, -1, : pair.vocab_size].double().cpu(), sampling).numpy()  # (V,)
        bound = stats.tv_upper_bound(np.bincount(following, minlength=len(p)), p, confidence=confidence)
        rows.append({"first token": pair.decode([int(x1)]), "m": len(following),
                     "TV plug-in": stats.tv_plugin(np.bincount(following, minlength=len(p)), p),
                     f"TV upper {confidence:.0%}": bound.upper})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class AuditCase:
    """One row of an audit table: a sampler, what it is scored at, and what a correct call is."""

    sampler: object
    scored_at: SamplingConfig | None = None
    expected: str = "lossless"
    prompt: str = DEFAULT_PROMPT
    name: str | None = None


def run_audits(pair, cases: list[AuditCase], n: int, length: int, out: str | Path, *, seed: int = 0,
               settings: SuiteSettings = SuiteSettings(), progress: bool = True) -> pd.DataFrame:
    """Audit every case (samples under ``out/``) and return the summary table, one row per case.

    The notebook-sized entry point: one call, one DataFrame (``.attrs["results"]`` keeps the
    :class:`AuditResult` objects for plots and per-test tables).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for index, case in enumerate(cases):
        results.append(audit(pair, case.sampler, n, length, out / f"{index:02d}.parquet", prompt=case.prompt,
                             seed=seed + index, scored_at=case.scored_at, name=case.name,
                             expected=case.expected, settings=settings, progress=progress))
    table = audit_table(results)
    table.attrs["results"] = results
    return table


def audit_table(results: list[AuditResult]) -> pd.DataFrame:
    """Summary rows of several audits as a DataFrame."""
    return pd.DataFrame([r.summary() for r in results])


# ---------------------------------------------------------------- command line: specdec-lab audit


def add_audit_parser(sub) -> None:
    """Add ``specdec-lab audit hf|endpoint`` to the CLI's subparsers."""
    from specdec_lab.adapters.hf import MODES, SCHEDULES

    audit_parser = sub.add_parser("audit", help="audit an implementation we did not write (HF generate, a server)")
    kinds = audit_parser.add_subparsers(dest="kind", required=True)
    hf = kinds.add_parser("hf", help="Hugging Face generate: assisted generation, prompt lookup or plain")
    hf.add_argument("--mode", default="assisted", choices=list(MODES))
    hf.add_argument("--k", type=int, default=4, help="num_assistant_tokens / prompt_lookup_num_tokens")
    hf.add_argument("--schedule", default="constant", choices=list(SCHEDULES))
    hf.add_argument("--confidence-threshold", type=float, default=0.4,
                    help="HF's assistant_confidence_threshold (its default 0.4)")
    _pair_and_common_args(hf, samples=3000, length=6)  # L = K + 2: every draft position, the bonus, the next block
    hf.set_defaults(func=cmd_audit)

    ep = kinds.add_parser("endpoint", help="an OpenAI-compatible /v1/completions server")
    ep.add_argument("--base-url", help="e.g. http://127.0.0.1:8080 (omit with --serve-bundled)")
    ep.add_argument("--model", help="the request's model field (default with --serve-bundled: target)")
    ep.add_argument("--serve-bundled", action="store_true",
                    help="convert the bundled target to GGUF and serve it for this run: with llama-cpp-python "
                         "(--model target or target-lookup) or llama.cpp's llama-server (--model target-draft: "
                         "with the bundled draft, K=4; target-nodraft: without; `make llama-cpp` builds it)")
    ep.add_argument("--llama-cpp-neutral", action="store_true",
                    help="send top_k=0, min_p=0, repeat_penalty=1, ... (llama.cpp's own defaults are not neutral; "
                         "on by default with --serve-bundled)")
    ep.add_argument("--extra", default="{}", help="further request fields as JSON, e.g. '{\"top_k\": 0}'")
    ep.add_argument("--n-per-request", type=int, default=1, help="OpenAI's n")
    ep.add_argument("--logprobs", type=int, default=1, help="logprobs per token (-1: don't ask)")
    ep.add_argument("--server-label", default=None, help="name of the server in the table")
    ep.add_argument("--timeout", type=float, default=30.0)
    ep.add_argument("--retries", type=int, default=5)
    ep.add_argument("--max-rate", type=float, default=200.0, help="requests per second at most")
    ep.add_argument("--speculative", choices=["yes", "no", "unknown"], default="unknown",
                    help="does the server speculate? 'no': a reference row (no drafting required); 'yes'/'unknown': "
                         "equivalent only where its counters show drafting at a bounded position "
                         "(set by --serve-bundled)")
    ep.add_argument("--server-metrics", action="store_true",
                    help="read the server's Prometheus /metrics (vLLM, llama-server) around each batch")
    ep.add_argument("--drafting-rule", choices=["room", "uncapped"], default=None,
                    help="how the server's counters attribute drafts to token 2: 'room' (llama-server: exact at "
                         "L <= 3), 'uncapped' (vLLM: exact at L = 2); see specdec_lab.drafting")
    _pair_and_common_args(ep, samples=3000, length=3)  # llama-server's counters attribute token 2 exactly at L <= 3
    ep.set_defaults(func=cmd_audit)

    from specdec_lab.adapters.vllm import METHODS as VLLM_METHODS

    vl = kinds.add_parser("vllm", help="vLLM (CPU build in .venv-vllm): offline LLM.generate or vllm serve")
    vl.add_argument("--method", default="draft_model", choices=list(VLLM_METHODS))
    vl.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    path = vl.add_mutually_exclusive_group()
    path.add_argument("--offline", dest="serve", action="store_false", help="vllm.LLM.generate in a worker (default)")
    path.add_argument("--serve", dest="serve", action="store_true", help="vllm serve on loopback, via the endpoint adapter")
    vl.add_argument("--head", default=None, help="Medusa/EAGLE/EAGLE-3 head directory in vLLM's layout")
    vl.add_argument("--n-per-request", type=int, default=8, help="vLLM's n (completions per request)")
    vl.add_argument("--job-size", type=int, default=2048,
                    help="samples per LLM.generate call at most (fewer for long prompts, so that no seeded prefill "
                         "is split across engine steps: vLLM's CPU build crashes on it)")
    vl.add_argument("--patch", default=None, choices=["vllm-cpu-expand"],
                    help="opt-in fix of ours applied inside the worker (specdec_lab/patches; the installed vLLM files "
                         "stay as they are): vllm-cpu-expand gives the CPU expand_batch_to_tokens a float path")
    vl.add_argument("--concurrency", type=int, default=4, help="requests in flight (--serve)")
    _pair_and_common_args(vl, samples=3000, length=2)  # vLLM's counters attribute token 2 exactly at L = 2
    vl.set_defaults(func=cmd_audit, serve=False)

    from specdec_lab.adapters.openvino import METHODS as OPENVINO_METHODS, PIPELINES as OPENVINO_PIPELINES

    ov = kinds.add_parser("openvino", help="OpenVINO GenAI (CPU, in its own environment: `make openvino`)")
    ov.add_argument("--method", default="draft_model", choices=list(OPENVINO_METHODS))
    ov.add_argument("--pipeline", default="llm", choices=list(OPENVINO_PIPELINES),
                    help="LLMPipeline (one request per call; drafts counted per request) or ContinuousBatchingPipeline")
    ov.add_argument("--k", type=int, default=4, help="num_assistant_tokens")
    ov.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    ov.add_argument("--prefix-caching", choices=["default", "on", "off"], default="default",
                    help="SchedulerConfig.enable_prefix_caching (default: the pipeline's own; on for LLMPipeline with a "
                         "draft: docs/audit-openvino.md)")
    _pair_and_common_args(ov, samples=3000, length=3)  # OpenVINO's counters attribute token 2 exactly at L = 3
    ov.set_defaults(func=cmd_audit)

    from specdec_lab.adapters.ortgenai import METHODS as ORTGENAI_METHODS

    og = kinds.add_parser("ortgenai", help="ONNX Runtime GenAI (CPU, in its own environment: `make ortgenai`)")
    og.add_argument("--method", default="draft_model", choices=list(ORTGENAI_METHODS))
    og.add_argument("--k", type=int, default=4, help="speculative.max_draft_tokens")
    og.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    _pair_and_common_args(og, samples=3000, length=2)  # its counters place drafts at tokens 1 and 2 exactly at L = 2
    og.set_defaults(func=cmd_audit)

    from specdec_lab.workload import add_workload_parser

    add_workload_parser(kinds)  # specdec-lab audit workload

    from specdec_lab.adapters.llamacpp import DRAFT_TOKENS

    ls = kinds.add_parser("llama-speculative", help="llama.cpp's llama-speculative example on the bundled pair "
                                                    "(one process per sample; `make llama-cpp` builds it)")
    ls.add_argument("--samples", type=int, default=2000)
    ls.add_argument("--length", type=int, default=DRAFT_TOKENS + 2)
    ls.add_argument("--temperature", type=float, default=1.0)
    ls.add_argument("--seed", type=int, default=0)
    ls.add_argument("--tolerance", type=float, default=0.02, help="ε of the equivalence verdict")
    ls.add_argument("--out", type=Path, required=True, help="sample file (parquet; resumes)")
    ls.set_defaults(func=cmd_llama_speculative)


def _pair_and_common_args(parser, samples: int, length: int) -> None:
    from specdec_lab.models import add_pair_arguments

    add_pair_arguments(parser)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--scored-temperature", type=float, default=None,
                        help="score at this temperature instead (a negative control: must be rejected)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples (default: planned from the exact joint law of tokens 1-2 after the prompt, so a "
                             "correct engine is equivalent with probability 0.999; a negative control: "
                             f"{samples})")
    parser.add_argument("--length", type=int, default=length)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", default=None,
                        help=f"default {DEFAULT_PROMPT!r} ({LOOKUP_PROMPT!r} for prompt lookup)")
    parser.add_argument("--tolerance", type=float, default=0.02, help="ε of the equivalence verdict")
    parser.add_argument("--out", type=Path, default=None, help="sample file (default reports/audit/<name>.parquet)")
    parser.add_argument("--quiet", action="store_true")


def _sampler_from_args(args, sampling: SamplingConfig):
    from specdec_lab.adapters import llamacpp
    from specdec_lab.adapters.endpoint import LLAMA_CPP_NEUTRAL, LLAMA_SERVER_NEUTRAL, EndpointConfig
    from specdec_lab.adapters.hf import HFGenerateConfig

    if args.kind == "vllm" and not args.serve:
        from specdec_lab.adapters.vllm import VllmOfflineConfig

        return VllmOfflineConfig(method=args.method, sampling=sampling, k=args.k, draft=args.head,
                                 n_per_request=args.n_per_request, progress=not args.quiet, patch=args.patch,
                                 job_size=args.job_size)
    if args.kind == "openvino":
        from specdec_lab.adapters.openvino import OpenvinoConfig

        return OpenvinoConfig(method=args.method, pipeline=args.pipeline, sampling=sampling, k=args.k,
                              job_size=args.job_size, progress=not args.quiet,
                              prefix_caching={"default": None, "on": True, "off": False}[args.prefix_caching])
    if args.kind == "ortgenai":
        from specdec_lab.adapters.ortgenai import OrtGenaiConfig

        return OrtGenaiConfig(method=args.method, sampling=sampling, k=args.k, job_size=args.job_size,
                              progress=not args.quiet)
    if args.kind == "hf":
        return HFGenerateConfig(mode=args.mode, sampling=sampling, k=args.k, schedule=args.schedule,
                                confidence_threshold=args.confidence_threshold, progress=not args.quiet)
    llama_server = args.serve_bundled and args.model in llamacpp.SERVER_ALIASES
    neutral = LLAMA_SERVER_NEUTRAL if llama_server else LLAMA_CPP_NEUTRAL
    extra = dict(neutral) if (args.llama_cpp_neutral or args.serve_bundled) else {}
    extra.update(json.loads(args.extra))
    speculative, rule = (None if args.speculative == "unknown" else args.speculative == "yes"), args.drafting_rule
    if args.serve_bundled:  # the bundled aliases: which speculate, and where their drafts are counted
        speculative = args.model in ("target-lookup", "target-draft")
        rule = {"target-lookup": "lookup-calls", "target-draft": "room"}.get(args.model)
    return EndpointConfig(args.base_url, args.model, sampling, extra=tuple(sorted(extra.items())),
                          server_metrics=llama_server or args.server_metrics, speculative=speculative,
                          drafting_rule=rule,
                          n_per_request=args.n_per_request, logprobs=None if args.logprobs < 0 else args.logprobs,
                          server=args.server_label, timeout=args.timeout, retries=args.retries,
                          max_rate=args.max_rate, progress=not args.quiet)


def cmd_audit(args) -> int:
    """Run one audit from the command line; exit 0 when the verdict is the expected one."""
    from specdec_lab.adapters import llamacpp
    from specdec_lab.adapters import vllm as vllm_adapter
    from specdec_lab.models import pair_from_args

    if args.kind == "vllm" and args.temperature == 0:
        return _greedy_vllm(args)
    if args.kind in ("openvino", "ortgenai") and args.temperature == 0:
        return _greedy_cpu_engine(args)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    scored_at = None if args.scored_temperature is None else \
        SamplingConfig(temperature=args.scored_temperature, top_k=args.top_k, top_p=args.top_p)
    expected = "lossless" if scored_at is None else "negative control"
    lookup = getattr(args, "mode", None) == "prompt_lookup" or getattr(args, "model", None) == "target-lookup" \
        or getattr(args, "method", None) in ("ngram", "prompt_lookup")
    args.prompt = args.prompt if args.prompt is not None else (LOOKUP_PROMPT if lookup else DEFAULT_PROMPT)
    pair = pair_from_args(args)
    if args.samples is None:
        if scored_at is not None:
            args.samples = NEGATIVE_CONTROL_SAMPLES
        else:
            args.samples = plan_audit_samples(pair, args.prompt, sampling, args.tolerance, seed=args.seed)
            print(f"planned m = {args.samples:,}: the joint bound on tokens 1-2 after {args.prompt!r} reaches "
                  f"ε = {args.tolerance:g} with probability 0.999 for a correct engine", flush=True)
    with contextlib.ExitStack() as stack:
        if args.kind == "endpoint":
            if args.serve_bundled:
                args.model = args.model or "target"
                server = stack.enter_context(llamacpp.bundled_server(model=args.model))
                args.base_url = server.base_url
                args.server_label = args.server_label or llamacpp.server_label(args.model)
            if not args.base_url or not args.model:
                raise ValueError("give --base-url and --model, or --serve-bundled")
        if args.kind == "vllm" and args.serve:
            server = stack.enter_context(vllm_adapter.served(args.method, args.k, args.head, patch=args.patch))
            sampler = vllm_adapter.endpoint_config(server, sampling, args.method, args.k, args.n_per_request,
                                                   args.concurrency, progress=not args.quiet, patch=args.patch)
        else:
            sampler = _sampler_from_args(args, sampling)
        out = args.out or Path("reports") / "audit" / f"{args.kind}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        result = audit(pair, sampler, args.samples, args.length, out, prompt=args.prompt, seed=args.seed,
                       scored_at=scored_at, expected=expected, settings=SuiteSettings(tolerance=args.tolerance),
                       progress=not args.quiet)
        if args.kind == "vllm":
            vllm_adapter.close_workers()
        if args.kind in ("openvino", "ortgenai"):
            _cpu_engine_module(args.kind).close_workers()
    row = result.summary()
    columns = ["implementation", "settings", "L", "m", "bounded positions", "TV upper 99%", "TV upper 99% (token 1)",
               "drafted share", "acceptance", "Holm p", "tokens/pass", "samples/s", "refused", "verdict"]
    columns[-1:-1] = [c for c in ("speculative steps", "drafted/step", "accepted/step", "engine errors",
                                  "engine messages") if c in row]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 70):
        print(result.tests()[["test", "statistic", "pvalue"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        print(pd.DataFrame([row])[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"\n{row['implementation']}: {row['in words']}\nsamples: {out}")
    print(f"bounded: TV of tokens {row['bounded positions']} ≤ {row['TV upper 99%']:.4f} at 99% "
          f"(token 1 alone, the plain-sampling control: ≤ {row['TV upper 99% (token 1)']:.4f}); drafted share "
          f"{row['drafted share']}, acceptance there {row['acceptance'] or 'n/a'} ({result.drafting.source or '—'}); "
          f"verdict: {row['verdict']}")
    return 0 if row["correct call"] else 1


def _greedy_vllm(args) -> int:
    """T = 0: vLLM's speculative greedy output must equal its own non-speculative greedy output, token for token."""
    from specdec_lab.adapters import vllm as vllm_adapter
    from specdec_lab.models import pair_from_args

    pair = pair_from_args(args)
    check = vllm_adapter.greedy_check(args.method, pair.encode(args.prompt), args.length, args.k, args.head)
    vllm_adapter.close_workers()
    for name in ("reference", "speculative"):
        print(f"{name:12s} {check[name]}")
    verdict = "identical" if check["identical"] else f"DIFFERS from token {check['first_difference']}"
    print(f"\nvLLM {vllm_adapter.VERSION} offline, {args.method} K={args.k}, greedy, L={args.length}: {verdict}")
    return 0 if check["identical"] else 1


def _cpu_engine_module(kind: str):
    from specdec_lab.adapters import openvino, ortgenai

    return {"openvino": openvino, "ortgenai": ortgenai}[kind]


def _greedy_cpu_engine(args) -> int:
    """T = 0: OpenVINO GenAI's / ONNX Runtime GenAI's speculative greedy output must equal the same engine's plain
    greedy output, token for token."""
    from specdec_lab.models import pair_from_args

    engine = _cpu_engine_module(args.kind)
    pair = pair_from_args(args)
    lookup = args.method in ("ngram", "prompt_lookup")
    prompt = pair.encode(args.prompt if args.prompt is not None else (LOOKUP_PROMPT if lookup else DEFAULT_PROMPT))
    if args.kind == "openvino":
        check = engine.greedy_check(args.method, prompt, args.length, args.pipeline, args.k)
        label = f"OpenVINO GenAI {engine.VERSION} {args.pipeline}"
    else:
        check = engine.greedy_check(args.method, prompt, args.length, args.k)
        label = f"ONNX Runtime GenAI {engine.VERSION}"
    engine.close_workers()
    for name in ("reference", "speculative"):
        print(f"{name:12s} {check[name]}")
    verdict = "identical" if check["identical"] else f"DIFFERS from token {check['first_difference']}"
    print(f"\n{label}, {args.method} K={args.k}, greedy, L={args.length}: {verdict}")
    return 0 if check["identical"] else 1


def audit_llama_speculative(n: int, length: int, out: Path, sampling: SamplingConfig = SamplingConfig(),
                            seed: int = 0, prompt: str = DEFAULT_PROMPT, tolerance: float = 0.02) -> AuditResult:
    """Audit llama.cpp's ``llama-speculative`` on the bundled pair (one process per sample)."""
    from specdec_lab.adapters.llamacpp import SpeculativeTool, bundled_ggufs
    from specdec_lab.models import load_pair

    with bundled_ggufs() as (target, draft):
        tool = SpeculativeTool(str(target), str(draft), sampling)
        return audit(load_pair("bundled"), tool, n, length, out, prompt=prompt, seed=seed,
                     settings=SuiteSettings(tolerance=tolerance))


def cmd_llama_speculative(args) -> int:
    """``specdec-lab audit llama-speculative``: the per-test table and the summary row as JSON."""
    result = audit_llama_speculative(args.samples, args.length, args.out,
                                     SamplingConfig(temperature=args.temperature), seed=args.seed,
                                     tolerance=args.tolerance)
    print(result.tests()[["test", "statistic", "pvalue"]].to_string(index=False))
    print(json.dumps(result.summary(), default=str, indent=1))
    return 0
