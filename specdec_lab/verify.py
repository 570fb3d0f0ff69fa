"""The main job: collect from every sampler, run the suite, write a report, decide.

Correct samplers (naive; speculative K=4 at temperature 1 and 0.7 and with top-p; the point-mass
draft; Medusa tree verification with both lossless rejection rules) must come out **equivalent**
(TV upper bound below ε); every negative control in :data:`specdec_lab.samplers.faulty.FAULTY` and
:data:`~specdec_lab.samplers.faulty.TREE_FAULTY`, the overlapping-streams control
(:class:`~specdec_lab.samplers.faulty.OverlappingStreams`) and Medusa's lossy typical acceptance
must come out **rejected**. Anything else fails the run.

The tested window: by default each row draws enough tokens that every position its algorithm
treats differently falls inside it — a speculative row with K drafts gets L = K + 2 (draft
positions 1..K, the bonus token at K+1 after K accepts, and the first token of the next block,
drafted from the carried-over d_K); a Medusa row gets its tree depth + 2; a naive row gets L = 2,
the two tokens whose joint law is enumerated exactly (naive sampling has no block structure to
cover). ``--length L`` sets one L for every row instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from specdec_lab import exact, report, stats
from specdec_lab.collect import collect
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.faulty import FAULTY, TREE_FAULTY, OverlappingStreams
from specdec_lab.samplers.medusa import MedusaConfig, heads_for, medusa_rates
from specdec_lab.samplers.naive import NaiveConfig
from specdec_lab.samplers.rules import POINT_MASS
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.samplers.tree import Tree
from specdec_lab.suite import SuiteSettings, pair_law, run_suite, score


@dataclass(frozen=True)
class Scale:
    correct_samples: int  # per correct sampler: sized so the TV bound reaches the tolerance
    faulty_samples: int  # per negative control: enough to reject the smallest planted effect
    length: int | None  # new tokens per sample; None: each row's own window (see window_length)
    tolerance: float  # ε of the equivalence verdict (first-token TV bound)
    joint_tolerance: float | None = None  # the joint two-token TV bound must also be below this
    # lossless Medusa rows (each feeds 4 tokens per chain per pass, ≈ 3-5x a naive row on a CPU):
    # the i.i.d. flavour by default (it accepts more, so it is the cheaper one), both at full scale
    medusa_lossless: tuple = ("rejection_iid",)
    medusa: bool = True  # run the Medusa rows at all (smoke: off, it checks the pipeline quickly)
    n_resamples: int = 5000  # Monte Carlo draws per calibrated test (ADK, collisions): p-values down to 2e-4


# Sample sizes: stats.plan_tv_bound_samples on the bundled target's laws after DEFAULT_PROMPT says a
# correct sampler's expected combined bound reaches 0.02 on the first token at m ≈ 30,000, 0.01 at
# ≈ 144,000; on the first two tokens' joint law 0.025 at ≈ 169,000, 0.02 at ≈ 278,000 and 0.01 at
# ≈ 1.29 M (out of reach on a CPU). The bound fluctuates around its expectation (its χ² part by ~1.35x
# at +2.3 sd), so the scales keep a margin of about 2x in m over the planned value for each bound
# they rest on.
SCALES = {
    "smoke": Scale(1_000, 2_000, None, 0.02, medusa=False, n_resamples=999),  # tests the pipeline, lossless verdicts inconclusive
    "default": Scale(80_000, 10_000, None, 0.02),  # first-token bound <= 0.02; joint bound reported
    # full: the verdict rests on the joint bound too (<= 0.025 on the first two tokens, <= 0.01 on the first)
    "full": Scale(320_000, 20_000, None, 0.01, 0.025, ("rejection_iid", "rejection_topk")),
}

DEFAULT_PROMPT = "ROMEO:\n"
# The Medusa rows' prompt: the corpus's speaker format (Gutenberg plays: "ROMEO.\n"). After it the
# heads' first-token candidates pass typical acceptance's threshold, so typical's loss shows on the
# first token, where the TV bound and the exact law live (after "ROMEO:\n" no candidate passes, so
# typical's token 1 is exact there and its loss shows only from token 2 on).
MEDUSA_PROMPT = "ROMEO.\n"


@dataclass(frozen=True)
class VerifyOptions:
    scale: str = "default"
    k: int = 4
    temperature: float = 1.0
    low_temperature: float = 0.7
    top_p: float = 0.9
    top_k: int | None = None
    samples: int | None = None  # overrides the scale's correct_samples
    seed: int = 0
    prompt: str = DEFAULT_PROMPT
    medusa_prompt: str = MEDUSA_PROMPT  # the Medusa rows' prompt (see MEDUSA_PROMPT)
    out: Path = Path("reports")
    progress: bool = True
    medusa: bool | None = None  # Medusa rows (need the bundled heads); None: on for the bundled pair in run_verify
    length: int | None = None  # new tokens per sample for every row; None: the scale's, else each row's window

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; valid scales: {', '.join(SCALES)}")
        if self.length is not None and (not isinstance(self.length, int) or self.length < 1):
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")


def _base(sampler):
    return sampler.base if isinstance(sampler, OverlappingStreams) else sampler


def window_length(sampler) -> int:
    """Tokens a row must draw so every position its algorithm treats differently is tested: K + 2
    for speculative sampling (drafts 1..K, bonus K+1, the next block's first token), tree depth + 2
    for Medusa, 2 for naive sampling (the exactly enumerated two-token joint law)."""
    sampler = _base(sampler)
    if isinstance(sampler, SpeculativeConfig):
        return sampler.k + 2
    if isinstance(sampler, MedusaConfig):
        return sampler.tree.depth + 2
    return 2


def row_length(sampler, options: VerifyOptions) -> int:
    """The L a row runs at: ``--length`` if given, else the scale's, else :func:`window_length`."""
    return options.length or SCALES[options.scale].length or window_length(sampler)


def uncovered(sampler, length: int) -> str:
    """'' when the window covers the row's draft positions and bonus token, else what it misses."""
    sampler = _base(sampler)
    if isinstance(sampler, SpeculativeConfig) and length < sampler.k + 1:
        return f"L = {length} < K + 1 = {sampler.k + 1}: draft positions {length + 1}..{sampler.k} and the bonus untested"
    return ""


def samplers_to_run(options: VerifyOptions) -> list[tuple[str, object, bool]]:
    """(name, sampler, lossless) for every correct sampler and every negative control."""
    base = SamplingConfig(temperature=options.temperature, top_k=options.top_k)
    spec = SpeculativeConfig(k=options.k, sampling=base)
    runs = [
        ("naive", NaiveConfig(base), True),
        (f"speculative K={options.k} T={options.temperature:g}", spec, True),
        (f"speculative K={options.k} T={options.low_temperature:g}",
         replace(spec, sampling=replace(base, temperature=options.low_temperature)), True),
        (f"speculative K={options.k} top-p={options.top_p:g}",
         replace(spec, sampling=replace(base, top_p=options.top_p)), True),
        (f"point-mass draft K={options.k}", replace(spec, verifier=POINT_MASS), True),
    ]
    for name, verifier in FAULTY.items():
        needs = dict(verifier.needs or {})
        k = needs.pop("k", options.k)
        if row_length(SpeculativeConfig(k=options.k), options) >= options.k + 1:
            k = options.k  # the window holds the bonus token at K: test the bug at the K under test
        runs.append((f"faulty: {name}", SpeculativeConfig(k=k, sampling=replace(base, **needs),
                                                          verifier=verifier), False))
    streams = OverlappingStreams(spec)
    runs.append((f"faulty: overlapping_streams (seed + i, {streams.requests_per_batch} requests per batch)",
                 streams, False))
    if options.medusa and SCALES[options.scale].medusa:
        runs += medusa_runs(base, SCALES[options.scale].medusa_lossless)
    return runs


# Medusa rows: two candidates for token 1 and one below the first (4 tokens per target pass); the
# smallest tree with both a multi-child node and a descent, so the rows stay affordable on a CPU.
MEDUSA_TREE = Tree.from_choices([[0], [1], [0, 0]])


def medusa_runs(base: SamplingConfig, lossless_modes=("rejection_iid", "rejection_topk")
                ) -> list[tuple[str, object, bool]]:
    """Medusa tree verification: both lossless rejection rules, lossy typical acceptance (expected
    rejected at its defaults ε = 0.09, α = 0.3) and the sibling-independent negative control."""
    tree = MEDUSA_TREE
    runs = [(f"medusa {mode} tree", MedusaConfig(tree, mode, base), True)
            for mode in lossless_modes]
    typical = MedusaConfig(tree, "typical", base)
    runs.append((f"medusa typical ε={typical.epsilon:g} α={typical.alpha:g} (lossy)", typical, False))
    runs += [(f"faulty: medusa {name}", MedusaConfig(tree, name, base), False) for name in TREE_FAULTY]
    return runs


def exact_tv(pair, prompt_ids: torch.Tensor, sampler, length: int) -> float:
    """TV between the sampler's exact law of the first min(2, L) tokens and the target's."""
    if isinstance(sampler, MedusaConfig):  # first token only
        law, p = exact.medusa_first_token_law(pair, heads_for(pair), prompt_ids, sampler)
        return float("nan") if law is None else float(exact.tv(law, p))
    sampler = _base(sampler)  # overlapping streams: every draw follows the wrapped sampler's law
    if not isinstance(sampler, SpeculativeConfig):
        return 0.0
    if sampler.trim:
        raise ValueError("exact.sequence_law describes speculative sampling with a fixed K; "
                         "use trim=False for a sampler whose exact law is wanted")
    law = exact.sequence_law(exact.model_logits_at(pair, prompt_ids), pair.vocab_size, sampler.k,
                             min(2, length), sampler.sampling, sampler.verifier)
    return law.tv


def run_verify(pair, options: VerifyOptions) -> dict:
    """Run everything; return {"summary", "table", "folder", "passed"}."""
    scale = SCALES[options.scale]
    bundled = pair.identity.get("pair") == "bundled"
    options = replace(options, medusa=bundled if options.medusa is None else options.medusa and bundled)
    folder = options.out / time.strftime("%Y%m%d-%H%M%S")
    (folder / "samples").mkdir(parents=True, exist_ok=True)
    settings = SuiteSettings(tolerance=scale.tolerance, joint_tolerance=scale.joint_tolerance,
                             n_resamples=scale.n_resamples)
    rng = np.random.default_rng(options.seed)
    entries, first_laws, pits, joints = [], {}, {}, {}
    for index, (name, sampler, lossless) in enumerate(samplers_to_run(options)):
        n = (options.samples or scale.correct_samples) if lossless else scale.faulty_samples
        length = row_length(sampler, options)
        file = folder / "samples" / f"{index:02d}-{_slug(name)}.parquet"
        started = time.time()
        prompt = options.medusa_prompt if isinstance(sampler, MedusaConfig) else options.prompt
        prompt_ids = pair.encode(prompt)
        samples = collect(pair, sampler, prompt, n, length, options.seed + index, file,
                          progress=options.progress)
        tokens = samples.tokens()
        key = (prompt, sampler.sampling)  # rows sharing a prompt and settings share the enumerated law
        if length >= 2 and key not in joints:
            joints[key] = pair_law(pair, prompt_ids, sampler.sampling)
        scores = score(pair, prompt_ids, tokens, sampler.sampling, settings.min_prefix_count,
                       joint=joints.get(key))
        suite = run_suite(name, tokens, scores, settings, rng)
        run_stats = samples.meta.get("stats")
        if isinstance(sampler, MedusaConfig) and run_stats:  # rates from the merged counts
            run_stats = medusa_rates(run_stats, sampler.tree.depth)
        entries.append({"suite": suite, "lossless": lossless, "stats": run_stats,
                        "exact_tv": exact_tv(pair, prompt_ids, sampler, length),
                        "uncovered": uncovered(sampler, length)})
        if index == 0:  # the naive run is scored at the base settings: its first law is the target's
            exact_first = scores.first_law
        # figures: naive and the first speculative run beside the negative controls
        if index < 2 or name in ("faulty: residual_from_p", "faulty: always_accept"):
            first_laws[name] = np.bincount(tokens[:, 0], minlength=pair.vocab_size) / len(tokens)
        if index < 2 or (not lossless and len(pits) < 8):
            pits[name] = stats.randomized_pit(scores.cdf_below, scores.p_x, rng)
        if options.progress:
            print(f"  {name:<42} m={n:<7} L={length:<2} {suite.verdict:<12} ({time.time() - started:.0f}s)",
                  flush=True)
    summary = report.summary_table(entries)
    table = report.verdict_table(entries)
    report.plot_tv_bounds(summary, scale.tolerance, folder / "tv_bounds.png")
    report.plot_first_token(first_laws, exact_first, folder / "first_token.png")
    report.plot_pit(pits, folder / "pit.png")
    passed = bool(summary["correct call"].all())
    _write_markdown(folder, summary, table, options, scale, pair, passed)
    summary.to_csv(folder / "summary.csv", index=False)
    table.to_csv(folder / "tests.csv", index=False)
    return {"summary": summary, "table": table, "folder": folder, "passed": passed}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()


def _write_markdown(folder, summary, table, options, scale, pair, passed) -> None:
    lines = [
        "# specdec-lab verify",
        "",
        f"Models: `{pair.identity.get('pair')}` (target sha256 `{pair.identity.get('target_sha256', '')[:16]}…`, "
        f"draft sha256 `{pair.identity.get('draft_sha256', '')[:16]}…`), vocabulary {pair.vocab_size}.",
        f"Prompt {options.prompt!r} (Medusa rows: {options.medusa_prompt!r}), {_window_words(options, scale)}, "
        f"K = {options.k}, seed {options.seed}, scale `{options.scale}`, ε = {scale.tolerance:g} on the first token"
        + (f" and {scale.joint_tolerance:g} on the first two tokens' joint law" if scale.joint_tolerance else
           " (the joint two-token bound is reported)")
        + ", α = 0.01 per sampler (Holm across its tests).",
        "",
        f"**Overall: {'PASS' if passed else 'FAIL'}** — every lossless sampler must be *equivalent*, "
        "every negative control *rejected*.",
        "",
        *[f"**Window warning** — {row['sampler']}: {row['window']}" for _, row in summary.iterrows()
          if row.get("window")],
        "",
        "## Summary",
        "",
        report.to_markdown(summary),
        "",
        "## Every test",
        "",
        report.to_markdown(table),
        "",
        "![TV bounds](tv_bounds.png)",
        "![first token](first_token.png)",
        "![PIT](pit.png)",
        "",
    ]
    (folder / "report.md").write_text("\n".join(lines))


def _window_words(options: VerifyOptions, scale: Scale) -> str:
    fixed = options.length or scale.length
    if fixed:
        return f"L = {fixed} new tokens per row"
    return ("L = K + 2 new tokens per speculative row (every draft position, the bonus token and the next "
            "block's first token), tree depth + 2 per Medusa row, 2 per naive row")
