"""Figures of speed: the roofline, the tokens/s bound over batch size, the expected speedup over K.

Units are in the column names the callers pass (bytes/s, FLOP/s, tokens/s). Each function returns a closed
figure (:mod:`specdec_lab.plots.common`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from specdec_lab.plots.common import finish, new_axes, plain_ticks, wrap


def roofline(hardware: dict[str, tuple[float, float]], points: pd.DataFrame) -> Figure:
    """The roofline: attainable FLOP/s = min(peak, intensity × bandwidth) per accelerator (log-log),
    with decoding steps at several batch sizes as points.

    ``hardware`` maps a name to (bandwidth bytes/s, peak FLOP/s); ``points`` needs the columns
    ``hardware``, ``batch``, ``FLOP per byte`` and ``FLOP/s attained`` (:func:`specdec_lab.experiments.memory_wall.batch_sweep`).
    """
    fig, ax = new_axes((9, 5.5))
    intensity = np.logspace(-1, 4, 200)
    palette = dict(zip(hardware, sns.color_palette(n_colors=len(hardware))))
    for name, (bandwidth, peak) in hardware.items():
        ax.plot(intensity, np.minimum(peak, intensity * bandwidth), color=palette[name], label=name)
    for name, part in points.groupby("hardware", sort=False):
        ax.scatter(part["FLOP per byte"], part["FLOP/s attained"], color=palette.get(name, "black"), zorder=3)
    for batch, part in points.groupby("batch"):  # one label per batch, above its highest point
        top = part.loc[part["FLOP/s attained"].idxmax()]
        ax.annotate(f"B = {int(batch)}", (top["FLOP per byte"], top["FLOP/s attained"]), fontsize=10,
                    textcoords="offset points", xytext=(0, 9), ha="center")
    ax.set_xscale("log")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 4)  # room for the batch labels above the flat roof
    return finish(fig, ax, wrap("Roofline: decoding at batch B sits on the bandwidth slope until B is large", 8.2),
                  xlabel="arithmetic intensity (FLOP per byte moved)", ylabel="attainable FLOP/s",
                  legend=dict(title="hardware"))


def batch_sweep(frame: pd.DataFrame) -> Figure:
    """Roofline tokens/s against batch size per accelerator (log-log); marker = what binds.

    ``frame`` from :func:`specdec_lab.experiments.memory_wall.batch_sweep`.
    """
    fig, ax = new_axes((9, 5))
    sns.lineplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", legend=False, ax=ax)
    sns.scatterplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", style="bound", s=60, ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_ticks(ax)
    batches = sorted(frame["batch"].unique())
    ax.set_xticks(batches, [f"{b:,}" for b in batches])
    ax.set_ylabel("tokens/s (upper bound)")
    ax.set_title(wrap("Tokens/s bound against batch size: linear while memory-bound, flat once compute-bound", 8.2))
    sns.move_legend(ax, "upper left")
    fig.tight_layout()
    return fig


def speedup(table: pd.DataFrame, k: int | None = None, title: str = "") -> Figure:
    """Speedup over K from :func:`specdec_lab.theory.speedup_table` (and a ``roofline speedup``
    column, if present), the best K marked, 1× (no speculation) as a line, and ``k`` (the K chosen)
    in red when given."""
    value_columns = [c for c in ("speedup", "roofline speedup") if c in table]
    long = table.melt(id_vars="K", value_vars=value_columns, var_name="model", value_name="speedup ×")
    fig, ax = new_axes((8, 4.5))
    sns.lineplot(data=long, x="K", y="speedup ×", hue="model", marker="o", ax=ax)
    best = table.loc[table["best"]].iloc[0]
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no speculation")
    ax.axvline(best["K"], color="grey", linestyle=":", linewidth=2, label=f"best K = {int(best['K'])}")
    if k is not None:
        ax.axvline(k, color="red", linewidth=1.5, label=f"your K = {k}")
    ax.set_xticks(table["K"])
    return finish(fig, ax, wrap(title or "Expected wall-clock speedup (1 − α^{K+1}) / ((1 − α)(Kc + 1))", 6.5),
                  legend=dict(loc="best"))
