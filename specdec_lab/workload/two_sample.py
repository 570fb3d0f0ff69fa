"""Two-sample mode: each cell's outcomes against a reference server's (the same engine without speculation).

What is certified, per cell and simultaneously over the cells at the run's level: **TV(server, reference)** of the
law of the cell's outcome (tokens 1–2 and how the completion ended, or the text cell's outcome), by the smaller
of two bounds, each at half the cell's share of δ:

- **coupling** (seeded cells): each seeded request is sent to both servers with the same seed and settings; the
  pairs (server's outcome, reference's outcome) over distinct seeds are i.i.d., so TV ≤ P(outcomes differ), bounded
  by Clopper–Pearson on the mismatch count (:func:`specdec_lab.stats.coupling_tv_upper`). A server whose
  speculation replays plain sampling for a seed mismatches rarely and is certified from a few hundred requests;
- **two-sample** (every cell): the McDiarmid bound on TV between two *independent* samples
  (:func:`specdec_lab.stats.two_sample_tv_upper`): for a seeded cell the server's even-numbered requests against the
  reference's odd-numbered ones (distinct seeds), for an unseeded cell all of both.

Rejection: the two-sample closeness test on the same independent samples, Holm across cells at α. A coupling
mismatch alone never rejects (two lossless samplers may draw their random numbers differently). With the reference
judged against the exact law (:func:`specdec_lab.workload.audit_workload` on it), TV(server, p) ≤ TV(server,
reference) + TV(reference, p) (the triangle inequality), at the two bounds' joint level.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from specdec_lab import stats, verdicts
from specdec_lab.suite import SuiteSettings
from specdec_lab.workload.cells import Cell, Workload
from specdec_lab.workload.judge import token_outcome
from specdec_lab.workload.sequential import spent

COUPLING, TWO_SAMPLE = "coupling", "two-sample"


def outcome_keys(cell: Cell, frame: pd.DataFrame, request_tokens: int, eos: int | None) -> pd.Series:
    """Each answered completion's outcome as a hashable key, indexed by (request, choice); impossible endings keep
    their kind (they are outcomes too: a server that cuts completions short mismatches its reference)."""
    good = frame[(frame["status"] == 200) & (frame["choice"] >= 0)]
    if cell.observes_text or cell.structured:
        keys = [(t, f) for t, f in zip(good["text"], good["finish"])]
    else:
        keys = []
        for t, f in zip(good["tokens"], good["finish"]):
            kind, pair = token_outcome(None if t is None else list(t), f, request_tokens, eos)
            keys.append(pair if pair is not None else (kind,))
    return pd.Series(keys, index=pd.MultiIndex.from_arrays([good["request"], good["choice"]]), dtype=object)


def compare_cell(cell: Cell, a: pd.Series, b: pd.Series, confidence: float, n_resamples: int,
                 rng: np.random.Generator) -> dict:
    """One cell's comparison (before Holm): the coupling and two-sample bounds, each at 1 − (1 − confidence)/2."""
    half = 1.0 - (1.0 - confidence) / 2
    row = {"cell": cell.name, "settings": cell.label(), "m": len(a), "m reference": len(b)}
    coupling = np.nan
    if cell.seeded:
        joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner")
        mismatches = int(sum(x != y for x, y in zip(joined["a"], joined["b"])))
        coupling = stats.coupling_tv_upper(mismatches, len(joined), half)
        row.update({"pairs": len(joined), "mismatches": mismatches})
        a = a[a.index.get_level_values(0) % 2 == 0]  # independent halves: distinct seeds
        b = b[b.index.get_level_values(0) % 2 == 1]
    if len(a) and len(b):
        index = {k: i for i, k in enumerate(dict.fromkeys(list(a) + list(b)))}
        x, y = (np.bincount([index[k] for k in s], minlength=len(index)) for s in (a, b))
        test = stats.closeness_two_sample(x, y, n_resamples=n_resamples, rng=rng)
        two = float(stats.two_sample_tv_upper(x, y, half))
        row.update({"closeness p": test.pvalue, "TV plug-in": 0.5 * float(np.abs(x / x.sum() - y / y.sum()).sum()),
                    "two-sample TV upper": two})
    else:
        two = np.nan
        row["closeness p"] = np.nan
    bounds = {COUPLING: coupling, TWO_SAMPLE: two}
    finite = {k: v for k, v in bounds.items() if v == v}
    route = min(finite, key=finite.get) if finite else ""
    row.update({"coupling TV upper": coupling, "TV upper": finite.get(route, np.nan), "route": route})
    return row


def two_sample_results(workload: Workload, frames: dict, reference: dict, settings: SuiteSettings, eos: int | None,
                       rng: np.random.Generator, look: int = 1, cells: list[Cell] | None = None) -> pd.DataFrame:
    """Per cell of ``cells`` (default: all): TV(server, reference) certified by coupling or two-sample bounds,
    simultaneous over the workload's cells at ``settings.confidence`` spent for look ``look``
    (:func:`specdec_lab.workload.sequential.spent`); Holm across the judged cells on the closeness tests at the spent
    α; the verdict (:mod:`specdec_lab.verdicts`)."""
    confidence = 1.0 - spent(1.0 - settings.confidence, look) / max(1, len(workload.cells))
    settings = replace(settings, alpha=spent(settings.alpha, look))
    rows = []
    for cell in cells if cells is not None else workload.cells:
        request_tokens = cell.request_tokens(workload.max_tokens)
        a = outcome_keys(cell, frames[cell.name], request_tokens, eos)
        b = outcome_keys(cell, reference[cell.name], request_tokens, eos)
        rows.append(compare_cell(cell, a, b, confidence, settings.n_resamples, rng))
    table = pd.DataFrame(rows)
    judged = table["closeness p"].notna()
    table["Holm p"] = np.nan
    if judged.any():
        table.loc[judged, "Holm p"] = stats.holm(table.loc[judged, "closeness p"].tolist(), settings.alpha).adjusted
    table["look"] = look
    table["verdict"] = [verdicts.engine_row(refused=None, m=int(min(r["m"], r["m reference"])), holm_p=r["Holm p"],
                                            tv_upper=r["TV upper"], alpha=settings.alpha,
                                            tolerance=settings.tolerance)
                        for _, r in table.iterrows()]
    table.attrs["confidence"] = confidence
    return table


def verdict_rows(table: pd.DataFrame, tolerance: float) -> list[verdicts.Verdict]:
    """The two-sample table's rows as verdicts (TV(server, reference) is the row's ``tv_upper``)."""
    skip = ("cell", "m", "TV upper", "Holm p", "verdict")
    return [verdicts.Verdict(r["cell"], r["verdict"], int(r["m"]), float(r["TV upper"]), float(r["Holm p"]),
                             tolerance, details={k: r[k] for k in table.columns if k not in skip})
            for _, r in table.iterrows()]
