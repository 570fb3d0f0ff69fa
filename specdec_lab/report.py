"""Tables and seaborn figures for a verification run (used by the CLI and the notebooks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab import plots


def verdict_table(entries: list[dict]) -> pd.DataFrame:
    """Sampler × test rows: statistic, p-value, TV plug-in, TV upper bound, KL, verdict."""
    rows = []
    for entry in entries:
        for row in entry["suite"].rows():
            rows.append({"expected": "lossless" if entry["lossless"] else "negative control",
                         "exact_tv": entry["exact_tv"], **row})
    return pd.DataFrame(rows)


def summary_table(entries: list[dict]) -> pd.DataFrame:
    """One row per sampler: what was expected, what the suite found, and whether that is right.

    Beside the first-token TV bound: which route bound it (``holder`` or ``plugin``), the bound on
    the joint law of the first two tokens, and the collision test's p-value (independence)."""
    rows = []
    for e in entries:
        s = e["suite"]
        stats = e["stats"] or {}
        joint = s.joint_bound
        rows.append({
            "sampler": s.name, "expected": "lossless" if e["lossless"] else "negative control",
            "m": s.m, "L": s.length, "exact TV (2 tokens)": e["exact_tv"], "TV plug-in": s.tv_plugin,
            "TV upper 99%": s.tv_bound.upper, "route": s.tv_bound.binding,
            "TV upper 99% (2 tokens)": np.nan if joint is None else joint.upper,
            "route (2 tokens)": "" if joint is None else joint.binding,
            "independence p": s.independence_pvalue, "KL (MM)": s.kl, "Holm p": s.global_pvalue,
            "acceptance": stats.get("acceptance", np.nan),
            "tokens/pass": stats.get("tokens_per_target_pass", np.nan),
            "theory tokens/pass": stats.get("theory_tokens_per_target_pass", np.nan),
            "verdict": s.verdict, "correct call": (s.verdict == "equivalent") == e["lossless"]
            and (e["lossless"] or s.verdict == "rejected"),
            "in words": s.verdict_text,
            "window": e.get("uncovered", ""),
            "seconds": e.get("seconds", np.nan),  # this row's wall time: collect, score, suite
        })
    return pd.DataFrame(rows)


def to_markdown(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub markdown table without the optional ``tabulate`` dependency."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else format(v, floatfmt)
        return str(v)
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def plot_tv_bounds(summary: pd.DataFrame, tolerance: float, path: Path) -> None:
    plots.save(plots.tv_bounds(summary, tolerance), path)


def plot_first_token(laws: dict[str, np.ndarray], exact: np.ndarray, path: Path, top: int = 25, tokens=None,
                     samples: dict[str, int] | int | None = None) -> None:
    """Empirical first-token frequencies of several samplers next to the exact target law, token strings on
    the axis and the ±2 sd band of each sample size (:func:`specdec_lab.plots.first_token`)."""
    plots.save(plots.first_token(laws, exact, top, tokens=tokens, samples=samples), path)


def plot_pit(pits: dict[str, np.ndarray], path: Path, bins: int = 20, verdicts: dict[str, str] | None = None,
             selection: str | None = None) -> None:
    """Randomized PIT histograms, panel titles coloured by verdict (flat is necessary, not sufficient)."""
    plots.save(plots.pit(pits, bins, verdicts=verdicts, selection=selection), path, dpi=100)


def plot_speedup(table: pd.DataFrame, path: Path | str | None = None, title: str = ""):
    """:func:`specdec_lab.plots.speedup` of a :func:`specdec_lab.theory.speedup_table`.

    Returns the figure; with ``path`` it is also written there and closed.
    """
    fig = plots.speedup(table, title=title)
    if path is not None:
        plots.save(fig, path)
    return fig
