"""Tables of a verification run: per test, per sampler, and the rows as :class:`~specdec_lab.verdicts.Verdict`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec_lab import verdicts
from specdec_lab.sampling import SamplingConfig


def verdict_table(entries: list[dict]) -> pd.DataFrame:
    """Sampler × test rows: statistic, p-value, TV plug-in, TV upper bound, KL, verdict."""
    rows = []
    for entry in entries:
        for row in entry["suite"].rows():
            rows.append({"expected": _expected(entry),
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
            "sampler": s.name, "expected": _expected(e),
            "m": s.m, "L": s.length, "exact TV (2 tokens)": e["exact_tv"], "TV plug-in": s.tv_plugin,
            "TV upper 99%": s.tv_bound.upper, "route": s.tv_bound.binding,
            "TV upper 99% (2 tokens)": np.nan if joint is None else joint.upper,
            "route (2 tokens)": "" if joint is None else joint.binding,
            "independence p": s.independence_pvalue, "KL (MM)": s.kl, "Holm p": s.global_pvalue,
            "acceptance": stats.get("acceptance", np.nan),
            "tokens/pass": stats.get("tokens_per_target_pass", np.nan),
            "theory tokens/pass": stats.get("theory_tokens_per_target_pass", np.nan),
            "verdict": s.verdict, "correct call": verdicts.correct_call(s.verdict, _expected(e)),
            "in words": s.verdict_text,
            "window": e.get("uncovered", ""),
            "seconds": e.get("seconds", np.nan),  # this row's wall time: collect, score, suite
        })
    return pd.DataFrame(rows)


def settings_label(sampling: SamplingConfig) -> str:
    """Short text for a sampling configuration.

    >>> settings_label(SamplingConfig(temperature=0.7, top_p=0.9))
    'T=0.7 top-p=0.9'
    """
    parts = [f"T={sampling.temperature:g}"]
    if sampling.top_k is not None:
        parts.append(f"top-k={sampling.top_k}")
    if sampling.top_p < 1.0:
        parts.append(f"top-p={sampling.top_p:g}")
    return " ".join(parts)


def _expected(entry: dict) -> str:
    return verdicts.LOSSLESS if entry["lossless"] else verdicts.NEGATIVE_CONTROL


# summary column -> results.json field, for the columns a verify row's record carries besides the verdict's own
VERIFY_DETAILS = {"L": "L", "exact TV (2 tokens)": "exact_tv_2_tokens", "TV plug-in": "tv_plugin",
                  "route": "route", "TV upper 99% (2 tokens)": "tv_upper_2_tokens",
                  "route (2 tokens)": "route_2_tokens", "independence p": "independence_p", "KL (MM)": "kl_mm",
                  "acceptance": "acceptance", "tokens/pass": "tokens_per_pass",
                  "theory tokens/pass": "theory_tokens_per_pass", "window": "window", "seconds": "seconds"}


def verdict_rows(summary: pd.DataFrame, tolerance: float, details: dict | None = None) -> list[verdicts.Verdict]:
    """The rows of a :func:`summary_table` as verdicts (``TV upper 99%``, the first-token bound, is the row's
    ``tv_upper``); ``details`` (sampler → dict) adds per-row fields such as settings and seed."""
    rows = []
    for _, r in summary.iterrows():
        extra = {field: r[column] for column, field in VERIFY_DETAILS.items() if column in r}
        extra.update((details or {}).get(r["sampler"], {}))
        rows.append(verdicts.Verdict(r["sampler"], r["verdict"], int(r["m"]), float(r["TV upper 99%"]),
                                     float(r["Holm p"]), tolerance, r["expected"], r["in words"], extra))
    return rows


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
