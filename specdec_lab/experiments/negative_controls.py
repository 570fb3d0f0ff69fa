"""Notebook 05, negative controls and power: every control through the suite, power curves, planted faults,
the suite's size under H0."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

from specdec_lab import laws, stats
from specdec_lab.laws import cached_logits_at, first_token_law, first_token_rule_law
from specdec_lab.experiments.chi_square import Check, check_sampler, sample_sizes, summary  # noqa: F401 (for the notebook)
from specdec_lab.experiments.proof_by_numbers import exact_rule_table
from specdec_lab.experiments.scale import default_device, setup, work_dir  # noqa: F401 (for the notebook)
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.samplers.faulty import FAULTY, SMALL_EFFECT
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.suite import SuiteSettings, run_suite
from specdec_lab.verify import VerifyOptions, samplers_to_run


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


COMMON_ERROR = "common re-implementation error"  # how samplers.faulty marks a control that reproduces no shipped bug


def faulty_table() -> pd.DataFrame:
    """Every negative control: the bug, whether it reproduces a bug an engine shipped or a common
    re-implementation error (from its ``anchor``), the source, the settings where it shows."""
    return pd.DataFrame([{"name": v.name, "bug": v.description,
                          "kind": "common error" if v.anchor.startswith(COMMON_ERROR) else "shipped bug",
                          "source": v.anchor, "needs": v.needs or {}} for v in FAULTY.values()])


def reference_check(pair, prompt: str, n: int, length: int, seed: int, settings: SuiteSettings = SuiteSettings(),
                    k: int = 4) -> Check:
    """The correct speculative sampler (K = ``k``) through the same suite at the controls' sample size: the bar a
    control's TV bound is compared with (at a few thousand samples a correct sampler's bound is wide too)."""
    return check_sampler(pair, f"speculative K={k} (correct)", SpeculativeConfig(k=k), True, prompt, n, length, seed,
                         settings, work_dir(), 0.0)


def first_token_tvs(pair, prompt_ids: torch.Tensor, k: int = 4) -> dict[str, float]:
    """"faulty: <name>" -> exact TV of the control's first token from p, at the settings its fault needs (one
    verification step, :func:`specdec_lab.laws.first_token_rule_law`; ~0 for the bonus fault, whose first step
    is correct). A two-token law is at least as far from p's as its first token's, so this is at most the
    two-token TV."""
    out = {}
    for name, verifier in FAULTY.items():
        needs = dict(verifier.needs or {})
        config = SpeculativeConfig(k=needs.pop("k", k), sampling=SamplingConfig(**needs), verifier=verifier)
        p = first_token_law(pair, prompt_ids, config.sampling)
        out[f"faulty: {name}"] = 0.5 * float(np.abs(first_token_rule_law(pair, prompt_ids, config) - p).sum())
    return out


def run_controls(pair, prompt: str, n: int, length: int, seed: int, settings: SuiteSettings = SuiteSettings(),
                 k: int = 4) -> list[Check]:
    """Every negative control of :func:`specdec_lab.verify.samplers_to_run`, ``n`` samples each,
    through the same suite a correct sampler gets; the exact TV over two tokens is attached (NaN for
    a control whose one-draw law is right and whose fault is dependence between draws)."""
    runs = [r for r in samplers_to_run(VerifyOptions(k=k, length=length)) if not r[2]]
    tvs = exact_rule_table(pair, pair.encode(prompt), runs, length=2).set_index("rule")["exact TV"]
    folder = work_dir()
    return [check_sampler(pair, name, sampler, False, prompt, _control_size(sampler, n), length, seed + i, settings,
                          folder, float(tvs.get(name, np.nan)))
            for i, (name, sampler, _) in enumerate(runs)]


def _control_size(sampler, n: int) -> int:
    """n, or at least 10,000 for a control of :data:`~specdec_lab.samplers.faulty.SMALL_EFFECT` (as verify runs it)."""
    small = isinstance(sampler, SpeculativeConfig) and sampler.verifier.name in SMALL_EFFECT
    return max(n, 10_000) if small else n


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
    law = laws.sequence_law(cached_logits_at(pair, prompt_ids), pair.vocab_size, family.k, 2, config, verifier,
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
    summary has the rejection rate at ``settings.alpha`` with its exact 95% interval (Clopper-Pearson: with 20
    sets, 0 rejections only bound the rate below 0.17), its binomial upper limit and the KS
    p-value of each single test's p-values against Uniform(0, 1) (Holm-combined entries are
    conservative by design and left out)."""
    from specdec_lab.laws import pair_law
    from specdec_lab.suite import draw_pairs, scores_from_law

    p = pair_law(pair, prompt_ids, SamplingConfig())
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(reps):
        tokens = draw_pairs(p, m, rng)
        result = run_suite("H0", tokens, scores_from_law(tokens, p, settings.min_prefix_count), settings, rng)
        rows.append({**{name: r.pvalue for name, r in result.tests.items()}, "Holm global": result.global_pvalue})
    table = pd.DataFrame(rows)
    rejected = int((table["Holm global"] < settings.alpha).sum())
    interval = sps.binomtest(rejected, reps).proportion_ci(0.95)  # Clopper-Pearson
    size = {"reps": reps, "m": m, "alpha": settings.alpha, "rejected": rejected, "rejection rate": rejected / reps,
            "95% interval (Clopper-Pearson)": (float(interval.low), float(interval.high)),
               "binomial limit (α + 3 se)": settings.alpha + 3 * np.sqrt(settings.alpha * (1 - settings.alpha) / reps),
               # single tests only: a Holm-adjusted p-value is conservative by design (not uniform)
               "KS p-value per test": {c: stats.uniformity_test(table[c]).pvalue for c in table.columns
                                       if "Holm" not in c}}
    return table, size


def bug_anatomy(pair, prompt_ids: torch.Tensor) -> list[dict]:
    """Per negative control, where its first verification step puts the mass after the prompt, at the settings
    the fault needs (:func:`specdec_lab.laws.step_parts`): the accepted-draft part, the replacement part, the
    true target law p at those settings, and the exact TV of their sum from p.

    The bonus fault's first step is correct (its TV there is ~0); its anatomy is the bonus itself: with K = 1 and
    the draft accepted, the token after it is drawn from p at the draft's own position (the first token's law)
    instead of p at the next one. Its panel shows that bonus law against p(· | most likely first token) and
    the exact TV of the first two tokens (:func:`specdec_lab.laws.sequence_law`)."""
    target_logits, draft_logits = laws.first_token_logits(pair, prompt_ids)
    parts = []
    for name, verifier in FAULTY.items():
        needs = dict(verifier.needs or {})
        k = needs.pop("k", 4)
        config = SamplingConfig(**needs)
        p = to_probs(target_logits, config)
        if verifier.bonus_offset != 0:
            law = laws.sequence_law(cached_logits_at(pair, prompt_ids), pair.vocab_size, k, 2, config, verifier)
            first = int(torch.argmax(p))
            next_logits, _ = laws.model_logits_at(pair, prompt_ids)(torch.tensor([[first]]))
            p_next = to_probs(next_logits[0], config)
            parts.append({"name": f"{name} (token 2 after an accepted '{pair.decode([first])}', K = 1; TV of tokens 1–2)",
                          "p": p_next.numpy(), "kept": p.numpy(), "replaced": np.zeros_like(p.numpy()),
                          "labels": ("bonus drawn from p at position K", ""), "tv": law.tv, "settings": needs})
            continue
        if name in SMALL_EFFECT:  # its first token is exact: token 2's law after the most likely first token
            law = laws.sequence_law(cached_logits_at(pair, prompt_ids), pair.vocab_size, k, 2, config, verifier)
            first = int(torch.argmax(p))
            next_logits, _ = laws.model_logits_at(pair, prompt_ids)(torch.tensor([[first]]))
            p_next = to_probs(next_logits[0], config)
            token2 = law.law[first] / law.law[first].sum()
            parts.append({"name": f"{name} (token 2 after '{pair.decode([first])}', K = {k}; TV of tokens 1–2)",
                          "p": p_next.numpy(), "kept": token2.numpy(), "replaced": np.zeros_like(p.numpy()),
                          "labels": ("token 2's law given token 1", ""), "tv": law.tv, "settings": needs})
            continue
        if verifier.block:  # token 1: a kept first draft (τ ≥ 1) or the replacement after none (τ = 0)
            kept, replaced = laws.block_first_token_parts(cached_logits_at(pair, prompt_ids), k, config, verifier)
            parts.append({"name": f"{name} (token 1, K = {k})", "p": p.numpy(), "kept": kept.numpy(),
                          "replaced": replaced.numpy(), "tv": float(laws.tv(kept + replaced, p)), "settings": needs})
            continue
        kept, replaced = laws.step_parts(target_logits, draft_logits, config, verifier)
        parts.append({"name": f"{name} (token 1)", "p": p.numpy(), "kept": kept.numpy(), "replaced": replaced.numpy(),
                      "tv": float(laws.tv(kept + replaced, p)), "settings": needs})
    return parts


def meta_test_figure_frame(meta_table: pd.DataFrame, size: dict) -> pd.DataFrame:
    """The size meta-test as one row per test: its rejection rate over the replicates at α and the KS p-value
    of its p-values against Uniform(0, 1) (Holm-combined columns: rejection rate only)."""
    alpha = size["alpha"]
    return pd.DataFrame([{"test": column, "rejection rate": float((meta_table[column] < alpha).mean()),
                          "KS p-value": size["KS p-value per test"].get(column, np.nan)}
                         for column in meta_table.columns])
