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

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab import drafting as drafting_
from specdec_lab import stats, verdicts
from specdec_lab.collect import SampleSet, collect
from specdec_lab.report.tables import settings_label
from specdec_lab.laws.workload import LawBook
from specdec_lab.sampling import ChainConfig, SamplingConfig
from specdec_lab.suite import SuiteResult, SuiteSettings, run_suite, score, scores_from_law

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
NEGATIVE_CONTROL_SAMPLES = 3000  # a wrong law at TV ≈ 0.1 is rejected with power ≈ 1 at this size


def plan_audit_samples(pair, prompt: str, sampling: SamplingConfig, tolerance: float = 0.02,
                       assurance: float = 0.999, seed: int = 0) -> int:
    """Samples m at which a correct engine's bound on the joint law of tokens 1–2 is below ``tolerance`` with
    probability ``assurance`` (:func:`stats.plan_bound_by_simulation` on the exact joint law after ``prompt``
    at ``sampling``, as ``verify`` plans its rows)."""
    from specdec_lab.laws import two_token_law

    law = two_token_law(pair, pair.encode(prompt), sampling)
    return stats.plan_bound_by_simulation(law.joint, tolerance, assurance=assurance,
                                          rng=np.random.default_rng(seed))


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
    if described.get("sampler") == "mlx_lm":
        k = f" K={described['k']}" if "k" in described else ""
        return f"mlx-lm {described['mlx_lm_version']}, {described['method']}{k}"
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
    suite_tolerance: float = 0.02  # ε of the joint bound the verdict rests on

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
    def refused(self) -> int:
        """Completions the adapter could not keep (an early end, an unmappable text: ``refused_samples``)."""
        return int((self.samples.meta.get("stats") or {}).get("refused_samples", 0))

    @property
    def joint_upper(self) -> float:
        """The bound the verdict rests on: the suite's joint bound of tokens 1–2 among the kept completions, plus
        the refused share's bound (:func:`with_refusals`): a bound on the law of *every* completion."""
        joint = float("nan") if self.suite.joint_bound is None else self.suite.joint_bound.upper
        return with_refusals(joint, self.refused, self.suite.m)

    @property
    def verdict(self) -> str:
        """The suite's verdict — equivalent only while :attr:`joint_upper` (refusals included) is within ε — made
        *inconclusive (drafting not exercised)* for an equivalent speculative row whose bounded positions were not
        shown to be drafted in at least half of the samples."""
        verdict = self.suite.verdict
        if verdict == verdicts.EQUIVALENT and not self.joint_upper <= self.suite_tolerance:
            verdict = verdicts.INCONCLUSIVE
        return verdicts.require_drafting(verdict, self.drafting.exercised)

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
        joint = self.joint_upper
        words = s.verdict_text + "; " + drafted.words()
        if verdict != s.verdict:
            words = f"{verdict}: {words}"
        return {"implementation": self.name, "settings": settings, "expected": self.expected,
                "L": self.samples.meta["length"], "m": s.m, **drafted.columns(),
                "TV plug-in": s.joint_tv_plugin, "TV upper 99%": joint,
                "TV upper 99% (token 1)": s.tv_bound.upper, "KL (MM)": s.kl, "Holm p": s.global_pvalue,
                "tokens/pass": per_pass, "refused": stats.get("refused_samples", 0),
                **speculation_summary(stats), **engine_errors(stats),
                "verdict": verdict, "correct call": verdicts.correct_call(verdict, self.expected),
                "in words": words, "seconds": round(self.seconds, 1),
                "samples/s": samples_per_second(s.m, stats, self.collect_seconds)}

    def verdict_row(self) -> verdicts.Verdict:
        """The row as a :class:`~specdec_lab.verdicts.Verdict`: ``tv_upper`` is the bound the verdict rests on (the
        joint law of tokens 1–2); the details carry the summary's other columns and the run's settings."""
        row = self.summary()
        meta = self.samples.meta
        skip = {"implementation", "expected", "m", "TV upper 99%", "Holm p", "verdict", "correct call", "in words"}
        details = {key: value for key, value in row.items() if key not in skip}
        details.update({"engine": meta["sampler"], "seed": meta.get("seed"), "prompts": meta.get("prompts"),
                        "scored_at": settings_label(self.scored_at), "models": meta.get("models")})
        tolerance = self.suite_tolerance
        return verdicts.Verdict(row["implementation"], row["verdict"], int(row["m"]), float(row["TV upper 99%"]),
                                float(row["Holm p"]), tolerance, self.expected, row["in words"], details)

    def tests(self) -> pd.DataFrame:
        """Every test's statistic and p-value."""
        return pd.DataFrame(self.suite.rows())


def with_refusals(tv_upper: float, refused: int, kept: int, confidence: float = 0.99) -> float:
    """A bound on TV(every completion's law, p) from one on the kept completions: for the law Q, the kept event K
    and any P, TV(Q, P) ≤ TV(Q | K, P) + Q(not K), so the refused share's Clopper–Pearson bound is added (the two
    bounds hold together at 2·confidence − 1). Nothing is added when nothing was refused.

    >>> with_refusals(0.012, 0, 40_000), round(with_refusals(0.012, 3, 40_000), 5)
    (0.012, 0.01225)
    """
    if not refused:
        return tv_upper
    return tv_upper + stats.clopper_pearson_upper(refused, refused + kept, confidence)


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
        The target law to test against; default ``sampler.sampling``, or, for a sampler whose ``chained`` is true
        (min-p, penalties: :class:`specdec_lab.adapters.mlx.MlxConfig`), its ``chain``'s exact law
        (:func:`chain_law`; two-token samples only).
    expected : {"lossless", "negative control"}
        What a correct call is; recorded in the summary's "correct call" column.
    batch_size : int
        Samples per resumable part file.

    Returns
    -------
    AuditResult
        ``.summary()`` is one table row; ``.suite`` holds every test.
    """
    if expected not in verdicts.EXPECTED:
        raise ValueError(f"unknown expectation {expected!r}; valid: {', '.join(verdicts.EXPECTED)}")
    if length < 2:
        raise ValueError("an audit bounds the joint law of tokens 1–2 (engines draft from token 2 on): "
                         f"length must be >= 2, got {length}")
    if settings.joint_tolerance is None:
        settings = replace(settings, joint_tolerance=settings.tolerance)
    started = time.time()
    samples = collect(pair, sampler, prompt, n, length, seed, path, batch_size=batch_size, progress=progress)
    collected = time.time() - started
    tokens = samples.tokens()  # (n, L)
    chained = scored_at is None and getattr(sampler, "chained", False)  # min-p, penalties: scored on the whole chain
    scored_at = scored_at or sampler.sampling
    name = name or implementation_label(samples.meta["sampler"])
    if chained:
        scores = scores_from_law(tokens, chain_law(pair, prompt, sampler.chain), settings.min_prefix_count)
    else:
        scores = score(pair, pair.encode(prompt), tokens, scored_at, settings.min_prefix_count)
    suite = run_suite(name, tokens, scores, settings, np.random.default_rng(seed))
    return AuditResult(name, expected, suite, samples, scored_at, time.time() - started,
                       collect_seconds=collected, suite_tolerance=settings.joint_tolerance)


@dataclass(frozen=True)
class _ChainCell:
    """A prompt under one sampler chain: what :class:`specdec_lab.laws.workload.LawBook` computes a law of."""

    prompt: str
    config: ChainConfig
    stop: tuple = ()

    def chain(self, order: str) -> ChainConfig:
        return self.config


def chain_law(pair, prompt: str, chain: ChainConfig) -> np.ndarray:
    """The target's exact joint law (V * V,) of tokens 1–2 after ``prompt`` under a whole sampler chain (min-p,
    penalties over prompt and output, in ``chain.order``): what a sampler with ``chained`` settings is scored against
    (two-token samples only: :func:`specdec_lab.suite.scores_from_law`)."""
    return LawBook(pair, chain.order).joint(_ChainCell(prompt, chain))


def second_token_bounds(pair, prompt: str, tokens: np.ndarray, sampling: SamplingConfig, top: int = 3,
                        confidence: float = 0.99) -> pd.DataFrame:
    """TV upper bounds on the law of token 2 given each of the ``top`` most frequent first tokens.

    For engines that never speculate on the first token (llama-server samples it from the prompt's pass),
    token 2 is the first drafted position, so these bounds speak for the speculative path where the
    first-token bound of the verdict cannot. Each is a bound for that one prefix, at ``confidence``.
    """
    import torch

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


def audit_llama_speculative(n: int, length: int, out: Path, sampling: SamplingConfig = SamplingConfig(),
                            seed: int = 0, prompt: str = DEFAULT_PROMPT, tolerance: float = 0.02) -> AuditResult:
    """Audit llama.cpp's ``llama-speculative`` on the bundled pair (one process per sample)."""
    from specdec_lab.adapters.llamacpp_build import bundled_ggufs
    from specdec_lab.adapters.llamacpp_speculative import SpeculativeTool
    from specdec_lab.models import load_pair

    with bundled_ggufs() as (target, draft):
        tool = SpeculativeTool(str(target), str(draft), sampling)
        return audit(load_pair("bundled"), tool, n, length, out, prompt=prompt, seed=seed,
                     settings=SuiteSettings(tolerance=tolerance))
