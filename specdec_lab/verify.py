"""The main job: collect from every sampler, run the suite, write a report, decide.

Correct samplers (naive; speculative K=4 at temperature 1 and 0.7 and with top-p; the point-mass
draft; Medusa tree verification with both lossless rejection rules) must come out **equivalent**
(TV upper bound below ε); every negative control in :data:`specdec_lab.samplers.faulty.FAULTY` and
:data:`~specdec_lab.samplers.faulty.TREE_FAULTY`, and Medusa's lossy typical acceptance, must come
out **rejected**. Anything else fails the run.
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
from specdec_lab.samplers.faulty import FAULTY, TREE_FAULTY
from specdec_lab.samplers.medusa import MedusaConfig, heads_for, medusa_rates
from specdec_lab.samplers.naive import NaiveConfig
from specdec_lab.samplers.rules import POINT_MASS
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.samplers.tree import Tree
from specdec_lab.suite import SuiteSettings, run_suite, score


@dataclass(frozen=True)
class Scale:
    correct_samples: int  # per correct sampler: sized so the TV bound reaches the tolerance
    faulty_samples: int  # per negative control: enough to reject the smallest planted effect
    length: int  # new tokens per sample
    tolerance: float  # ε of the equivalence verdict
    # lossless Medusa rows (each feeds 4 tokens per chain per pass, ≈ 3-5x a naive row on a CPU):
    # the i.i.d. flavour by default (it accepts more, so it is the cheaper one), both at full scale
    medusa_lossless: tuple = ("rejection_iid",)
    medusa: bool = True  # run the Medusa rows at all (smoke: off, it checks the pipeline quickly)


SCALES = {
    "smoke": Scale(1_000, 2_000, 3, 0.02, medusa=False),  # under a minute; tests the pipeline, lossless verdicts inconclusive
    "default": Scale(80_000, 10_000, 3, 0.02),  # ≈ 12-16 minutes on 2 CPU cores (Medusa rows included)
    "full": Scale(320_000, 20_000, 3, 0.01, ("rejection_iid", "rejection_topk")),  # ≈ 30 minutes on 2 CPU cores
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

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; valid scales: {', '.join(SCALES)}")


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
        runs.append((f"faulty: {name}", SpeculativeConfig(k=k, sampling=replace(base, **needs),
                                                          verifier=verifier), False))
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
    settings = SuiteSettings(tolerance=scale.tolerance)
    rng = np.random.default_rng(options.seed)
    entries, first_laws, pits = [], {}, {}
    for index, (name, sampler, lossless) in enumerate(samplers_to_run(options)):
        n = (options.samples or scale.correct_samples) if lossless else scale.faulty_samples
        file = folder / "samples" / f"{index:02d}-{_slug(name)}.parquet"
        started = time.time()
        prompt = options.medusa_prompt if isinstance(sampler, MedusaConfig) else options.prompt
        prompt_ids = pair.encode(prompt)
        samples = collect(pair, sampler, prompt, n, scale.length, options.seed + index, file,
                          progress=options.progress)
        tokens = samples.tokens()
        scores = score(pair, prompt_ids, tokens, sampler.sampling, settings.min_prefix_count)
        suite = run_suite(name, tokens, scores, settings, rng)
        run_stats = samples.meta.get("stats")
        if isinstance(sampler, MedusaConfig) and run_stats:  # rates from the merged counts
            run_stats = medusa_rates(run_stats, sampler.tree.depth)
        entries.append({"suite": suite, "lossless": lossless, "stats": run_stats,
                        "exact_tv": exact_tv(pair, prompt_ids, sampler, scale.length)})
        if index == 0:  # the naive run is scored at the base settings: its first law is the target's
            exact_first = scores.first_law
        # figures: naive and the first speculative run beside the negative controls
        if index < 2 or name in ("faulty: residual_from_p", "faulty: always_accept"):
            first_laws[name] = np.bincount(tokens[:, 0], minlength=pair.vocab_size) / len(tokens)
        if index < 2 or (not lossless and len(pits) < 8):
            pits[name] = stats.randomized_pit(scores.cdf_below, scores.p_x, rng)
        if options.progress:
            print(f"  {name:<42} m={n:<7} {suite.verdict:<12} ({time.time() - started:.0f}s)", flush=True)
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
        f"Prompt {options.prompt!r} (Medusa rows: {options.medusa_prompt!r}), L = {scale.length} new tokens, K = {options.k}, seed {options.seed}, "
        f"scale `{options.scale}`, ε = {scale.tolerance:g}, α = 0.01 per sampler (Holm across its tests).",
        "",
        f"**Overall: {'PASS' if passed else 'FAIL'}** — every lossless sampler must be *equivalent*, "
        "every negative control *rejected*.",
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
