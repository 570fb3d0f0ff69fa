"""What the teaching notebooks call: the scale knob, the device, and each experiment they run.

Notebook cells hold prose, maths and calls into the library, never loops of their own (Medusa's
explanatory notebook drifted from its library); so every experiment a notebook shows lives here
as a function with a test.

The scale knob: ``SPECDEC_LAB_SCALE=ci`` (the default, what nbval runs: each notebook in about a
minute on 2 CPU cores) or ``full`` (``make notebooks``: the sample sizes a claim deserves).

>>> scale("ci").name, scale("full").samples > scale("ci").samples
('ci', True)
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

from specdec_lab import exact, plots, report, serving, stats, theory
from specdec_lab.collect import collect
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.samplers.faulty import FAULTY
from specdec_lab.samplers.naive import NaiveConfig, sample_naive
from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative
from specdec_lab.suite import Scores, SuiteResult, SuiteSettings, run_suite, score
from specdec_lab.verify import VerifyOptions, samplers_to_run

SCALE_ENV = "SPECDEC_LAB_SCALE"


@dataclass(frozen=True)
class Scale:
    """Sample sizes of the notebooks' experiments at one scale."""

    name: str
    samples: int  # per lossless sampler in a distributional check
    control_samples: int  # per negative control: its effects are large (TV >= 0.05)
    length: int  # new tokens per sample
    replicates: int  # independent replicate runs for the p-value uniformity meta-test
    replicate_samples: int  # samples per replicate
    power_reps: int  # simulated test runs per sample size on a power curve
    chains: int  # sampled continuations per prompt that supply real prefixes for exact checks
    audit_samples: int  # per audited external implementation (HF generate runs at batch 1: ~16 ms a sample)
    meta_reps: int = 20  # suite runs on samples of the exact law for the size meta-test (notebook 05)
    meta_samples: int = 2_000  # two-token samples per meta-test run
    detection_reps: int = 4  # suite runs per planted fault strength (notebook 05)
    detection_samples: int = 2_000  # samples per detection run (make verify's negative controls: 10,000)
    detection_step: int = 5  # every n-th strength of each planted family's grid (ci: its weakest and strongest)


SCALES = {
    "ci": Scale("ci", samples=8_000, control_samples=2_000, length=3, replicates=30,
                replicate_samples=600, power_reps=200, chains=16, audit_samples=1_000),
    "full": Scale("full", samples=80_000, control_samples=10_000, length=3, replicates=200,
                  replicate_samples=4_000, power_reps=1_000, chains=64, audit_samples=20_000,
                  meta_reps=400, meta_samples=10_000, detection_reps=20, detection_samples=10_000,
                  detection_step=1),
}


def scale(name: str | None = None) -> Scale:
    """The scale named ``name``, else ``$SPECDEC_LAB_SCALE``, else ``"ci"``.

    >>> scale("nope")
    Traceback (most recent call last):
    ...
    ValueError: unknown scale 'nope' (from SPECDEC_LAB_SCALE or the argument); valid scales: ci, full
    """
    chosen = name if name is not None else os.environ.get(SCALE_ENV, "ci")
    if chosen not in SCALES:
        raise ValueError(f"unknown scale {chosen!r} (from {SCALE_ENV} or the argument); "
                         f"valid scales: {', '.join(SCALES)}")
    return SCALES[chosen]


def default_device() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``: the one place notebooks pick it."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def setup(name: str | None = None, threads: int | None = 1) -> Scale:
    """Start a notebook: seaborn's theme, fixed pandas display, and the scale in force.

    ``threads`` sets torch's intra-op threads; 1 by default: the bundled models' kernels are tiny,
    and on a busy 2-core machine a second spinning thread made a notebook cell up to 30x slower in
    wall time (HF ``generate`` at batch 1: 1,138 s with 2 threads, 37 s with 1). None leaves it alone.
    """
    import seaborn as sns

    if threads is not None:
        torch.set_num_threads(int(threads))
    sns.set_theme(context="notebook", style="whitegrid")
    pd.set_option("display.precision", 4)
    pd.set_option("display.max_colwidth", 80)
    return scale(name)


def work_dir(prefix: str = "specdec-lab-") -> Path:
    """A fresh temporary folder for sample files (nothing is written into the repository)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


# ------------------------------------------------------------------------------ exact laws (notebook 02)


def first_token_law(pair, prompt_ids: torch.Tensor, sampling: SamplingConfig = SamplingConfig()) -> np.ndarray:
    """The exact target law p(· | prompt) after ``sampling``, as a float64 array (V,)."""
    target_logits, _ = exact.model_logits_at(pair, prompt_ids)(torch.zeros(1, 0, dtype=torch.long))
    return to_probs(target_logits[0], sampling).numpy()


def first_token_logits(pair, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits (V,) each, in float64, for the token right after the prompt."""
    target_logits, draft_logits = exact.model_logits_at(pair, prompt_ids)(torch.zeros(1, 0, dtype=torch.long))
    return target_logits[0], draft_logits[0]


def first_token_rule_law(pair, prompt_ids: torch.Tensor, config: SpeculativeConfig) -> np.ndarray:
    """The exact law (V,) of the first token a speculative sampler emits after the prompt."""
    target_logits, draft_logits = first_token_logits(pair, prompt_ids)
    return exact.step_law(target_logits, draft_logits, config.sampling, config.verifier).numpy()


PROMPTS = ["ROMEO:\n", "KING.\nWhat", "First Citizen:\nBefore we proceed", "O"]  # real contexts

SETTINGS = {  # sampling settings the exact-law check covers
    "T=1": SamplingConfig(),
    "T=0.7": SamplingConfig(temperature=0.7),
    "top-k=20": SamplingConfig(top_k=20),
    "top-p=0.9": SamplingConfig(top_p=0.9),
    "T=1.3 top-k=50 top-p=0.95": SamplingConfig(temperature=1.3, top_k=50, top_p=0.95),
}


def real_logits(pair, prompts: list[str], chains: int, positions: int = 12, seed: int = 0):
    """Target and draft logits at real prefixes: ``chains`` sampled continuations of each prompt,
    read at each of ``positions`` new tokens. Returns two float64 tensors (len(prompts)·chains·positions, V)."""
    target, draft = [], []
    for i, text in enumerate(prompts):
        ids = pair.encode(text)
        cont = sample_naive(pair, ids, chains, positions, NaiveConfig(), make_generator(seed + i, pair.device)).tokens
        seqs = torch.cat([ids.expand(chains, -1), cont], dim=1).to(pair.device)  # (chains, P + positions)
        with torch.no_grad():
            for model, out in ((pair.target, target), (pair.draft, draft)):
                logits = model(input_ids=seqs).logits[:, -positions:, : pair.vocab_size]
                out.append(logits.reshape(-1, pair.vocab_size).double().cpu())
    return torch.cat(target), torch.cat(draft)


def cached_logits_at(pair, context: torch.Tensor) -> exact.LogitsAt:
    """:func:`specdec_lab.exact.model_logits_at`, remembering each answer: many rules' exact laws
    over the same prefixes then cost one set of forwards."""
    compute = exact.model_logits_at(pair, context)
    memo = {}

    def logits_at(prefixes: torch.Tensor):
        key = (tuple(prefixes.shape), prefixes.numpy().tobytes())
        if key not in memo:
            memo[key] = compute(prefixes)
        return memo[key]

    return logits_at


def law_errors(target_logits: torch.Tensor, draft_logits: torch.Tensor, settings: dict, verifiers) -> pd.DataFrame:
    """For each rule and sampling setting: max |law − p| of one step over all prefixes (n, V),
    with the mean TV(q, p) and mean acceptance Σ min(p, q) there (how different the draft is)."""
    rows = []
    for verifier in verifiers:
        for label, config in settings.items():
            p = to_probs(target_logits, config)
            law = exact.step_law(target_logits, draft_logits, config, verifier)  # (n, V)
            q = verifier.draft_law(draft_logits, config).q_sample
            rows.append({"rule": verifier.name, "settings": label, "prefixes": len(p),
                         "max |law - p|": float((law - p).abs().max()),
                         "mean TV(q, p)": float(exact.tv(q, p).mean()),
                         "mean acceptance": float(torch.minimum(p, q).sum(-1).mean())})
    return pd.DataFrame(rows)


def exact_rule_table(pair, prompt_ids: torch.Tensor, runs: list[tuple[str, object, bool]],
                     length: int = 2) -> pd.DataFrame:
    """Exact TV and max |law − p| over the first ``length`` tokens for every speculative run.

    ``runs`` are ``(name, SpeculativeConfig, lossless)`` as from
    :func:`specdec_lab.verify.samplers_to_run`; other samplers are skipped.
    """
    logits_at = cached_logits_at(pair, prompt_ids)
    rows = []
    for name, sampler, lossless in runs:
        if not isinstance(sampler, SpeculativeConfig):
            continue  # incl. overlapping streams: its fault is dependence between draws, which no one-draw law shows
        law = exact.sequence_law(logits_at, pair.vocab_size, sampler.k, length, sampler.sampling,
                                 sampler.verifier)
        rows.append({"rule": name, "lossless": lossless, "k": sampler.k, **sampler.sampling.describe(),
                     "exact TV": law.tv, "max |law - p|": law.max_abs_error,
                     "bug": sampler.verifier.description if not lossless else ""})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class SeedPaths:
    """Naive and speculative chains drawn with the same seed, and how often they coincide."""

    naive: np.ndarray  # (N, L)
    speculative: np.ndarray  # (N, L)
    identical_chains: float  # fraction of chains equal token for token
    agreement_by_position: np.ndarray  # (L,) fraction equal at each position


def same_seed_paths(pair, prompt_ids: torch.Tensor, n: int, length: int, seed: int,
                    config: SpeculativeConfig = SpeculativeConfig()) -> SeedPaths:
    """Draw ``n`` chains from p directly and by speculative sampling, both from ``make_generator(seed)``."""
    naive = sample_naive(pair, prompt_ids, n, length, NaiveConfig(config.sampling),
                         make_generator(seed, pair.device)).tokens.numpy()
    spec = sample_speculative(pair, prompt_ids, n, length, config, make_generator(seed, pair.device)).tokens.numpy()
    equal = naive == spec
    return SeedPaths(naive, spec, float(equal.all(axis=1).mean()), equal.mean(axis=0))


def paths_table(pair, paths: SeedPaths, rows: int = 5) -> pd.DataFrame:
    """The first ``rows`` chains of both samplers, decoded, side by side."""
    return pd.DataFrame({"naive": [pair.decode(t) for t in paths.naive[:rows].tolist()],
                         "speculative": [pair.decode(t) for t in paths.speculative[:rows].tolist()],
                         "identical": (paths.naive[:rows] == paths.speculative[:rows]).all(axis=1)})


def paths_tests(paths: SeedPaths, p: np.ndarray, seed: int = 0) -> pd.DataFrame:
    """Both samplers' first tokens tested against the exact p: different samples, one law."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, tokens in (("naive", paths.naive), ("speculative", paths.speculative)):
        counts = np.bincount(tokens[:, 0], minlength=len(p))
        res = stats.chisquare_identity(counts, p, rng=rng)
        rows.append({"sampler": name, "m": int(counts.sum()), "Pearson X²": res.statistic, "df": res.df,
                     "p-value": res.pvalue, "tail p-value": res.tail_pvalue, "TV plug-in": stats.tv_plugin(counts, p)})
    return pd.DataFrame(rows)


def greedy_speculative_vs_naive(pair, prompt_ids: torch.Tensor, length: int, k: int = 4) -> pd.DataFrame:
    """Greedy (temperature 0) speculative decoding against greedy plain decoding, token for token."""
    greedy = SamplingConfig(temperature=0.0)
    naive = sample_naive(pair, prompt_ids, 1, length, NaiveConfig(greedy), make_generator(0, pair.device)).tokens[0]
    spec = sample_speculative(pair, prompt_ids, 1, length, SpeculativeConfig(k=k, sampling=greedy),
                              make_generator(1, pair.device))
    return pd.DataFrame([{"k": k, "length": length, "identical": bool((naive == spec.tokens[0]).all()),
                          "acceptance": spec.stats["acceptance"],
                          "tokens per target pass": spec.stats["tokens_per_target_pass"],
                          "text": pair.decode(naive.tolist())}])


def greedy_batch_effect(pair, prompt_ids: torch.Tensor, length: int, batch_sizes=(1, 8, 64, 256)) -> pd.DataFrame:
    """Greedy decoding of one prompt, alone and copied across bigger batches.

    For each batch size B: do all B greedy chains equal the batch-1 chain; the largest difference
    between the batch-B and batch-1 logits along that chain (teacher-forced, one forward); and the
    smallest gap between the top two logits on the chain (a flip needs a gap below the noise).
    """
    greedy = NaiveConfig(SamplingConfig(temperature=0.0))
    reference = sample_naive(pair, prompt_ids, 1, length, greedy, make_generator(0, pair.device)).tokens[0]
    sequence = torch.cat([prompt_ids, reference]).to(pair.device)  # (P + L,)
    P = prompt_ids.numel()

    @torch.no_grad()
    def logits_in_batch(B: int) -> torch.Tensor:
        out = pair.target(input_ids=sequence.expand(B, -1)).logits[:, P - 1:-1, : pair.vocab_size]
        return out.double().cpu()  # (B, L, V)

    alone = logits_in_batch(1)[0]  # (L, V)
    top2 = torch.topk(alone, 2, dim=-1).values
    gap = float((top2[:, 0] - top2[:, 1]).min())
    rows = []
    for B in batch_sizes:
        tokens = sample_naive(pair, prompt_ids, B, length, greedy, make_generator(0, pair.device)).tokens
        rows.append({"batch size": B, "chains equal to batch-1 chain": float((tokens == reference).all(dim=1).float().mean()),
                     "max |logit difference|": float((logits_in_batch(B) - alone).abs().max()),
                     "smallest top-2 logit gap": gap})
    return pd.DataFrame(rows)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def greedy_precision_effect(pair, prompt_ids: torch.Tensor, length: int,
                            dtypes=("float32", "bfloat16")) -> pd.DataFrame:
    """Greedy decoding of one prompt with the target's weights and activations in each dtype.

    The first dtype is the reference. For each: the first position (1-based) where its greedy
    chain leaves the reference chain (None if never) and the share of positions that agree.
    """
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; valid dtypes: {', '.join(DTYPES)}")
    greedy = NaiveConfig(SamplingConfig(temperature=0.0))
    chains = []
    for name in dtypes:
        cast = replace(pair, target=copy.deepcopy(pair.target).to(DTYPES[name]))
        chains.append((name, sample_naive(cast, prompt_ids, 1, length, greedy, make_generator(0, pair.device)).tokens[0]))
    reference = chains[0][1]
    rows = []
    for name, chain in chains:
        differs = (chain != reference).nonzero()
        rows.append({"dtype": name,
                     "first differing position": int(differs[0, 0]) + 1 if len(differs) else None,
                     "positions agreeing": float((chain == reference).float().mean()),
                     "text": pair.decode(chain.tolist())})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------- sampling + the suite (notebook 03)


@dataclass
class Check:
    """One sampler's samples and every test of :func:`specdec_lab.suite.run_suite` on them."""

    name: str
    lossless: bool
    tokens: np.ndarray  # (N, L)
    scores: Scores
    suite: SuiteResult
    pit: np.ndarray  # (N, L) randomized PIT values
    stats: dict  # sampler statistics (acceptance, tokens per pass) where the sampler has them
    exact_tv: float = float("nan")

    @property
    def first_counts(self) -> np.ndarray:
        return np.bincount(self.tokens[:, 0], minlength=len(self.scores.first_law))

    @property
    def first_freq(self) -> np.ndarray:
        return self.first_counts / len(self.tokens)

    def entry(self) -> dict:
        """The form :func:`specdec_lab.report.summary_table` reads."""
        return {"suite": self.suite, "lossless": self.lossless, "stats": self.stats, "exact_tv": self.exact_tv}


def check_sampler(pair, name: str, sampler, lossless: bool, prompt: str, n: int, length: int, seed: int,
                  settings: SuiteSettings = SuiteSettings(), folder: Path | None = None,
                  exact_tv: float = float("nan")) -> Check:
    """Collect ``n`` samples into a parquet file, score them under the exact p, run the suite."""
    folder = work_dir() if folder is None else Path(folder)
    samples = collect(pair, sampler, prompt, n, length, seed, folder / f"{_slug(name)}-{seed}.parquet",
                      progress=False)
    tokens = samples.tokens()
    scores = score(pair, pair.encode(prompt), tokens, sampler.sampling, settings.min_prefix_count)
    rng = np.random.default_rng(seed)
    suite = run_suite(name, tokens, scores, settings, rng)
    pit = stats.randomized_pit(scores.cdf_below, scores.p_x, rng)
    return Check(name, lossless, tokens, scores, suite, pit, samples.meta.get("stats") or {}, exact_tv)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()


def summary(checks: list[Check]) -> pd.DataFrame:
    """One row per sampler (:func:`specdec_lab.report.summary_table`)."""
    return report.summary_table([c.entry() for c in checks])


def suite_table(check: Check) -> pd.DataFrame:
    """Every test of one check: statistic and p-value."""
    return pd.DataFrame([{"test": name, "statistic": r.statistic, "p-value": r.pvalue}
                         for name, r in check.suite.tests.items()])


def conditional_table(pair, check: Check, rng_seed: int = 0) -> pd.DataFrame:
    """Per-prefix conditional G tests: one row per prefix visited often enough to be tested alone.

    Position t (1-based) is tested conditionally on the t − 1 tokens before it, against the exact
    p(· | prompt, prefix): the sequence test decomposes into these (see :func:`stats.conditional_tests`).
    """
    rng = np.random.default_rng(rng_seed)
    rows = []
    for (t, prefix), law in sorted(check.scores.prefix_laws.items()):
        visited = (check.tokens[:, :t] == np.asarray(prefix)).all(axis=1)
        counts = np.bincount(check.tokens[visited, t], minlength=len(law))
        res = stats.chisquare_identity(counts, law, statistic="g", rng=rng)
        rows.append({"position": t + 1, "prefix": pair.decode(prefix), "visits": int(visited.sum()),
                     "G": res.statistic, "df": res.df, "p-value": res.pvalue, "tail p-value": res.tail_pvalue,
                     "TV plug-in": stats.tv_plugin(counts, law)})
    return pd.DataFrame(rows, columns=["position", "prefix", "visits", "G", "df", "p-value", "tail p-value",
                                       "TV plug-in"])


def tv_bound_path(counts_in_order: np.ndarray, p: np.ndarray, sizes, confidence: float = 0.99) -> pd.DataFrame:
    """TV plug-in and upper bound on the first ``m`` samples, for each m in ``sizes``.

    ``counts_in_order`` are the sampled first tokens (N,) in collection order.
    """
    rows = []
    for m in sizes:
        counts = np.bincount(counts_in_order[:m], minlength=len(p))
        bound = stats.tv_upper_bound(counts, p, confidence=confidence)
        rows.append({"m": int(m), "TV plug-in": stats.tv_plugin(counts, p), "TV upper": bound.upper})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------ power and calibration (notebook 05)


def binned(p: np.ndarray, q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """p and q on the bins the chi-square test uses at sample size m (tail merged by ascending p)."""
    keep, tail = stats.merge_tail(p, m)
    if not tail.any():
        return p[keep], q[keep]
    return np.append(p[keep], p[tail].sum()), np.append(q[keep], q[tail].sum())


def power_curve(name: str, p: np.ndarray, q: np.ndarray, sizes, *, alpha: float = 0.01, reps: int = 200,
                rng: np.random.Generator) -> pd.DataFrame:
    """Rejection rate of the Pearson identity test of p when samples come from q, against theory.

    For each m: ``simulated`` (share of ``reps`` multinomial samples from q rejected at level α,
    with its standard error), ``noncentral χ²`` (the power predicted with the noncentrality
    λ = m Σ (q_b − p_b)² / p_b of this q on the test's bins) and ``planner (worst case)``
    (:func:`stats.power_chisquare` at the binned TV: what the planner promises any q at that TV).
    """
    rows = []
    for m in sizes:
        p_b, q_b = binned(p, q, m)
        df = len(p_b) - 1
        lam = m * float(((q_b - p_b) ** 2 / p_b).sum())
        predicted = float(sps.ncx2.sf(sps.chi2.isf(alpha, df), df, lam))
        tv_bins = 0.5 * float(np.abs(q_b - p_b).sum())
        draws = rng.multinomial(m, q, size=reps)
        rejected = np.mean([stats.chisquare_identity(c, p, rng=rng).pvalue < alpha for c in draws])
        rows.append({"alternative": name, "m": int(m), "bins": len(p_b), "TV on bins": tv_bins,
                     "simulated": float(rejected), "se": float(np.sqrt(max(rejected * (1 - rejected), 1e-4) / reps)),
                     "noncentral χ²": predicted,
                     "planner (worst case)": stats.power_chisquare(int(m), tv_bins, len(p_b), alpha)})
    return pd.DataFrame(rows)


def replicate_pvalues(pair, sampler, prompt_ids: torch.Tensor, replicates: int, m: int, seed: int) -> np.ndarray:
    """Pearson p-values of ``replicates`` independent first-token samples of size ``m``.

    One batched run of ``replicates · m`` independent chains, split into groups: chains are
    independent, so the groups are independent replicates. p is the exact first-token law at the
    sampler's settings. Under a correct sampler the p-values are close to Uniform(0, 1).
    """
    result = sampler.draw(pair, prompt_ids, replicates * m, 1, make_generator(seed, pair.device))
    groups = result.tokens[:, 0].numpy().reshape(replicates, m)
    p = first_token_law(pair, prompt_ids, sampler.sampling)
    rng = np.random.default_rng(seed)
    return np.array([stats.chisquare_identity(np.bincount(g, minlength=len(p)), p, rng=rng).pvalue for g in groups])


def with_settings(sampler: SpeculativeConfig, **sampling) -> SpeculativeConfig:
    """``sampler`` with some sampling settings changed (e.g. ``temperature=0.7``)."""
    return replace(sampler, sampling=replace(sampler.sampling, **sampling))


def sample_sizes(start: int, stop: int, factor: float = 2.0) -> list[int]:
    """Geometric grid start, start·factor, ... up to and including ``stop``.

    >>> sample_sizes(500, 4000)
    [500, 1000, 2000, 4000]
    """
    sizes = [int(start)]
    while sizes[-1] * factor < stop:
        sizes.append(int(round(sizes[-1] * factor)))
    return sizes + ([int(stop)] if sizes[-1] != stop else [])


def faulty_table() -> pd.DataFrame:
    """Every negative control: the bug, the shipped bug it reproduces, the settings where it shows."""
    return pd.DataFrame([{"name": v.name, "bug": v.description, "shipped as": v.anchor, "needs": v.needs or {}}
                         for v in FAULTY.values()])


def run_controls(pair, prompt: str, n: int, length: int, seed: int, settings: SuiteSettings = SuiteSettings(),
                 k: int = 4) -> list[Check]:
    """Every negative control of :func:`specdec_lab.verify.samplers_to_run`, ``n`` samples each,
    through the same suite a correct sampler gets; the exact TV over two tokens is attached (NaN for
    a control whose one-draw law is right and whose fault is dependence between draws)."""
    runs = [r for r in samplers_to_run(VerifyOptions(k=k, length=length)) if not r[2]]
    tvs = exact_rule_table(pair, pair.encode(prompt), runs, length=2).set_index("rule")["exact TV"]
    folder = work_dir()
    return [check_sampler(pair, name, sampler, False, prompt, n, length, seed + i, settings, folder, float(tvs.get(name, np.nan)))
            for i, (name, sampler, _) in enumerate(runs)]


def first_token_alternatives(pair, prompt_ids: torch.Tensor, names) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (p, q): the exact first-token law q of each named negative control (at the settings
    it needs) and the target law p at those settings. Sampling the control's first token is a
    multinomial draw from q, so power computed from q is the sampler's power."""
    out = {}
    for name in names:
        verifier = FAULTY[name]
        needs = dict(verifier.needs or {})
        config = SpeculativeConfig(k=needs.pop("k", 4), sampling=SamplingConfig(**needs), verifier=verifier)
        out[name] = (first_token_law(pair, prompt_ids, config.sampling), first_token_rule_law(pair, prompt_ids, config))
    return out


def planned_samples(curves: pd.DataFrame, alpha: float = 0.01, power: float = 0.9) -> dict[str, int]:
    """For each alternative of a :func:`power_curves` table: the planner's m for ``power`` against
    the worst case at that alternative's TV on the bins of the largest m."""
    last = curves.groupby("alternative", sort=False).last()
    return {name: stats.plan_sample_size(float(row["TV on bins"]), int(row["bins"]), alpha=alpha, power=power)
            for name, row in last.iterrows()}


def power_curves(alternatives: dict, sizes, *, alpha: float = 0.01, reps: int = 200, seed: int = 0) -> pd.DataFrame:
    """:func:`power_curve` for every (p, q) in ``alternatives``, stacked."""
    rng = np.random.default_rng(seed)
    return pd.concat([power_curve(name, p, q, sizes, alpha=alpha, reps=reps, rng=rng)
                      for name, (p, q) in alternatives.items()], ignore_index=True)


# ------------------------------------------------------------------- what the suite can see (notebook 05)


def _scaled_acceptance(delta: float):
    def accept(p_x, q_x):
        return torch.clamp((1 + delta) * p_x / q_x, max=1.0)
    return accept


def _residual_mixed(lam: float):
    from specdec_lab.samplers.rules import residual_positive_part

    def residual(p, q):
        return (1 - lam) * residual_positive_part(p, q) + lam * p
    return residual


def _draft_ratio_at(delta_t: float):
    from specdec_lab.samplers.rules import DraftLaws

    def draft_law(logits, config):
        return DraftLaws(to_probs(logits, config), to_probs(logits, replace(config, temperature=config.temperature + delta_t)))
    return draft_law


@dataclass(frozen=True)
class PlantedFamily:
    """A fault with a strength knob: strength 0 is the lossless rule."""

    name: str
    knob: str
    strengths: tuple  # the grid searched for the detection limit
    temperature: float = 1.0
    k: int = 4

    def rule(self, strength: float):
        """(verifier, bonus_law) of the rule at ``strength``."""
        from specdec_lab.samplers.rules import LEVIATHAN

        if self.knob == "δ":
            return replace(LEVIATHAN, name=self.name, lossless=False, accept_prob=_scaled_acceptance(strength)), None
        if self.knob == "λ":
            return replace(LEVIATHAN, name=self.name, lossless=False, residual=_residual_mixed(strength)), None
        if self.knob == "ΔT draft":
            return replace(LEVIATHAN, name=self.name, lossless=False, draft_law=_draft_ratio_at(strength)), None
        return LEVIATHAN, lambda logits, config: to_probs(logits, replace(config, temperature=config.temperature + strength))


PLANTED = (
    PlantedFamily("acceptance ratio × (1 + δ)", "δ", (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
    PlantedFamily("residual mixed with p at weight λ", "λ", (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)),
    PlantedFamily("draft ratio at T + ΔT (T = 0.7)", "ΔT draft", (0.005, 0.01, 0.02, 0.05, 0.1, 0.2), temperature=0.7),
    PlantedFamily("bonus token at T + ΔT (K = 1)", "ΔT bonus", (0.02, 0.05, 0.1, 0.2, 0.4, 0.8), k=1),
)


def planted_pair_laws(pair, prompt_ids: torch.Tensor, family: PlantedFamily, strength: float):
    """(q, p, exact TV): the exact joint law (V * V,) of the first two tokens of ``family`` at
    ``strength``, the target's, and their TV — by enumeration, no sampling."""
    config = SamplingConfig(temperature=family.temperature)
    verifier, bonus = family.rule(strength)
    law = exact.sequence_law(cached_logits_at(pair, prompt_ids), pair.vocab_size, family.k, 2, config, verifier,
                             bonus_law=bonus)
    return law.law.reshape(-1).numpy(), law.target.reshape(-1).numpy(), law.tv


def planted_families(step: int = 1) -> list[PlantedFamily]:
    """:data:`PLANTED` with every ``step``-th strength of each family's grid (a notebook scale's share)."""
    return [replace(f, strengths=f.strengths[::step]) for f in PLANTED]


def detection_power(pair, prompt_ids: torch.Tensor, m: int, reps: int, settings: SuiteSettings = SuiteSettings(),
                    families=PLANTED, seed: int = 0) -> pd.DataFrame:
    """For every planted family and strength: the share of ``reps`` suite runs on m two-token
    samples drawn from the fault's exact law that reject (the suite's power), with its exact TV.
    The tokens are drawn from the exact law, not by running the sampler: the suite sees exactly
    what the sampler would emit, at a fraction of the cost."""
    from specdec_lab.suite import draw_pairs, scores_from_law

    rng = np.random.default_rng(seed)
    rows = []
    for family in families:
        for strength in family.strengths:
            q, p, tv = planted_pair_laws(pair, prompt_ids, family, strength)
            q = np.clip(q, 0, None)
            rejected = 0
            for _ in range(reps):
                tokens = draw_pairs(q, m, rng)
                result = run_suite(family.name, tokens, scores_from_law(tokens, p, settings.min_prefix_count),
                                   settings, rng)
                rejected += result.verdict == "rejected"
            power = rejected / reps
            rows.append({"family": family.name, "knob": family.knob, "strength": strength, "exact TV (2 tokens)": tv,
                         "m": m, "reps": reps, "power": power, "se": float(np.sqrt(max(power * (1 - power), 1e-4) / reps))})
    return pd.DataFrame(rows)


def detection_limits(power: pd.DataFrame, level: float = 0.9) -> pd.DataFrame:
    """Per family: the smallest strength on the grid rejected with power >= ``level`` (NaN when none
    is), its exact TV, and the largest strength below it (the limit lies between the two)."""
    rows = []
    for (family, knob), group in power.groupby(["family", "knob"], sort=False):
        group = group.sort_values("strength")
        seen = group[group["power"] >= level]
        first = seen.iloc[0] if len(seen) else None
        below = group[group["strength"] < first["strength"]] if first is not None else group
        rows.append({"family": family, "knob": knob, "m": int(group["m"].iloc[0]),
                     "smallest strength with power ≥ 0.9": np.nan if first is None else first["strength"],
                     "its exact TV (2 tokens)": np.nan if first is None else first["exact TV (2 tokens)"],
                     "largest strength below (power)": "" if below.empty else
                     f"{below.iloc[-1]['strength']:g} ({below.iloc[-1]['power']:.2f})"})
    return pd.DataFrame(rows)


def size_meta_test(pair, prompt_ids: torch.Tensor, m: int, reps: int, settings: SuiteSettings = SuiteSettings(),
                   seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The suite on ``reps`` sample sets of m two-token samples drawn from the target's exact law.

    Returns (per-replicate p-values of every test and the Holm global p-value, summary) where the
    summary has the rejection rate at ``settings.alpha``, its binomial upper limit and the KS
    p-value of each single test's p-values against Uniform(0, 1) (Holm-combined entries are
    conservative by design and left out)."""
    from specdec_lab.suite import draw_pairs, pair_law, scores_from_law

    p = pair_law(pair, prompt_ids, SamplingConfig())
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(reps):
        tokens = draw_pairs(p, m, rng)
        result = run_suite("H0", tokens, scores_from_law(tokens, p, settings.min_prefix_count), settings, rng)
        rows.append({**{name: r.pvalue for name, r in result.tests.items()}, "Holm global": result.global_pvalue})
    table = pd.DataFrame(rows)
    rate = float((table["Holm global"] < settings.alpha).mean())
    summary = {"reps": reps, "m": m, "alpha": settings.alpha, "rejection rate": rate,
               "binomial limit (α + 3 se)": settings.alpha + 3 * np.sqrt(settings.alpha * (1 - settings.alpha) / reps),
               # single tests only: a Holm-adjusted p-value is conservative by design (not uniform)
               "KS p-value per test": {c: stats.uniformity_test(table[c]).pvalue for c in table.columns
                                       if "Holm" not in c}}
    return table, summary


# ------------------------------------------------------------------- memory wall (notebook 01)


def roofline_table(model: str, hardware_names, batch: int = 1, context: int = 0) -> pd.DataFrame:
    """One decoding step of ``model`` on each accelerator: bytes, time, tokens/s bound, what binds."""
    rows = []
    for name in hardware_names:
        r = theory.decode_roofline(model, name, batch=batch, context=context)
        hw = theory.get_hardware(name)
        rows.append({"hardware": name, "bandwidth TB/s": hw.bandwidth / 1e12, "TFLOP/s": hw.flops / 1e12,
                     "GB moved per step": r.bytes_moved / 1e9, "step ms": 1e3 * r.step_time_s,
                     "tokens/s ≤": r.tokens_per_s, "bound": r.bound, "compute used": r.compute_utilisation,
                     "compute-bound from batch": theory.compute_bound_batch(model, name, context)})
    return pd.DataFrame(rows)


def hardware_peaks(hardware_names) -> dict[str, tuple[float, float]]:
    """name -> (bandwidth bytes/s, peak FLOP/s), the two numbers a roofline needs."""
    return {name: (theory.get_hardware(name).bandwidth, theory.get_hardware(name).flops) for name in hardware_names}


def batch_sweep(model: str, hardware_names, batches, context: int = 0) -> pd.DataFrame:
    """Roofline tokens/s (all sequences together) and arithmetic intensity for each batch size."""
    rows = []
    for name in hardware_names:
        for batch in batches:
            r = theory.decode_roofline(model, name, batch=int(batch), context=context)
            rows.append({"hardware": name, "batch": int(batch), "tokens/s ≤": r.tokens_per_s, "bound": r.bound,
                         "FLOP per byte": r.arithmetic_intensity, "FLOP/s attained": r.flops / r.step_time_s,
                         "bytes per token": r.bytes_moved / (r.batch * r.tokens)})
    return pd.DataFrame(rows)


def measure_decode(pair, batches, steps: int = 8, repeats: int = 3, context: str = "ROMEO:\n") -> pd.DataFrame:
    """Measured decoding speed of the bundled target here: ``steps`` cached one-token steps at each
    batch size (median of ``repeats`` after a warm-up), next to the roofline of this machine
    (its copy bandwidth and fp32 matmul peak, measured by :func:`specdec_lab.bench.job_machine`)."""
    from specdec_lab import bench

    machine = bench.job_machine(bench.BenchConfig(repeats=repeats, matmul_size=1024, device=str(pair.device)))
    here = theory.Hardware("this machine", machine["copy_gbs"]["median"] * 1e9,
                           machine["matmul_gflops"]["median"] * 1e9, 1e12, "measured")
    spec = theory.get_model("bundled-target")
    prompt = pair.encode(context)
    rows = []
    for batch in batches:
        def run(B=int(batch)):
            sample_naive(pair, prompt, B, steps, NaiveConfig(), make_generator(0, pair.device))
        seconds = float(np.median(bench.time_repeats(run, repeats, pair.device)))
        bound = theory.decode_roofline(spec, here, batch=int(batch), context=prompt.numel())
        rows.append({"batch": int(batch), "ms per step": 1e3 * seconds / steps,
                     "tokens/s measured": batch * steps / seconds, "tokens/s roofline ≤": bound.tokens_per_s,
                     "bound": bound.bound, "share of roofline": batch * steps / seconds / bound.tokens_per_s})
    frame = pd.DataFrame(rows)
    frame.attrs["machine"] = {"copy GB/s": machine["copy_gbs"]["median"], "matmul GFLOP/s": machine["matmul_gflops"]["median"]}
    return frame


# ------------------------------------------------------------------- speedup calibrator (notebook 06)


def alpha_from_logits(target_logits: torch.Tensor, draft_logits: torch.Tensor, settings: dict) -> pd.DataFrame:
    """Mean acceptance α = Σ min(p, q) over real prefixes, for each sampling setting."""
    return pd.DataFrame([{"settings": label,
                          "α = Σ min(p, q)": float(np.mean(theory.acceptance_rate(to_probs(target_logits, config),
                                                                                   to_probs(draft_logits, config))))}
                         for label, config in settings.items()])


def measured_speculation(pair, prompt_ids: torch.Tensor, ks, n: int, length: int, seed: int = 0) -> pd.DataFrame:
    """Run the speculative sampler for each K: measured α and tokens per target pass, and the
    theory's (1 − α^{K+1})/(1 − α) at the measured α."""
    rows = []
    for k in ks:
        s = sample_speculative(pair, prompt_ids, n, length, SpeculativeConfig(k=int(k)),
                               make_generator(seed + int(k), pair.device)).stats
        rows.append({"K": int(k), "α measured": s["acceptance"], "tokens/pass measured": s["tokens_per_target_pass"],
                     "tokens/pass theory": s["theory_tokens_per_target_pass"]})
    return pd.DataFrame(rows)


def implied_alpha(speedup: float, k: int, c: float) -> float:
    """The acceptance α at which :func:`theory.expected_speedup` (α, K, c) equals ``speedup``
    (bisection; nan when even α = 1 cannot reach it).

    >>> round(implied_alpha(theory.expected_speedup(0.8, 4, 0.05), 4, 0.05), 6)
    0.8
    """
    if theory.expected_speedup(1.0, k, c) < speedup:
        return float("nan")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.expected_speedup(mid, k, c) < speedup else (lo, mid)
    return (lo + hi) / 2


# Llama-2 shapes (config.json of meta-llama/Llama-2-{7b,70b}-hf) for the gpt-fast headline, int4 weights.
LLAMA2_7B_INT4 = theory.ModelSpec("llama-2-7b int4", 6_738_415_616, layers=32, hidden_size=4096, attention_heads=32,
                                  kv_heads=32, head_dim=128, vocab_size=32_000, bytes_per_param=0.5)
LLAMA2_70B_INT4 = theory.ModelSpec("llama-2-70b int4", 68_976_648_192, layers=80, hidden_size=8192,
                                   attention_heads=64, kv_heads=8, head_dim=128, vocab_size=32_000, bytes_per_param=0.5)

CLAIMS = [  # (source, claimed speedup, target, draft, hardware); see the shared ANCHORS
    ("seed article: Llama-3.3-70B + Llama-3.2-1B", 2.5, "llama-70b", "llama-1b", "h100-sxm5"),
    ("gpt-fast: Llama-2-70B + 7B, int4 (48.4 vs 25.3 tok/s)", 48.4 / 25.3, LLAMA2_70B_INT4, LLAMA2_7B_INT4, "a100-80gb"),
]


def implied_alpha_table(ks=(3, 4, 5, 6)) -> pd.DataFrame:
    """For each published speedup claim: c from the roofline, and the α each K needs to deliver it."""
    rows = []
    for source, speedup, target, draft, hardware in CLAIMS:
        c = theory.draft_cost_ratio(target, draft, hardware)
        rows.append({"claim": source, "speedup": speedup, "c (roofline)": c,
                     **{f"α needed, K={k}": implied_alpha(speedup, int(k), c) for k in ks}})
    return pd.DataFrame(rows)


MANUAL_C = "manual c"  # the calibrator's hardware choice that keeps the c slider's value


def calibrator_view(alpha: float, k: int, c: float, hardware: str = MANUAL_C, target: str = "llama-70b",
                    draft: str = "llama-1b", k_max: int = 12):
    """What the calibrator shows for (α, K, c): the speedup curve over K = 0..k_max with K in red,
    one summary line, and the speedup table.

    ``hardware`` other than "manual c" replaces c by the roofline ratio of ``draft`` to ``target`` on it.
    Returns (figure, summary text, :func:`specdec_lab.theory.speedup_table` at the c used).

    >>> fig, text, table = calibrator_view(0.75, 4, 0.05)
    >>> text
    'K = 4: 3.05 tokens per target pass, speedup 2.54×. Best K = 7: 2.67×.\\nc = 0.0500 (slider).'
    >>> int(table.loc[table.best, "K"].iloc[0])
    7
    """
    source = "slider"
    if hardware != MANUAL_C:
        c = theory.draft_cost_ratio(target, draft, hardware)
        source = f"roofline of {draft} against {target} on {hardware}, batch 1"
    table = theory.speedup_table(alpha, c, k_max)
    fig = plots.speedup(table, k=k, title=f"Expected speedup at α = {alpha:.2f}, c = {c:.4f}")
    best = int(table.loc[table["best"], "K"].iloc[0])
    text = (f"K = {k}: {theory.expected_tokens_per_pass(alpha, k):.2f} tokens per target pass, speedup "
            f"{theory.expected_speedup(alpha, k, c):.2f}×. Best K = {best}: "
            f"{theory.expected_speedup(alpha, best, c):.2f}×.\nc = {c:.4f} ({source}).")
    return fig, text, table


def speedup_styler(table: pd.DataFrame, k: int):
    """The speedup table as the calibrator shows it: one column per K, best K in bold green,
    the chosen K shaded red."""
    wide = table.set_index("K")[["tokens/pass", "speedup"]].rename(columns={"speedup": "speedup ×"}).T
    best = int(table.loc[table["best"], "K"].iloc[0])

    def mark(column):
        style = "background-color: #fde0dd;" if column.name == k else ""
        style += " font-weight: bold; color: #1a7f37;" if column.name == best else ""
        return [style] * len(column)

    return wide.style.format("{:.3f}").apply(mark, axis=0).set_caption("K = draft tokens per target pass")


C_CHOICES = (0.001, 0.002, 0.003, 0.005, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5,
             0.7, 1.0)  # the calibrator's c slider: round values on a log-like scale (a 70B/1B pair is ~0.02)


def calibrator(alpha: float = 0.75, k: int = 4, c: float = 0.05):
    """ipywidgets controls (α, K, c, hardware) over :func:`calibrator_view`: the summary line, the
    speedup table and the curve. Picking a hardware takes c from the roofline and greys the c slider out."""
    import ipywidgets as widgets
    from IPython.display import display

    controls = dict(
        alpha=widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="α"),
        k=widgets.IntSlider(value=k, min=1, max=12, description="K"),
        c=widgets.SelectionSlider(options=sorted({*C_CHOICES, c}), value=c, description="c"),
        hardware=widgets.Dropdown(options=[MANUAL_C, *theory.HARDWARE], description="hardware"))

    def show(alpha, k, c, hardware):
        controls["c"].disabled = hardware != MANUAL_C
        fig, text, table = calibrator_view(alpha, k, c, hardware)
        print(text)
        display(speedup_styler(table, k))
        display(fig)

    return widgets.interactive(show, **controls)


def token_strings(pair) -> list[str]:
    """Every token of the pair's vocabulary as an axis label (:func:`specdec_lab.plots.token_label`)."""
    return [plots.token_label(pair.decode([i])) for i in range(pair.vocab_size)]


# ------------------------------------------------------------------- serving (notebook 08)


def memory_fit_table(config, hardware_names, tensor_parallel_sizes) -> pd.DataFrame:
    """Does ``config`` fit, per GPU, on each accelerator at each tensor parallel size?"""
    rows = []
    for hw in hardware_names:
        for tp in tensor_parallel_sizes:
            variant = replace(config, tensor_parallel=int(tp),
                              draft_tensor_parallel=None if config.draft_tensor_parallel is None else 1)
            fit = serving.check_memory(variant, hw)
            rows.append({"hardware": hw, "TP": int(tp), "fits": fit.fits, "needed GB/GPU": fit.needed / 1e9,
                         "allowed GB/GPU": fit.allowed / 1e9, "sequences of max length": fit.max_sequences})
    return pd.DataFrame(rows)


def method_commands(target: str, drafts: dict, k: int = 5, tensor_parallel: int = 4) -> pd.DataFrame:
    """The current vLLM command and the TensorRT-LLM decoding type for each speculation method."""
    rows = []
    for method, draft in drafts.items():
        config = serving.ServingConfig(target, method=method, draft=draft, k=k, tensor_parallel=tensor_parallel)
        rows.append({"method": method, "what": serving.METHODS[method].what,
                     "TensorRT-LLM decoding_type": serving.trtllm_settings(config)["speculative_config"]["decoding_type"],
                     "vLLM --speculative-config": json.dumps(serving.vllm_speculative_config(config))})
    return pd.DataFrame(rows)


def legacy_command(config) -> tuple[str, list[str]]:
    """:func:`serving.vllm_legacy_command` and the warnings it raised (their messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        command = serving.vllm_legacy_command(config)
    return command, [str(w.message) for w in caught]


# ------------------------------------------------------------------- audits (notebook 07)


def audit_first_freqs(table: pd.DataFrame, vocab_size: int) -> dict[str, np.ndarray]:
    """First-token frequencies of every audit in a :func:`specdec_lab.audit.run_audits` table,
    keyed by implementation and settings."""
    return {f"{r.name} ({row['settings']})": np.bincount(r.samples.tokens()[:, 0], minlength=vocab_size) / r.suite.m
            for r, (_, row) in zip(table.attrs["results"], table.iterrows())}


# ------------------------------------------------------------------- Medusa trees (notebook 04)


def medusa_contexts(pair, prompts: list[str], chains: int, positions: int, seed: int = 0) -> list[torch.Tensor]:
    """Real contexts for exact Medusa checks: each prompt followed by the first j tokens (j = 1..positions)
    of ``chains`` continuations the target wrote (so every context has the 2 tokens Medusa needs)."""
    contexts = []
    for i, text in enumerate(prompts):
        ids = pair.encode(text)
        cont = sample_naive(pair, ids, chains, positions, NaiveConfig(), make_generator(seed + i, pair.device)).tokens
        contexts += [torch.cat([ids, row[:j]]) for row in cont for j in range(1, positions + 1)]
    return contexts


def tree_labels(pair, heads, prompt_ids: torch.Tensor, tree) -> list[str]:
    """Node labels for :func:`specdec_lab.plots.tree`: the root token and each node's top-k candidate."""
    nodes, _, _ = exact.medusa_tree_at(pair, heads, prompt_ids, tree)
    return [plots.token_label(pair.decode(prompt_ids[-1:].tolist()))] + [plots.token_label(pair.decode([t]))
                                                                       for t in nodes.tolist()]


def medusa_exact_table(pair, heads, contexts, tree, settings: dict) -> pd.DataFrame:
    """Exact first-token law of one lossless tree step against p, at every context and setting.

    ``rejection_topk``: the root's distinct top-k candidates, recursive point-mass rejection;
    ``rejection_iid``: as many i.i.d. draws from head 1's q as the root has children (SpecInfer).
    """
    root_children = tree.children[0][tree.children[0] >= 0]
    errors = {(mode, label): 0.0 for mode in ("rejection_topk", "rejection_iid") for label in settings}
    acceptance = {label: [] for label in settings}
    for context in contexts:
        nodes, logits, head_logits = exact.medusa_tree_at(pair, heads, context, tree)
        for label, config in settings.items():
            p = to_probs(logits[0], config)
            q = to_probs(head_logits[0], config)
            topk = exact.tree_first_token_law(p, nodes[root_children - 1], None, "rejection_topk")
            iid = exact.tree_first_token_law(p, None, q, "rejection_iid", len(root_children))
            errors["rejection_topk", label] = max(errors["rejection_topk", label], float((topk - p).abs().max()))
            errors["rejection_iid", label] = max(errors["rejection_iid", label], float((iid - p).abs().max()))
            acceptance[label].append(float(torch.minimum(p, q).sum()))
    return pd.DataFrame([{"mode": mode, "settings": label, "contexts": len(contexts), "max |law - p|": err,
                          "mean Σ min(p, q_head1)": float(np.mean(acceptance[label]))}
                         for (mode, label), err in errors.items()])


def typical_tv_grid(pair, heads, contexts, tree, epsilons, alphas, temperatures) -> pd.DataFrame:
    """Mean over contexts of the exact TV between Medusa typical acceptance's first-token law and p,
    on a grid of ε, α and temperature (:func:`specdec_lab.exact.tv_typical`)."""
    rows = []
    for context in contexts:
        nodes, logits, _ = exact.medusa_tree_at(pair, heads, context, tree)
        rows += exact.tv_typical(logits, nodes, tree, epsilons, alphas, temperatures)
    return pd.DataFrame(rows).groupby(["temperature", "epsilon", "alpha"], as_index=False)["tv"].mean()


def medusa_runs(pair, prompt_ids: torch.Tensor, configs: dict, n: int, length: int, seed: int = 0) -> pd.DataFrame:
    """Sample each Medusa configuration: mean accepted tree depth and tokens per target pass."""
    from specdec_lab.samplers.medusa import sample_medusa

    rows = []
    for i, (name, config) in enumerate(configs.items()):
        s = sample_medusa(pair, prompt_ids, n, length, config, make_generator(seed + i, pair.device)).stats
        rows.append({"run": name, "mode": config.mode, "lossless": config.lossless, "tree": config.tree.describe(),
                     "temperature": config.sampling.temperature,
                     "accepted per pass": s["accepted_nodes"] / max(1, s["chain_steps"]),
                     "tokens per target pass": s["emitted_tokens"] / max(1, s["chain_steps"])})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------- vLLM (notebook 07)


def vllm_sampler_checks(pair, prompt_ids: torch.Tensor, requests: int, temperature: float = 1.0) -> pd.DataFrame:
    """vLLM's own rejection sampler on the exact p and q after ``prompt_ids``, with and without its
    ``apply_sampling_constraints`` step (:func:`specdec_lab.adapters.vllm.sampler_check`), one row per
    emitted position."""
    from specdec_lab.adapters import vllm

    steps = {True: "apply_sampling_constraints + rejection_sample", False: "rejection_sample alone"}
    return pd.concat([pd.DataFrame(vllm.sampler_check(pair, prompt_ids, temperature, requests=requests,
                                                      constraints=constraints)).assign(step=label)
                      for constraints, label in steps.items()], ignore_index=True)
