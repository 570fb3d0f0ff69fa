"""The verdict on a kernel's tallies: per-row, per-position tests, Holm, power, and a readable report.

See :mod:`specdec_lab.kernels.harness` for what each test checks. A kernel *passes* when no test is
rejected by Holm at ``alpha``; the report then also states each row class's worst certified TV
bound, and the audit's power: the smallest TV at position 0 that it detects with probability ≥ 0.99.

**Power.** For row s with m draws at position 0 and n bins after merging (``stats.merge_tail``),
Pearson's statistic against a law at TV ε has noncentrality λ ≥ m (2ε)² on the binned law
(Cauchy–Schwarz), so :func:`specdec_lab.stats.power_chisquare` at level α / (number of tests) —
the strictest level Holm can ask of one test — is a lower bound on the chance of rejecting; the
stated ε is the smallest with that bound ≥ 0.99, the largest over rows. It covers deviations visible
on the merged bins; moves of mass inside the merged tail are left to the tail test, whose power is
not stated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as sps

from specdec_lab import stats, verdicts
from specdec_lab.kernels.contract import Kernel, KernelSpec, as_spec
from specdec_lab.kernels.harness import AuditSettings, Tallies, collect
from specdec_lab.kernels.law import RowLaw, row_law
from specdec_lab.kernels.scenarios import Batch

POWER = 0.99
WORST_TOKENS = 5  # tokens shown per rejected law test
COLUMNS = ["kind", "row", "row_class", "scenario", "position", "pair", "m", "statistic", "pvalue", "tv_plugin",
           "tv_upper", "note"]
SHOWN = 8  # rejected tests shown in a report (the worst of each row and kind)


@dataclass(frozen=True)
class KernelAudit:
    """A kernel's audit: its verdict row (:class:`specdec_lab.verdicts.Verdict`: rejected by Holm, equivalent when
    every law test's TV bound is <= ε, inconclusive otherwise) and the evidence behind it."""

    kernel: str
    verdict: verdicts.Verdict
    tests: pd.DataFrame  # one row per test: kind, row, row_class, scenario, position, m, pvalue, holm, rejected, TV
    classes: pd.DataFrame  # per row class and position: tests, rejected, worst TV bound, smallest Holm p
    failed_rows: tuple[int, ...]  # scenario rows with a rejected test (or a contract violation)
    detectable_tv: float  # smallest TV at position 0 detected with probability >= 0.99 (see module notes)
    report: str  # the readable report
    samples_per_second: float  # scenario-row draws per second of kernel time
    harness_share: float  # the harness's own time / the kernel's time
    counts: np.ndarray  # (S, K+1, V) tokens emitted per row and position (for plots)
    laws: tuple[RowLaw, ...]  # the exact law of each row

    @property
    def passed(self) -> bool:
        """No test rejected the kernel (what ``assert_lossless_kernel`` asserts: a detection test with stated
        power, :attr:`detectable_tv`); :attr:`verdict` says whether it is also *certified* within ε."""
        return verdicts.word(self.verdict.verdict) != verdicts.REJECTED

    def worst(self, n: int = 3) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(title, counts, p) of the ``n`` law tests with the smallest Holm p-values (for plots)."""
        law = self.tests[self.tests["kind"] == "law"].sort_values("holm").head(n)
        return [(f"row {t.row} [{t.row_class}: {t.scenario}] position {t.position}: Holm p = {t.holm:.2g}, "
                 f"TV plug-in {t.tv_plugin:.3f}", self.counts[t.row, t.position], self.laws[t.row].p[t.position])
                for _, t in law.iterrows()]


def law_test(counts: np.ndarray, p: np.ndarray, rng: np.random.Generator, confidence: float) -> dict:
    """One row and position: Pearson with its tail test (Bonferroni), TV plug-in and certified bound."""
    m = int(counts.sum())
    impossible = counts[p == 0].sum()
    if impossible:  # a certain rejection; TV is at least the mass on impossible tokens
        return {"m": m, "statistic": np.inf, "pvalue": 0.0, "tv_plugin": np.nan, "tv_upper": 1.0,
                "note": f"{int(impossible):,} of {m:,} draws ({impossible / m:.1%}) on tokens of probability 0"}
    test = stats.chisquare_identity(counts, p, rng=rng)
    pvalue = test.pvalue if np.isnan(test.tail_pvalue) else min(1.0, 2 * min(test.pvalue, test.tail_pvalue))
    bound = stats.tv_upper_bound(counts, p, confidence=confidence)
    return {"m": m, "statistic": test.statistic, "pvalue": pvalue, "tv_plugin": stats.tv_plugin(counts, p),
            "tv_upper": bound.upper, "note": ""}


def acceptance_test(reached: int, kept: int, beta: float) -> dict:
    """Draws that kept the draft at j among those that reached j, against Binomial(reached, β_j)."""
    pvalue = float(sps.binomtest(kept, reached, min(1.0, max(0.0, beta))).pvalue) if reached else 1.0
    return {"m": reached, "statistic": kept, "pvalue": pvalue,
            "note": f"kept {kept} of {reached}, expected {beta * reached:.1f} (β = {beta:.4f})"}


def independence_test(total: float, terms: int) -> dict:
    """Σ 12 (u − ½)(u′ − ½) over ``terms`` pairs of independent PITs, standardised: two-sided normal p."""
    z = total / np.sqrt(terms) if terms else 0.0
    return {"m": terms, "statistic": z, "pvalue": float(2 * sps.norm.sf(abs(z))),
            "note": f"PIT correlation {total / terms:+.3f}" if terms else ""}


def run_tests(batch: Batch, laws: tuple[RowLaw, ...], tallies: Tallies, settings: AuditSettings) -> pd.DataFrame:
    """Every test of the audit as one table (before Holm)."""
    rng = np.random.default_rng(settings.seed + 2)
    rows = []
    for s, (row, law) in enumerate(zip(batch.rows, laws)):
        base = {"row": s, "row_class": row.row_class, "scenario": row.label()}
        if s in tallies.violations:
            rows.append({**base, "kind": "contract", "position": -1, "m": 0, "pvalue": 0.0,
                         "note": tallies.violations[s]})
        reached = tallies.counts[s].sum(axis=1)  # (K+1,)
        for j in range(row.n_drafts + 1):
            if reached[j]:
                rows.append({**base, "kind": "law", "position": j,
                             **law_test(tallies.counts[s, j], law.p[j], rng, settings.confidence)})
            if j < row.n_drafts:
                rows.append({**base, "kind": "acceptance", "position": j,
                             **acceptance_test(int(reached[j]), int(reached[j + 1]), float(law.accept[j]))})
        extra = tallies.counts[s, row.n_drafts + 1:].sum()
        if extra:
            rows.append({**base, "kind": "contract", "position": row.n_drafts + 1, "m": int(extra), "pvalue": 0.0,
                         "note": f"{int(extra)} tokens beyond the row's bonus position"})
    S = len(batch.rows)
    for s in range(S):
        for t in range(s, S):
            total, terms = ((tallies.pit_within[s], tallies.pairs_within) if s == t
                            else (tallies.pit_cross[s, t], tallies.pairs_cross))
            rows.append({"row": s, "row_class": batch.rows[s].row_class, "scenario": batch.rows[s].label(),
                         "kind": "independence", "position": 0, "pair": t, **independence_test(total, terms)})
    if -1 in tallies.violations:
        rows.append({"row": -1, "row_class": "all", "scenario": "whole batch", "kind": "contract", "position": -1,
                     "m": 0, "pvalue": 0.0, "note": tallies.violations[-1]})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def detectable_tv(laws: tuple[RowLaw, ...], samples: int, level: float) -> float:
    """Largest over rows of the smallest TV ε at position 0 whose worst-case Pearson power is >= 0.99 at ``level``."""
    worst = 0.0
    for law in laws:
        keep, tail = stats.merge_tail(law.p[0], samples)
        bins = int(keep.sum()) + int(tail.any())
        if bins < 2:
            continue
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if stats.power_chisquare(samples, mid, bins, level) >= POWER else (mid, hi)
        worst = max(worst, hi)
    return worst


def judge(kernel: str, batch: Batch, laws: tuple[RowLaw, ...], tallies: Tallies, settings: AuditSettings) -> KernelAudit:
    """Holm over every test; the verdict, its tables and its report."""
    tests = run_tests(batch, laws, tallies, settings)
    holm = stats.holm(tests["pvalue"].to_numpy(), alpha=settings.alpha)
    tests["holm"] = holm.adjusted
    tests["rejected"] = tests["holm"] <= settings.alpha
    failed = set(tests.loc[tests["rejected"], "row"])
    failed |= set(tests.loc[tests["rejected"] & (tests["kind"] == "independence"), "pair"].dropna().astype(int))
    failed.discard(-1)
    classes = (tests[tests["kind"] == "law"].groupby(["row_class", "position"])
               .agg(rows=("row", "nunique"), worst_tv_upper=("tv_upper", "max"), min_holm=("holm", "min"))
               .reset_index())
    power_tv = detectable_tv(laws, settings.samples, settings.alpha / max(1, len(tests)))
    draws = tallies.calls * tallies.rows_per_call
    worst = float(classes["worst_tv_upper"].max()) if len(classes) else float("nan")
    word = verdicts.decide(float(tests["holm"].min()), worst, alpha=settings.alpha, tolerance=settings.tolerance)
    row = verdicts.Verdict(kernel, word, settings.samples, worst, float(tests["holm"].min()), settings.tolerance,
                           details={"tests": len(tests), "rows": int(tests["row"].max()) + 1,
                                    "failed_rows": sorted(int(r) for r in failed), "detectable_tv": power_tv,
                                    "seed": settings.seed, "confidence": settings.confidence})
    verdict = KernelAudit(kernel, row, tests, classes, tuple(sorted(int(r) for r in failed)),
                      power_tv, "", draws / tallies.kernel_seconds if tallies.kernel_seconds else float("nan"),
                      tallies.harness_seconds / tallies.kernel_seconds if tallies.kernel_seconds else float("nan"),
                      tallies.counts, laws)
    return replace(verdict, report=report(verdict, tallies, laws, settings))


def report(verdict: KernelAudit, tallies: Tallies, laws: tuple[RowLaw, ...], settings: AuditSettings) -> str:
    """The verdict in words: what failed (rows, positions, worst tokens), or the bounds that passed."""
    tests = verdict.tests
    row = verdict.verdict
    words = {verdicts.REJECTED: "REJECTED (not lossless)",
             verdicts.EQUIVALENT: f"equivalent (no test rejected; every TV bound <= ε = {row.tolerance:g})",
             verdicts.INCONCLUSIVE: f"inconclusive (no test rejected; some TV bound above ε = {row.tolerance:g})"}
    head = (f"kernel {verdict.kernel!r}: {words[row.verdict]} — "
            f"{len(tests)} tests on {tests['row'].max() + 1} rows, {settings.samples:,} draws per row, "
            f"Holm at α = {settings.alpha:g}; detects TV ≥ {verdict.detectable_tv:.3f} at position 0 of any row "
            f"with probability ≥ {POWER}")
    lines = [head]
    if verdict.passed:
        lines.append(f"  TV upper bounds at {settings.confidence:.0%} (worst row of each class), by position:")
        for row_class, c in verdict.classes.groupby("row_class"):
            bounds = ", ".join(f"{b:.3f}" for b in c.sort_values("position")["worst_tv_upper"])
            lines.append(f"    {row_class:<11} ({c['rows'].max()} rows): {bounds}")
        return "\n".join(lines)
    lines.append(f"  failing rows: {list(verdict.failed_rows)}")
    worst = tests[tests["rejected"]].sort_values("holm").drop_duplicates(["row", "kind"])
    for _, t in worst.head(SHOWN).iterrows():
        where = f"row {t.row} [{t.row_class}: {t.scenario}]" if t.row >= 0 else "the batch"
        if t.kind == "law":
            tv = f"TV plug-in {t.tv_plugin:.3f}, TV ≤ {t.tv_upper:.3f}" if t.tv_plugin == t.tv_plugin else t.note
            lines.append(f"  {where} position {t.position}: emitted law ≠ p (m = {t.m:,}, Holm p = {t.holm:.2g}, {tv})")
            lines += worst_tokens(tallies.counts[t.row, t.position], laws[t.row].p[t.position])
        elif t.kind == "independence":
            lines.append(f"  {where} and row {int(t.pair)}: position-0 tokens of one call are dependent "
                         f"(z = {t.statistic:+.1f}, {t.note}, Holm p = {t.holm:.2g})")
        elif t.row < 0:
            lines.append(f"  the whole batch: {t.note}")
        else:
            lines.append(f"  {where} position {t.position}: {t.kind} — {t.note} (Holm p = {t.holm:.2g})")
    return "\n".join(lines)


def worst_tokens(counts: np.ndarray, p: np.ndarray) -> list[str]:
    """Table lines: the tokens whose observed mass is farthest from the exact mass."""
    m = counts.sum()
    gap = np.abs(counts / m - p)
    lines = [f"      {'token':>8} {'observed':>9} {'exact':>9}"]
    for x in np.argsort(-gap)[:WORST_TOKENS]:
        lines.append(f"      {x:>8} {counts[x] / m:>9.4f} {p[x]:>9.4f}")
    return lines


def supported(batch: Batch, spec: KernelSpec) -> Batch:
    """The rows of ``batch`` the kernel takes (no greedy rows / no ragged rows where it says so)."""
    return batch.select(lambda row: (spec.greedy or row.temperature > 0) and
                        (spec.ragged or row.n_drafts == batch.k))


def audit_kernel(kernel: Kernel | KernelSpec, batch: Batch, settings: AuditSettings = AuditSettings(),
                 progress=None) -> KernelAudit:
    """Run ``kernel`` on the rows of ``batch`` it supports and judge it (see the module notes).

    >>> from specdec_lab.kernels.ours import LOSSLESS
    >>> from specdec_lab.kernels.scenarios import standard_batch
    >>> verdict = audit_kernel(LOSSLESS, standard_batch(vocab_size=2000, k=3), AuditSettings(samples=300))
    >>> verdict.passed, verdict.failed_rows
    (True, ())
    """
    spec = as_spec(kernel)
    rows = supported(batch, spec)
    tallies = collect(spec, rows, settings, progress)
    return judge(spec.name, rows, tuple(row_law(row) for row in rows.rows), tallies, settings)
