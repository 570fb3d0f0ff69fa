"""Helpers every figure of :mod:`specdec_lab.plots` shares: making, finishing and saving a figure, log ticks,
token labels, the verdict colours.

Contract of every figure function in the package: it takes plain arrays and data frames (never models) and
returns a :class:`matplotlib.figure.Figure` already closed in pyplot, so a notebook cell that ends with the
call shows it exactly once (an open pyplot figure is shown twice in Jupyter: once by the inline backend at
the end of the cell, once as the cell's value), and :func:`save` writes it to a file on any machine. Token
axes take the vocabulary's strings (:func:`token_label` makes whitespace visible). Sizes are in inches,
font sizes in points.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def save(fig: Figure, path: Path | str, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` and close it (so long runs do not accumulate open figures)."""
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def new_axes(figsize) -> tuple[Figure, plt.Axes]:
    fig, axes = new_grid(1, 1, figsize)
    return fig, axes[0, 0]


def new_grid(rows: int, cols: int, figsize, **kwargs) -> tuple[Figure, np.ndarray]:
    """A figure made by pyplot (so Jupyter's inline backend knows how to show it) and closed at once
    (so the backend does not show it a second time at the end of the cell)."""
    fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False, **kwargs)
    plt.close(fig)
    return fig, axes


def finish(fig: Figure, ax, title: str, *, xlabel: str | None = None, ylabel: str | None = None,
           legend: dict | None = None) -> Figure:
    """The last steps of a one-axes figure: axis labels (where given), title, legend (``legend``: its
    options), a tight layout."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(**(legend or {}))
    fig.tight_layout()
    return fig


def finish_grid(fig: Figure, axes, used: int, ylabel: str, title: str, fontsize: int) -> Figure:
    """Hide the grid's unused panels, label the first column, title the figure."""
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    return fig


def wrap(text: str, width: float, fontsize: float = 12) -> str:
    """``text`` broken into lines that fit ``width`` inches at ``fontsize`` points (so no title is cut)."""
    return textwrap.fill(text, max(20, int(width * 72 / (0.55 * fontsize))), break_on_hyphens=False)


def plain_ticks(ax) -> None:
    """Log axes labelled 0.02, 0.05, 1,000 rather than 2×10⁻², 5×10⁻², 10³: every power of ten, and
    the minor ticks at 2× and 5× (enough to read values off, few enough not to collide)."""
    from matplotlib.ticker import FuncFormatter

    def plain(v):
        return f"{v:,.0f}" if v >= 1 else f"{v:g}"

    def two_or_five(v, _):
        return plain(v) if round(v / 10 ** np.floor(np.log10(v) + 1e-9)) in (2, 5) else ""

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(FuncFormatter(lambda v, _: plain(v)))
            axis.set_minor_formatter(FuncFormatter(two_or_five))


def token_label(text: str) -> str:
    """A token's text as an axis label: spaces as ␣, newlines as ↵, tabs as ⇥, nothing as ∅.

    >>> token_label(" the"), token_label("\\n"), token_label("")
    ('␣the', '↵', '∅')
    """
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def token_strings(pair) -> list[str]:
    """Every token of the pair's vocabulary as an axis label (:func:`token_label`)."""
    return [token_label(pair.decode([i])) for i in range(pair.vocab_size)]


def token_axis(ax, order: np.ndarray, tokens, xlabel: str = "token, most likely under p first") -> None:
    """Tick labels of a token axis: the tokens' strings when given, else their rank under p."""
    x = np.arange(len(order))
    if tokens is None:
        ax.set_xticks(x[::max(1, len(x) // 10)])
        ax.set_xlabel("token rank under p")
        return
    ax.set_xticks(x, [tokens[i] for i in order], rotation=90, fontsize=10)
    ax.set_xlabel(xlabel)


VERDICT_COLORS = {"equivalent": "#1a7f37", "rejected": "#c62828", "inconclusive": "#9e9e9e"}  # green, red, grey
