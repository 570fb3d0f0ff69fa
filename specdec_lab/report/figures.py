"""The report's seaborn figures, written to files (:mod:`specdec_lab.plots` draws them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specdec_lab import plots


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
