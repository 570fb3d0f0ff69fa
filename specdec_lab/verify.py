"""The main job: collect from every sampler, run the suite, write a report, decide.

Correct samplers (naive; speculative K=4 at temperature 1 and 0.7 and with top-p; the point-mass
draft at K=2; block verification at K=2 with top-k; Medusa tree verification with both lossless rejection rules)
must come out **equivalent**
(TV upper bound below ε); every negative control in :data:`specdec_lab.samplers.faulty.FAULTY` and
:data:`~specdec_lab.samplers.faulty.TREE_FAULTY`, the overlapping-streams control
(:class:`~specdec_lab.samplers.faulty.OverlappingStreams`) and Medusa's lossy typical acceptance
must come out **rejected**. Exit status (:func:`specdec_lab.verdicts.expectation_status`): 0 when every call is
right, 3 when the only wrong calls are lossless rows left inconclusive, 1 otherwise.

The tested window: by default each row draws enough tokens that every position its algorithm
treats differently falls inside it — a speculative row with K drafts gets L = K + 2 (draft
positions 1..K, the bonus token at K+1 after K accepts, and the first token of the next block,
drafted from the carried-over d_K); a Medusa row gets its tree depth + 2; a naive row gets L = 2,
the two tokens whose joint law is enumerated exactly (naive sampling has no block structure to
cover). ``--length L`` sets one L for every row instead.

Sample sizes and looks: each row is judged in looks (:class:`~specdec_lab.stats.LookPlan`) and stops at the first
that decides it — a lossless row at its first certification, a negative control at its first rejection. The run's
levels are split evenly over a row's looks (each bound at confidence 1 − 0.01/J, Holm at α = 0.01/J for J looks), so
whichever look a row stops at, its bound holds at 99% and a correct row is falsely rejected with probability <= 0.01.
A lossless row's looks are planned from its exact law (:func:`plan_samples`): the last where a correct row's bound
reaches its tolerance with probability 0.999, the first where it does with probability 0.6, geometric between;
negative controls look at a quarter, half and all of the scale's fixed size. One look is the fixed-m plan.
Rows run side by side in worker processes (:func:`run_rows`); each row's random streams depend only
on (seed, row index), so the report does not depend on how many workers ran it (up to float32
rounding of the scores, which depends on the threads per process).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from specdec_lab import laws, plots, report, stats, verdicts
from specdec_lab.collect import collect
from specdec_lab.models import load_pair
from specdec_lab.report.tables import settings_label
from specdec_lab.report.verify_report import RunFacts, window_words, write_verify_documents
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.faulty import FAULTY, SMALL_EFFECT, TREE_FAULTY, OverlappingStreams
from specdec_lab.samplers.medusa import MedusaConfig, heads_for, medusa_rates
from specdec_lab.samplers.naive import NaiveConfig
from specdec_lab.samplers.protocol import merge_stats
from specdec_lab.samplers.rules import BLOCK, POINT_MASS
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.samplers.tree import Tree
from specdec_lab.laws import two_token_law
from specdec_lab.suite import SuiteSettings, run_suite, score


@dataclass(frozen=True)
class Scale:
    correct_samples: int | None  # per correct sampler; None: planned per row (see plan_samples)
    faulty_samples: int  # per negative control whose fault changes a law: rejected by a wide margin at this size
    length: int | None  # new tokens per sample; None: each row's own window (see window_length)
    tolerance: float  # ε of the equivalence verdict (first-token TV bound)
    joint_tolerance: float | None = None  # the joint two-token TV bound must also be below this
    # lossless Medusa rows (each feeds 4 tokens per chain per pass, ≈ 3-5x a naive row on a CPU):
    # the i.i.d. flavour by default (it accepts more, so it is the cheaper one), both at full scale
    medusa_lossless: tuple = ("rejection_iid",)
    medusa: bool = True  # run the Medusa rows at all (smoke: off, it checks the pipeline quickly)
    n_resamples: int = 5000  # Monte Carlo draws per calibrated test (ADK, collisions): p-values down to 2e-4
    assurance: float = 0.999  # planned sizes: a correct row's bounds reach their tolerances with this probability
    # the overlapping-streams control (every law is exact, only the collision test sees the replayed streams: Holm p
    # 4e-4 at 10,000, 2e-3 at 2,000) and the controls of faulty.SMALL_EFFECT keep this larger size
    dependence_samples: int | None = None  # None: faulty_samples
    looks: int = 1  # J looks a row may stop at (the run's α and confidence split over them); 1: one fixed m


# Sample sizes: planned per lossless row from its exact law (plan_samples; the planner table in docs/method.md)
SCALES = {
    "smoke": Scale(1_000, 2_000, None, 0.02, medusa=False, n_resamples=999),  # tests the pipeline, lossless verdicts inconclusive
    # first-token bound <= 0.02; joint bound reported; controls at 4,000 (each rejected by a wide margin: the
    # verify table's Holm p column; sizes and their history in docs/method.md#verify-internals)
    "default": Scale(None, 4_000, None, 0.02, dependence_samples=10_000, looks=3),
    # full: the verdict rests on the joint bound too (<= 0.025 on the first two tokens, <= 0.01 on the first). Its ε
    # is the lossless rows' business; the controls keep the default's sizes, which reject each by a wide margin
    "full": Scale(None, 4_000, None, 0.01, 0.025, ("rejection_iid", "rejection_topk"), dependence_samples=10_000,
                  looks=3),
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
    workers: int | None = None  # processes running rows side by side; None: default_workers

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; valid scales: {', '.join(SCALES)}")
        if self.length is not None and (not isinstance(self.length, int) or self.length < 1):
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")


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


# The point-mass (greedy) draft row runs at K = 2 (L = 4): its rule is the same at every draft
# position, and K's own positions 3..K and bonus are covered by the three K = 4 speculative rows and
# the K = 4 negative controls; its low acceptance makes it the costliest row per sample at K = 4
# (docs/method.md#verify-internals).
POINT_MASS_K = 2
# Block verification runs at K = 2 under top-k = 20: K = 2 is the smallest K where it differs from the token-wise
# rule, and top-k bounds the drafted tree its exact law enumerates (laws.block: 20^K drafts a block, against V^K
# without filtering). Its negative controls keep the same K and top-k.
BLOCK_K, BLOCK_TOP_K = 2, 20


def samplers_to_run(options: VerifyOptions) -> list[tuple[str, object, bool]]:
    """(name, sampler, lossless) for every correct sampler and every negative control."""
    base = SamplingConfig(temperature=options.temperature, top_k=options.top_k)
    spec = SpeculativeConfig(k=options.k, sampling=base)
    point_mass = replace(spec, k=min(options.k, POINT_MASS_K), verifier=POINT_MASS)
    runs = [
        ("naive", NaiveConfig(base), True),
        (f"speculative K={options.k} T={options.temperature:g}", spec, True),
        (f"speculative K={options.k} T={options.low_temperature:g}",
         replace(spec, sampling=replace(base, temperature=options.low_temperature)), True),
        (f"speculative K={options.k} top-p={options.top_p:g}",
         replace(spec, sampling=replace(base, top_p=options.top_p)), True),
        (f"point-mass draft K={point_mass.k}", point_mass, True),
        (f"block K={BLOCK_K} top-k={BLOCK_TOP_K}",
         replace(spec, k=BLOCK_K, sampling=replace(base, top_k=BLOCK_TOP_K), verifier=BLOCK), True),
    ]
    for name, verifier in FAULTY.items():
        needs = dict(verifier.needs or {})
        k = needs.pop("k", options.k)
        if verifier.block is None and row_length(SpeculativeConfig(k=options.k), options) >= options.k + 1:
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
        law, p = laws.medusa_first_token_law(pair, heads_for(pair), prompt_ids, sampler)
        return float("nan") if law is None else float(laws.tv(law, p))
    sampler = _base(sampler)  # overlapping streams: every draw follows the wrapped sampler's law
    if not isinstance(sampler, SpeculativeConfig):
        return 0.0
    if sampler.trim:
        raise ValueError("laws.sequence_law describes speculative sampling with a fixed K; "
                         "use trim=False for a sampler whose exact law is wanted")
    law = laws.sequence_law(laws.model_logits_at(pair, prompt_ids), pair.vocab_size, sampler.k,
                             min(2, length), sampler.sampling, sampler.verifier)
    return law.tv


@dataclass(frozen=True)
class Row:
    """One sampler of the run, with everything a worker process needs to run it alone."""

    index: int
    name: str
    sampler: object
    lossless: bool
    n: int  # samples at the last look
    length: int
    prompt: str
    plan: stats.LookPlan | None = None  # None: one look at n


def plan_samples(pair, options: VerifyOptions) -> dict:
    """(prompt, sampling) -> :class:`~specdec_lab.stats.LookPlan` for the lossless rows, by
    :func:`stats.plan_looks` on the exact laws after that prompt at those settings: the last look where a correct
    sampler's first-token bound (and, with a joint tolerance, its joint two-token bound) is below the tolerance with
    probability ``Scale.assurance``. Empty when the scale or ``--samples`` fixes m."""
    scale = SCALES[options.scale]
    if options.samples or scale.correct_samples:
        return {}
    keys = {(_prompt_of(s, options), s.sampling) for _, s, lossless in samplers_to_run(options) if lossless}
    plan = {}
    for prompt, sampling in sorted(keys, key=repr):
        law = two_token_law(pair, pair.encode(prompt), sampling)
        rng = np.random.default_rng([options.seed, len(plan)])
        plan[(prompt, sampling)] = stats.plan_looks(
            law.first, scale.tolerance, looks=scale.looks, assurance=scale.assurance, rng=rng,
            joint=law.joint if scale.joint_tolerance else None, joint_eps=scale.joint_tolerance)
    return plan


def control_looks(n: int, looks: int) -> stats.LookPlan:
    """A negative control's looks: n/2^(J−1), ..., n/2, n, at the levels split over the J looks."""
    sizes = tuple(sorted({max(1, n // 2 ** (looks - 1 - j)) for j in range(looks)}))
    return stats.LookPlan(sizes, 1 - 0.01 / looks, 0.01 / looks)


def _prompt_of(sampler, options: VerifyOptions) -> str:
    return options.medusa_prompt if isinstance(sampler, MedusaConfig) else options.prompt


def rows_to_run(pair, options: VerifyOptions, lossless: bool | None = None) -> list[Row]:
    """Every row with its sample size and window: lossless rows at ``--samples``, the scale's fixed
    size or the planned one (:func:`plan_samples`); negative controls at the scale's size. ``lossless``:
    only the lossless rows (True) or only the negative controls (False, which needs no planning)."""
    scale = SCALES[options.scale]
    plan = plan_samples(pair, options) if lossless is not False else {}
    rows = []
    for index, (name, sampler, row_lossless) in enumerate(samplers_to_run(options)):
        if lossless is not None and row_lossless != lossless:
            continue
        prompt = _prompt_of(sampler, options)
        if not row_lossless:
            larger = isinstance(sampler, OverlappingStreams) or (isinstance(sampler, SpeculativeConfig) and
                                                                 sampler.verifier.name in SMALL_EFFECT)
            n = (larger and scale.dependence_samples) or scale.faulty_samples
            looks = control_looks(n, scale.looks)
        else:
            looks = plan.get((prompt, sampler.sampling))
            n = options.samples or scale.correct_samples or looks.sizes[-1]
        looks = looks if looks is not None and len(looks.sizes) > 1 else None  # one look: at n, the run's levels
        rows.append(Row(index, name, sampler, row_lossless, n, row_length(sampler, options), prompt, looks))
    return rows


def run_row(pair, row: Row, options: VerifyOptions, settings: SuiteSettings, folder: Path) -> dict:
    """Collect one row's samples look by look, score them, run the suite, stop at the first look that decides: the
    row's report entry and figure inputs. Look j draws new samples from seed + row index + 1000 j alone, so the row
    runs the same in any worker."""
    started = time.time()
    prompt_ids = pair.encode(row.prompt)
    looks = row.plan or stats.LookPlan((row.n,), settings.confidence, settings.alpha)
    at_look = replace(settings, confidence=looks.confidence, alpha=looks.alpha)
    law = two_token_law(pair, prompt_ids, row.sampler.sampling)
    parts, counts, drawn = [], [], 0
    for look, size in enumerate(looks.sizes):
        file = folder / "samples" / f"{row.index:02d}-{_slug(row.name)}-look{look + 1}.parquet"
        samples = collect(pair, row.sampler, row.prompt, size - drawn, row.length,
                          options.seed + row.index + LOOK_SEED_STRIDE * look, file,
                          progress=options.progress and options.workers == 1)
        drawn = size
        parts.append(samples.tokens())
        counts.append(samples.meta.get("stats"))
        tokens = np.concatenate(parts)
        scores = score(pair, prompt_ids, tokens, row.sampler.sampling, at_look.min_prefix_count, law=law)
        rng = np.random.default_rng([options.seed, row.index])
        suite = run_suite(row.name, tokens, scores, at_look, rng)
        if suite.verdict != verdicts.INCONCLUSIVE:
            break
    run_stats = merge_stats(counts) if counts[0] else None
    if isinstance(row.sampler, MedusaConfig) and run_stats:  # rates from the merged counts
        run_stats = medusa_rates(run_stats, row.sampler.tree.depth)
    seconds = time.time() - started
    entry = {"suite": suite, "lossless": row.lossless, "stats": run_stats,
             "exact_tv": exact_tv(pair, prompt_ids, row.sampler, row.length),
             "uncovered": uncovered(row.sampler, row.length), "seconds": seconds,
             "look": f"{look + 1}/{len(looks.sizes)}"}
    return {"entry": entry, "first_law": scores.first_law,
            "first_counts": np.bincount(tokens[:, 0], minlength=pair.vocab_size) / len(tokens),
            "pit": stats.randomized_pit(scores.cdf_below, scores.p_x, rng), "seconds": seconds}


LOOK_SEED_STRIDE = 1000  # look j of row i draws from seed + i + 1000 j: distinct from every row's look 1


_WORKER: dict = {}


def _start_worker(recipe: dict, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER["pair"] = load_pair(**recipe)


def _run_in_worker(job) -> dict:
    return run_row(_WORKER["pair"], *job)


def run_rows(pair, rows: list[Row], options: VerifyOptions, settings: SuiteSettings, folder: Path,
             pool: ProcessPoolExecutor | None = None, later=None):
    """(row, result) for every row as it finishes. With ``options.workers`` > 1 the rows run side by
    side in ``pool`` (or a :func:`worker_pool` of their own), the costliest first; the same samples
    and verdicts as one by one (scores may differ in the 7th digit: float32 forwards round with the
    thread count). ``later``: a function returning more rows, called once the costlier half of ``rows`` is
    queued in the pool (the planning of the lossless rows, while the workers run negative controls); its rows
    run before the cheaper half."""
    if options.workers == 1:
        for row in rows + (later() if later else []):
            yield row, run_row(pair, row, options, settings, folder)
        return
    if pool is None:
        with worker_pool(pair, options.workers) as own:
            yield from run_rows(pair, rows, options, settings, folder, own, later)
        return
    futures = {}

    def submit(batch: list[Row]) -> None:  # the pool runs rows in the order they are submitted
        futures.update({pool.submit(_run_in_worker, (row, options, settings, folder)): row for row in batch})

    rows = sorted(rows, key=_cost, reverse=True)
    # With ``later``: the costlier half of ``rows`` keeps the workers busy while the caller plans, then the
    # planned rows run (costliest first), and the cheaper half last, where small rows even out the workers'
    # finishing times (queued after the controls, the big rows could leave one worker idle at the end).
    head = (len(rows) + 1) // 2 if later else len(rows)
    submit(rows[:head])
    if later:  # called only once the head is queued
        submit(sorted(later(), key=_cost, reverse=True))
    submit(rows[head:])
    for future in as_completed(futures):
        yield futures[future], future.result()


def _cost(row: Row) -> int:
    """A row's work, roughly (for scheduling only): samples × tokens, a speculative or tree step ≈ 5 naive ones."""
    return row.n * row.length * (1 if isinstance(row.sampler, NaiveConfig) else 5)


@contextmanager
def worker_pool(pair, workers: int):
    """``workers`` spawned processes, each loading the pair again from ``pair.recipe`` with
    cores / workers threads; started at once, so they load while the caller plans the rows.
    None for one worker (rows then run in this process)."""
    if workers == 1:
        yield None
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    with _environment(WORKER_MALLOC), \
            ProcessPoolExecutor(workers, context, _start_worker, (pair.recipe, threads)) as pool:
        for _ in range(workers):  # each submit to a pool without an idle worker spawns one
            pool.submit(int)
        yield pool


# glibc malloc settings of the worker processes (read at process start): allocations below 1 GiB come
# from the heap and freed memory stays there, instead of a fresh mmap per large tensor (a batch's
# logits, caches and masks) whose pages fault in on every use (the measured gain: docs/method.md#verify-internals).
WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 32)}


@contextmanager
def _environment(values: dict):
    """Set environment variables for the processes started inside the block; restore them after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_verify(pair, options: VerifyOptions) -> dict:
    """Run everything and write the report (:mod:`specdec_lab.report.verify_report`); return {"summary", "table",
    "folder", "rows" (the :class:`~specdec_lab.verdicts.Verdict` rows), "status" (the exit status), "passed",
    "seconds"}."""
    began = time.time()
    scale = SCALES[options.scale]
    bundled = pair.identity.get("pair") == "bundled"
    options = replace(options, medusa=bundled if options.medusa is None else options.medusa and bundled,
                      workers=options.workers or default_workers(pair))
    folder = options.out / time.strftime("%Y%m%d-%H%M%S")
    (folder / "samples").mkdir(parents=True, exist_ok=True)
    settings = SuiteSettings(tolerance=scale.tolerance, joint_tolerance=scale.joint_tolerance,
                             n_resamples=scale.n_resamples)
    results = {}
    planned: list[Row] = []

    def plan_lossless() -> list[Row]:  # runs while the workers load the pair and run the negative controls
        planned.extend(rows_to_run(pair, options, lossless=True))
        if options.progress:
            print(f"  {len(planned)} lossless rows planned in {time.time() - began:.0f}s; "
                  f"{len(controls)} negative controls running on {options.workers} worker(s)", flush=True)
        return planned

    with worker_pool(pair, options.workers) as pool:
        controls = rows_to_run(pair, options, lossless=False)
        for row, result in run_rows(pair, controls, options, settings, folder, pool, later=plan_lossless):
            results[row.index] = result
            if options.progress:
                suite = result["entry"]["suite"]
                print(f"  {row.name:<42} m={suite.m:<7} L={row.length:<2} look {result['entry']['look']:<4} "
                      f"{suite.verdict:<12} ({result['seconds']:.0f}s)", flush=True)
    rows = sorted(controls + planned, key=lambda row: row.index)
    ordered = [(row, results[row.index]) for row in rows]
    entries = [result["entry"] for _, result in ordered]
    # figures: naive and the first speculative run beside the negative controls
    first_laws = {row.name: result["first_counts"] for row, result in ordered
                  if row.index < 2 or row.name in ("faulty: residual_from_p", "faulty: always_accept")}
    controls = sum(not row.lossless for row in rows)
    pits = {row.name: result["pit"] for row, result in ordered if row.index < 2 or not row.lossless}
    pits = dict(list(pits.items())[:10])
    pit_selection = (f"the first two rows and the first {len(pits) - 2} of {controls} negative controls "
                     "(every row's PIT tests are in report.md)")
    summary = report.summary_table(entries)
    table = report.verdict_table(entries)
    report.plot_tv_bounds(summary, scale.tolerance, folder / "tv_bounds.png")
    verdict_of = dict(zip(summary["sampler"], summary["verdict"]))
    report.plot_first_token(first_laws, ordered[0][1]["first_law"], folder / "first_token.png",
                            tokens=plots.token_strings(pair), samples={row.name: row.n for row, _ in ordered
                                                                       if row.name in first_laws})
    report.plot_pit(pits, folder / "pit.png", verdicts=verdict_of, selection=pit_selection)
    seconds = time.time() - began
    facts = RunFacts(options.prompt, options.medusa_prompt, options.k, options.seed, options.scale, scale.tolerance,
                     scale.joint_tolerance, scale.assurance, not (options.samples or scale.correct_samples),
                     window_words(options.length or scale.length), options.workers, seconds)
    details = {row.name: {"L": row.length, "prompt": row.prompt, "seed": options.seed + row.index,
                          "settings": settings_label(row.sampler.sampling),
                          "look": results[row.index]["entry"]["look"]} for row in rows}
    verdict_rows, status = write_verify_documents(folder, summary, table, facts, pair, details)
    return {"summary": summary, "table": table, "folder": folder, "passed": status == 0, "status": status,
            "rows": verdict_rows, "seconds": seconds}


def default_workers(pair) -> int:
    """Processes for the rows: on a CPU, one per core up to 4 (single-threaded processes side by side outrun one
    multi-threaded process: docs/method.md#verify-internals); on an accelerator, 1."""
    if pair.device.type != "cpu":
        return 1
    return max(1, min(4, os.cpu_count() or 1))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()
