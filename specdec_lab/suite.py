"""The verification suite: every test of :mod:`specdec_lab.stats` run on one sample set.

The target law is scored exactly (one cached forward of the target over the sampled tokens), then

- the first token after the prompt: Pearson and G (tail merged, tail tested), ADK, plug-in TV,
  Miller–Madow KL and the TV upper bound;
- all L positions: per-prefix conditional G tests with Holm, randomized PIT with KS, and the
  log-probability z-test.

The suite's p-values are combined with Holm. The verdict: **rejected** when the Holm-adjusted global
p-value is below α; **equivalent** when not rejected and the TV upper bound on the first-token law is
below ε; **inconclusive** otherwise (more samples needed; the planner says how many).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec_lab import stats
from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.decoder import Decoder


@dataclass(frozen=True)
class SuiteSettings:
    alpha: float = 0.01  # per sample set, Holm across the suite's tests
    tolerance: float = 0.02  # ε: a pass needs TV upper bound <= ε
    confidence: float = 0.99  # of the TV upper bound
    min_prefix_count: int = 200  # prefixes visited this often get their own conditional test
    n_resamples: int = 5000  # Monte Carlo draws for ADK


@dataclass
class Scores:
    """Exact target quantities at every sampled position; arrays are (N, L)."""

    p_x: np.ndarray
    cdf_below: np.ndarray
    entropy: np.ndarray
    varentropy: np.ndarray
    first_law: np.ndarray  # (V,) p(· | prompt)
    prefix_laws: dict  # (t, prefix tokens) -> (V,) p(· | prompt, prefix) for frequent prefixes


def frequent_prefixes(tokens: np.ndarray, min_count: int) -> dict:
    """(t, prefix) -> index of a first sample with that prefix, for prefixes seen >= min_count times."""
    found = {}
    for t in range(1, tokens.shape[1]):
        uniq, first, counts = np.unique(tokens[:, :t], axis=0, return_index=True, return_counts=True)
        for prefix, i in zip(uniq[counts >= min_count], first[counts >= min_count]):
            found[(t, tuple(int(x) for x in prefix))] = int(i)
    return found


@torch.no_grad()
def score(pair, prompt_ids: torch.Tensor, tokens: np.ndarray, sampling: SamplingConfig,
          min_prefix_count: int = 200, chunk: int = 1024) -> Scores:
    """Score sampled tokens (N, L) under the exact target law p (after ``sampling``)."""
    N, L = tokens.shape
    wanted = frequent_prefixes(tokens, min_prefix_count)
    by_row = {}
    for key, row in wanted.items():
        by_row.setdefault(row, []).append(key)
    out = {name: np.empty((N, L)) for name in ("p_x", "cdf_below", "entropy", "varentropy")}
    prefix_laws, first_law = {}, None
    x_all = torch.tensor(np.asarray(tokens), dtype=torch.long)
    for start in range(0, N, chunk):
        x = x_all[start:start + chunk].to(pair.device)  # (n, L)
        n = len(x)
        decoder = Decoder(pair.target, pair.vocab_size, n, pair.device)
        decoder.prefill(prompt_ids[:-1])
        inputs = torch.cat([prompt_ids[-1:].to(pair.device).expand(n, 1), x[:, :-1]], dim=1)  # (n, L)
        p = to_probs(decoder.feed(inputs), sampling)  # (n, L, V)
        p_x = p.gather(-1, x[..., None]).squeeze(-1)  # (n, L)
        below = (torch.cumsum(p, dim=-1) - p).gather(-1, x[..., None]).squeeze(-1)
        logp = torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), 0.0)
        entropy = -(p * logp).sum(-1)
        varentropy = (p * logp ** 2).sum(-1) - entropy ** 2
        for name, value in (("p_x", p_x), ("cdf_below", below), ("entropy", entropy),
                            ("varentropy", varentropy)):
            out[name][start:start + n] = value.cpu().numpy()
        if first_law is None:
            first_law = p[0, 0].cpu().numpy()
        for row in (r for r in by_row if start <= r < start + n):
            for key in by_row[row]:
                prefix_laws[key] = p[row - start, key[0]].cpu().numpy()
    return Scores(out["p_x"], out["cdf_below"], out["entropy"], out["varentropy"], first_law, prefix_laws)


@dataclass
class SuiteResult:
    name: str
    m: int
    tests: dict  # test name -> result object
    tv_plugin: float
    tv_bound: stats.TVBound
    kl: float
    global_pvalue: float
    verdict: str  # "equivalent" | "rejected" | "inconclusive"
    verdict_text: str
    impossible_tokens: int

    def rows(self) -> list[dict]:
        """One row per test, for the verdict table."""
        rows = []
        for test, res in self.tests.items():
            rows.append({"sampler": self.name, "test": test, "statistic": res.statistic,
                         "pvalue": res.pvalue, "m": self.m, "tv_plugin": self.tv_plugin,
                         "tv_upper": self.tv_bound.upper, "kl_mm": self.kl, "verdict": self.verdict})
        return rows


def run_suite(name: str, tokens: np.ndarray, scores: Scores, settings: SuiteSettings,
              rng: np.random.Generator) -> SuiteResult:
    """All tests on one sample set of tokens (N, L) with its exact scores."""
    N, L = tokens.shape
    impossible = int((scores.p_x <= 0).sum())
    first = np.bincount(tokens[:, 0], minlength=len(scores.first_law))
    p0 = scores.first_law
    if impossible:
        return _impossible(name, N, impossible, settings)
    tests = {
        "pearson (first token)": stats.chisquare_identity(first, p0, statistic="pearson", rng=rng),
        "G (first token)": stats.chisquare_identity(first, p0, statistic="g", rng=rng),
        "ADK (first token)": stats.adk_identity(first, p0, n_resamples=settings.n_resamples, rng=rng),
    }
    u = stats.randomized_pit(scores.cdf_below, scores.p_x, rng)  # (N, L)
    if L > 1:
        keys = np.array([f"{t}:" + ",".join(map(str, row[:t])) for t in range(1, L) for row in tokens])
        nexts = np.concatenate([tokens[:, t] for t in range(1, L)])
        laws = {f"{t}:" + ",".join(map(str, prefix)): law for (t, prefix), law in scores.prefix_laws.items()}
        tests["conditional G, Holm (positions 2..L)"] = stats.conditional_tests(
            keys, nexts, laws.__getitem__, pit=u[:, 1:].T.ravel(), min_count=settings.min_prefix_count,
            alpha=settings.alpha, rng=rng)
    tests["randomized PIT KS (all positions)"] = stats.pit_ks_test(u)
    tests["log-prob z (all positions)"] = stats.logprob_ztest(np.log(scores.p_x), scores.entropy,
                                                              scores.varentropy)
    pvalues = [r.pvalue for r in tests.values()]
    pvalues += [r.tail_pvalue for r in tests.values()
                if isinstance(r, stats.ChiSquareResult) and not np.isnan(r.tail_pvalue)]
    global_p = stats.holm(pvalues, settings.alpha).pvalue
    bound = stats.tv_upper_bound(first, p0, confidence=settings.confidence)
    verdict, text = _verdict(global_p, bound, settings, N, len(p0))
    return SuiteResult(name, N, tests, stats.tv_plugin(first, p0), bound, stats.kl_miller_madow(first, p0),
                       global_p, verdict, text, 0)


def _verdict(global_p: float, bound: stats.TVBound, settings: SuiteSettings, m: int, V: int):
    conf = f"{100 * settings.confidence:g}%"
    if global_p < settings.alpha:
        return "rejected", f"differs from the target law (Holm p = {global_p:.2g} < α = {settings.alpha:g})"
    if bound.upper <= settings.tolerance:
        return "equivalent", (f"TV ≤ {bound.upper:.4f} at {conf} confidence: equivalent within "
                              f"ε = {settings.tolerance:g}")
    return "inconclusive", (f"not rejected, but TV ≤ {bound.upper:.4f} at {conf} exceeds ε = "
                            f"{settings.tolerance:g}; collect more samples (m = {m})")


def _impossible(name, N, count, settings) -> SuiteResult:
    never = stats.ZResult(float(count), 0.0, N)
    bound = stats.TVBound(1.0, settings.confidence, float("inf"), 0.0, 1.0, N)
    return SuiteResult(name, N, {"impossible tokens": never}, float("nan"), bound, float("nan"), 0.0,
                       "rejected", f"emitted {count} token(s) the target law gives probability 0", count)
