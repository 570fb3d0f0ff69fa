"""The verification suite: every test of :mod:`specdec_lab.stats` run on one sample set.

The target law is scored exactly (one cached forward of the target over the sampled tokens, and
the exact joint law of the first two tokens, enumerated over all V² pairs), then

- the first token after the prompt: Pearson and G (tail merged, tail tested), ADK, plug-in TV,
  Miller–Madow KL and the TV upper bound;
- the first two tokens jointly (when L >= 2): ADK against the exact joint law, the TV upper bound
  on the joint law, and the **collision test of independence** (colliding pairs of two-token
  prefixes against their exact null);
- all L positions: per-prefix conditional G tests with Holm, randomized PIT with KS (all positions
  pooled, and each position alone with Holm), and the log-probability z-test.

The suite's p-values are combined with Holm. The verdict: **rejected** when the Holm-adjusted global
p-value is below α; **equivalent** when not rejected and every required TV upper bound is below its
tolerance (the first-token bound below ε; with ``joint_tolerance`` set, also the joint two-token
bound below it); **inconclusive** otherwise (more samples needed; the planner says how many).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec_lab import stats, verdicts
from specdec_lab.laws.target import TwoTokenLaw, two_token_law
from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.decoder import Decoder


@dataclass(frozen=True)
class SuiteSettings:
    alpha: float = 0.01  # per sample set, Holm across the suite's tests
    tolerance: float = 0.02  # ε: a pass needs the first-token TV upper bound <= ε
    joint_tolerance: float | None = None  # also the two-token joint bound <= this (None: reported only)
    confidence: float = 0.99  # of each TV upper bound
    min_prefix_count: int = 200  # prefixes visited this often get their own conditional test
    n_resamples: int = 5000  # Monte Carlo draws for ADK and the collision test


@dataclass
class Scores:
    """Exact target quantities at every sampled position; arrays are (N, L)."""

    p_x: np.ndarray
    cdf_below: np.ndarray
    entropy: np.ndarray
    varentropy: np.ndarray
    first_law: np.ndarray  # (V,) p(· | prompt)
    prefix_laws: dict  # (t, prefix tokens) -> (V,) p(· | prompt, prefix) for frequent prefixes
    pair_law: np.ndarray | None = None  # (V * V,) exact joint law of the first two tokens, x1 * V + x2


def frequent_prefixes(tokens: np.ndarray, min_count: int) -> dict:
    """(t, prefix) -> index of a first sample with that prefix, for prefixes seen >= min_count times."""
    found = {}
    for t in range(1, tokens.shape[1]):
        uniq, first, counts = np.unique(tokens[:, :t], axis=0, return_index=True, return_counts=True)
        for prefix, i in zip(uniq[counts >= min_count], first[counts >= min_count]):
            found[(t, tuple(int(x) for x in prefix))] = int(i)
    return found


def _position_scores(p: np.ndarray | torch.Tensor, x) -> dict:
    """p_x, cdf_below, entropy, varentropy of tokens x (...) under their laws p (..., V)."""
    p, x = torch.as_tensor(p), torch.as_tensor(x)
    p_x = p.gather(-1, x[..., None]).squeeze(-1)
    below = (torch.cumsum(p, dim=-1) - p).gather(-1, x[..., None]).squeeze(-1)
    logp = torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), 0.0)
    entropy = -(p * logp).sum(-1)
    varentropy = (p * logp ** 2).sum(-1) - entropy ** 2
    return {"p_x": p_x, "cdf_below": below, "entropy": entropy, "varentropy": varentropy}


def _first_two(tokens: np.ndarray, first: np.ndarray, cond: np.ndarray, min_count: int):
    """Scores of positions 1 and 2 (N, min(2, L)) read off the exact tables (first (V,), cond
    (V, V)), and the laws of the frequent one-token prefixes."""
    N, L = len(tokens), min(2, tokens.shape[1])
    tables = torch.as_tensor(np.concatenate([first[None], cond]))  # (1 + V, V): row 0 the first law, row 1 + x1 the second
    per_row = _position_scores(tables, torch.zeros(len(tables), dtype=torch.long))
    below = torch.cumsum(tables, dim=-1) - tables  # (1 + V, V)
    rows = np.stack([np.zeros(N, dtype=np.int64), 1 + tokens[:, 0]], axis=1)[:, :L]  # (N, L) table row per position
    x = tokens[:, :L]
    out = {"p_x": tables.numpy()[rows, x], "cdf_below": below.numpy()[rows, x],
           "entropy": per_row["entropy"].numpy()[rows], "varentropy": per_row["varentropy"].numpy()[rows]}
    prefix_laws = {(1, (int(v),)): cond[v] for v in frequent_first(tokens, min_count)} if L == 2 else {}
    return out, prefix_laws


@torch.no_grad()
def score(pair, prompt_ids: torch.Tensor, tokens: np.ndarray, sampling: SamplingConfig,
          min_prefix_count: int = 200, chunk: int = 1024, law: TwoTokenLaw | None = None) -> Scores:
    """Score sampled tokens (N, L) under the exact target law p (after ``sampling``).

    Positions 1 and 2 are read off the exact two-token law (``law``, computed here when not given;
    rows that share a prompt and settings share it); positions 3..L come from the target, fed each distinct
    prefix once (:func:`later_laws`) over chunks of the samples in lexicographic order, started from the law's
    cache after (prompt, x1)."""
    N, L = tokens.shape
    law = two_token_law(pair, prompt_ids, sampling) if law is None else law
    out, prefix_laws = _first_two(tokens, law.first, law.cond, min_prefix_count)
    if L > 2:
        wanted = {key: row for key, row in frequent_prefixes(tokens, min_prefix_count).items() if key[0] >= 2}
        later = {name: np.empty((N, L - 2)) for name in out}
        x_all = torch.tensor(np.asarray(tokens), dtype=torch.long)
        order = np.lexsort(np.asarray(tokens).T[::-1])  # (N,) samples sorted by x1, then x2, ...: prefixes adjacent
        at = np.empty(N, dtype=np.int64)
        at[order] = np.arange(N)  # sample -> its place in that order
        for start in range(0, N, chunk):
            rows = order[start:start + chunk]  # (n,) samples of this chunk
            x = x_all[rows].to(pair.device)  # (n, L)
            p = later_laws(law.decoder, x, sampling)  # (n, L - 2, V): positions 3..L
            for name, value in _position_scores(p, x[:, 2:]).items():
                later[name][rows] = value.cpu().numpy()
            for key, row in wanted.items():
                if start <= at[row] < start + len(rows):
                    prefix_laws[key] = p[at[row] - start, key[0] - 2].cpu().numpy()
        out = {name: np.concatenate([out[name], later[name]], axis=1) for name in out}
    return Scores(out["p_x"], out["cdf_below"], out["entropy"], out["varentropy"], law.first, prefix_laws,
                  law.joint if L >= 2 else None)


@torch.no_grad()
def later_laws(after_x1: Decoder, x: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The target's law at positions 3..L of samples x (n, L) -> (n, L - 2, V), from ``after_x1`` (chain v: the
    prompt and x1 = v), feeding each distinct prefix's last token once: level by level, the distinct prefixes of
    length k continue copies of their parents' caches (``Decoder.branch``). Samples of a sampler share most short
    prefixes (176,182 speculative samples at T = 1 hold 3,921 distinct (x1, x2)), so this feeds about a third of
    the n (L − 2) tokens that one chain per sample would."""
    n, L = x.shape
    laws = torch.empty(n, L - 2, after_x1.vocab_size, dtype=torch.float64, device=x.device)
    decoder, parent_of_sample = after_x1, x[:, 0]  # (n,) each sample's chain in ``decoder``
    for k in range(2, L):  # feed x_k after each distinct prefix x_1..x_{k-1}: the law of x_{k+1}
        prefixes, node_of_sample = torch.unique(x[:, :k], dim=0, return_inverse=True)  # (u, k), (n,)
        first = torch.empty(len(prefixes), dtype=torch.long, device=x.device)
        first[node_of_sample] = torch.arange(n, device=x.device)  # a sample of each prefix
        decoder = decoder.branch(parent_of_sample[first])  # u chains: each prefix's parent
        laws[:, k - 2] = to_probs(decoder.feed(prefixes[:, -1:]), sampling)[:, -1][node_of_sample]
        parent_of_sample = node_of_sample
    return laws


def draw_pairs(pair_law_: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """m i.i.d. two-token samples (m, 2) drawn straight from an exact joint law (V * V,): the
    suite's input under H0 (or under a planted fault's exact law) without running a sampler."""
    V = int(round(np.sqrt(len(pair_law_))))
    cells = rng.choice(len(pair_law_), size=m, p=pair_law_ / pair_law_.sum())
    return np.stack([cells // V, cells % V], axis=1)


def scores_from_law(tokens: np.ndarray, target_pair_law: np.ndarray, min_prefix_count: int = 200) -> Scores:
    """The :class:`Scores` of two-token samples (N, 2), read off the target's exact joint law
    (V * V,) instead of a model forward: what :func:`score` returns for the same tokens."""
    if tokens.shape[1] != 2:
        raise ValueError(f"scores_from_law scores two-token samples, got L = {tokens.shape[1]}")
    V = int(round(np.sqrt(len(target_pair_law))))
    joint = target_pair_law.reshape(V, V)
    first = joint.sum(1)  # (V,)
    cond = joint / np.where(first > 0, first, 1.0)[:, None]  # (V, V) p(x2 | x1)
    out, prefix_laws = _first_two(tokens, first, cond, min_prefix_count)
    return Scores(out["p_x"], out["cdf_below"], out["entropy"], out["varentropy"], first, prefix_laws,
                  target_pair_law)


def frequent_first(tokens: np.ndarray, min_count: int) -> np.ndarray:
    """First tokens seen at least ``min_count`` times."""
    values, counts = np.unique(tokens[:, 0], return_counts=True)
    return values[counts >= min_count]


@dataclass
class SuiteResult:
    name: str
    m: int
    tests: dict  # test name -> result object
    tv_plugin: float
    tv_bound: stats.TVBound
    kl: float
    global_pvalue: float
    verdict: str  # verdicts.EQUIVALENT | REJECTED | INCONCLUSIVE (decided by verdicts.decide)
    verdict_text: str
    impossible_tokens: int
    joint_bound: stats.TVBound | None = None  # TV of the first two tokens' joint law (L >= 2)
    joint_tv_plugin: float = float("nan")
    length: int = 1
    rejected_by: tuple = ()  # tests whose Holm-adjusted p-value is below α

    @property
    def independence_pvalue(self) -> float:
        test = self.tests.get(COLLISIONS)
        return float("nan") if test is None else test.pvalue

    def rows(self) -> list[dict]:
        """One row per test, for the verdict table."""
        rows = []
        joint = float("nan") if self.joint_bound is None else self.joint_bound.upper
        for test, res in self.tests.items():
            rows.append({"sampler": self.name, "test": test, "statistic": res.statistic,
                         "pvalue": res.pvalue, "m": self.m, "L": self.length, "tv_plugin": self.tv_plugin,
                         "tv_upper": self.tv_bound.upper, "tv_upper_joint": joint, "kl_mm": self.kl,
                         "verdict": self.verdict})
        return rows


COLLISIONS = "collisions (first two tokens)"


def run_suite(name: str, tokens: np.ndarray, scores: Scores, settings: SuiteSettings,
              rng: np.random.Generator) -> SuiteResult:
    """All tests on one sample set of tokens (N, L) with its exact scores."""
    N, L = tokens.shape
    impossible = int((scores.p_x <= 0).sum())
    first = np.bincount(tokens[:, 0], minlength=len(scores.first_law))
    p0 = scores.first_law
    if impossible:
        return _impossible(name, N, impossible, settings, L)
    tests = {
        "pearson (first token)": stats.chisquare_identity(first, p0, statistic="pearson", rng=rng),
        "G (first token)": stats.chisquare_identity(first, p0, statistic="g", rng=rng),
        "ADK (first token)": stats.adk_identity(first, p0, n_resamples=settings.n_resamples, rng=rng),
    }
    joint_bound, joint_plugin = None, float("nan")
    if L >= 2 and scores.pair_law is not None:
        V = len(p0)
        pairs = np.bincount(stats.pair_cells(tokens[:, 0], tokens[:, 1], V), minlength=V * V)
        tests["ADK (first two tokens, joint)"] = stats.adk_identity(pairs, scores.pair_law,
                                                                   n_resamples=settings.n_resamples, rng=rng)
        tests[COLLISIONS] = stats.collision_test(pairs, scores.pair_law, n_resamples=settings.n_resamples,
                                                 rng=rng)
        joint_bound = stats.tv_upper_bound(pairs, scores.pair_law, confidence=settings.confidence)
        joint_plugin = stats.tv_plugin(pairs, scores.pair_law)
    u = stats.randomized_pit(scores.cdf_below, scores.p_x, rng)  # (N, L)
    if L > 1:
        keys = np.array([f"{t}:" + ",".join(map(str, row[:t])) for t in range(1, L) for row in tokens])
        nexts = np.concatenate([tokens[:, t] for t in range(1, L)])
        laws = {f"{t}:" + ",".join(map(str, prefix)): law for (t, prefix), law in scores.prefix_laws.items()}
        tests["conditional G, Holm (positions 2..L)"] = stats.conditional_tests(
            keys, nexts, laws.__getitem__, pit=u[:, 1:].T.ravel(), min_count=settings.min_prefix_count,
            alpha=settings.alpha, rng=rng)
    tests["randomized PIT KS (all positions)"] = stats.pit_ks_test(u)
    if L > 1:  # a bug at one position (a bonus token at K+1) is diluted in the pooled KS
        tests["randomized PIT KS by position, Holm"] = stats.holm(
            [stats.pit_ks_test(u[:, t]).pvalue for t in range(L)], settings.alpha)
    tests["log-prob z (all positions)"] = stats.logprob_ztest(np.log(scores.p_x), scores.entropy,
                                                              scores.varentropy)
    names = list(tests)
    pvalues = [tests[t].pvalue for t in names]
    for t in list(names):
        r = tests[t]
        if isinstance(r, stats.ChiSquareResult) and not np.isnan(r.tail_pvalue):
            names.append(f"{t} tail")
            pvalues.append(r.tail_pvalue)
    holm = stats.holm(pvalues, settings.alpha)
    rejected_by = tuple(t for t, adj in zip(names, holm.adjusted) if adj < settings.alpha)
    bound = stats.tv_upper_bound(first, p0, confidence=settings.confidence)
    verdict, text = _verdict(holm.pvalue, bound, joint_bound, settings, N, rejected_by)
    return SuiteResult(name, N, tests, stats.tv_plugin(first, p0), bound, stats.kl_miller_madow(first, p0),
                       holm.pvalue, verdict, text, 0, joint_bound, joint_plugin, L, rejected_by)


def _verdict(global_p: float, bound: stats.TVBound, joint: stats.TVBound | None, settings: SuiteSettings,
             m: int, rejected_by: tuple = ()):
    conf = f"{100 * settings.confidence:g}% confidence"
    if joint is not None:  # two bounds: each holds at the level, both at once at >= 2·level − 1 (Bonferroni)
        conf = f"{conf} each ({100 * (2 * settings.confidence - 1):g}% both at once)"
    need_joint = settings.joint_tolerance is not None
    if need_joint and joint is None:
        raise ValueError("joint_tolerance needs samples of at least 2 tokens")
    also = ((joint.upper, settings.joint_tolerance),) if need_joint else ()
    verdict = verdicts.decide(global_p, bound.upper, alpha=settings.alpha, tolerance=settings.tolerance, also=also)
    if verdict == verdicts.REJECTED:
        return verdict, (f"differs from the target law (Holm p = {global_p:.2g} < α = {settings.alpha:g}; "
                         f"rejected by {', '.join(rejected_by)})")
    said = f"first token TV ≤ {bound.upper:.4f} ({bound.binding})"
    if joint is not None:
        said += f", first two tokens TV ≤ {joint.upper:.4f} ({joint.binding})"
    tolerance = f"ε = {settings.tolerance:g}" + (f" (joint: {settings.joint_tolerance:g})" if need_joint else "")
    if verdict == verdicts.EQUIVALENT:
        return verdict, f"{said} at {conf}: equivalent within {tolerance}"
    return verdict, f"not rejected, but {said} at {conf} exceeds {tolerance}; collect more samples (m = {m})"


def _impossible(name, N, count, settings, L) -> SuiteResult:
    never = stats.ZResult(float(count), 0.0, N)
    bound = stats.TVBound(1.0, settings.confidence, N, 1.0, 1.0, "holder", 1.0, float("inf"), 0.0, 1.0, 0.0)  # TV <= 1, trivially
    return SuiteResult(name, N, {"impossible tokens": never}, float("nan"), bound, float("nan"), 0.0,
                       verdicts.REJECTED, f"emitted {count} token(s) the target law gives probability 0", count,
                       bound if L >= 2 else None, float("nan"), L, ("impossible tokens",))
