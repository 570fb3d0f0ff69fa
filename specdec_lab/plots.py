"""Seaborn figures shared by the report (saved as PNG) and the notebooks (shown inline).

Every function returns a :class:`matplotlib.figure.Figure` and leaves the backend alone: in
Jupyter the inline backend shows it, on a headless machine matplotlib picks Agg by itself, and
:func:`save` writes it to a file. Functions take plain arrays and data frames, never models.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure


def save(fig: Figure, path: Path | str, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` and close it (so long runs do not accumulate open figures)."""
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def _new(figsize) -> tuple[Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def tv_bounds(summary: pd.DataFrame, tolerance: float) -> Figure:
    """Bars of the upper confidence bound on TV per sampler, with the tolerance ε as a line.

    ``summary`` needs the columns ``sampler``, ``TV upper 99%`` and ``expected``
    (:func:`specdec_lab.report.summary_table`).
    """
    fig, ax = _new((8, 0.45 * len(summary) + 1.5))
    sns.barplot(data=summary, y="sampler", x="TV upper 99%", hue="expected", dodge=False, ax=ax)
    ax.axvline(tolerance, color="black", linestyle="--", label=f"ε = {tolerance:g}")
    ax.set_xscale("log")
    ax.set_title("Upper 99% confidence bound on TV(sampler, target), first token")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def first_token(laws: dict[str, np.ndarray], exact: np.ndarray, top: int = 25) -> Figure:
    """Empirical first-token frequencies of several samplers next to the exact target law."""
    order = np.argsort(exact)[::-1][:top]
    rows = [{"token rank": r, "probability": exact[i], "source": "exact target p"} for r, i in enumerate(order)]
    for name, freq in laws.items():
        rows += [{"token rank": r, "probability": freq[i], "source": name} for r, i in enumerate(order)]
    fig, ax = _new((10, 4))
    sns.lineplot(data=pd.DataFrame(rows), x="token rank", y="probability", hue="source", marker="o", ax=ax)
    ax.set_title(f"First-token law: {top} most likely target tokens")
    fig.tight_layout()
    return fig


def observed_vs_expected(counts: np.ndarray, p: np.ndarray, top: int = 30) -> Figure:
    """Observed counts against expected counts m·p for the ``top`` most likely tokens, with a
    ±2 standard deviation band (binomial), so a reader sees which bars are within noise."""
    counts = np.asarray(counts, dtype=np.float64)
    m = counts.sum()
    order = np.argsort(p)[::-1][:top]
    expected = m * p[order]
    sd = np.sqrt(m * p[order] * (1 - p[order]))
    fig, ax = _new((10, 4))
    x = np.arange(len(order))
    ax.bar(x, counts[order], color=sns.color_palette()[0], label="observed")
    ax.errorbar(x, expected, yerr=2 * sd, fmt="o", color="black", capsize=3, label="expected m·p ± 2 sd")
    ax.set_xlabel("token rank under p")
    ax.set_ylabel("count")
    ax.set_title(f"First token: observed vs expected (m = {int(m):,})")
    ax.legend()
    fig.tight_layout()
    return fig


def pit(pits: dict[str, np.ndarray], bins: int = 20) -> Figure:
    """Randomized PIT histograms: flat for a lossless sampler."""
    cols = min(4, len(pits))
    rows = -(-len(pits) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False, sharey=True)
    for ax, (name, u) in zip(axes.flat, pits.items()):
        sns.histplot(x=np.asarray(u).ravel(), bins=bins, stat="density", ax=ax)
        ax.axhline(1.0, color="black", linestyle="--")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("u")
    for ax in list(axes.flat)[len(pits):]:
        ax.set_visible(False)
    fig.suptitle("Randomized PIT of every sampled token under the exact target law (flat = lossless)")
    fig.tight_layout()
    return fig


def step_decomposition(p: np.ndarray, q: np.ndarray, kept: np.ndarray, replaced: np.ndarray,
                       top: int = 20) -> Figure:
    """One verification step on a real distribution: accepted-draft mass min(p, q) stacked under
    the residual mass ρ·norm((p − q)+); together they rebuild p (black ticks); q shown as dots."""
    order = np.argsort(p)[::-1][:top]
    x = np.arange(len(order))
    colors = sns.color_palette()
    fig, ax = _new((10, 4))
    ax.bar(x, kept[order], color=colors[0], label="kept draft: min(p, q)")
    ax.bar(x, replaced[order], bottom=kept[order], color=colors[1], label="residual: ρ · norm((p − q)+)")
    ax.scatter(x, p[order], marker="_", s=300, color="black", label="target p", zorder=3)
    ax.scatter(x, q[order], marker="o", color=colors[2], label="draft q", zorder=3)
    ax.set_xlabel("token rank under p")
    ax.set_ylabel("probability")
    ax.set_title("Modified rejection sampling, one step: the two parts add up to p")
    ax.legend()
    fig.tight_layout()
    return fig


def exact_tv(table: pd.DataFrame) -> Figure:
    """Exact TV between each rule's law and p (log scale); lossless rules sit at rounding level.

    ``table`` needs the columns ``rule``, ``exact TV`` and ``lossless``.
    """
    frame = table.assign(kind=np.where(table["lossless"], "lossless rule", "negative control"),
                         shown=np.maximum(table["exact TV"].to_numpy(dtype=float), 1e-18))
    fig, ax = _new((8, 0.4 * len(frame) + 1.5))
    sns.barplot(data=frame, y="rule", x="shown", hue="kind", dodge=False, ax=ax)
    ax.set_xscale("log")
    ax.set_xlabel("exact TV(rule's law, p) over the first two tokens")
    ax.set_title("The theorem by enumeration: ~1e-16 for lossless rules, far from 0 for the bugs")
    fig.tight_layout()
    return fig


def tv_bound_path(frame: pd.DataFrame, tolerance: float) -> Figure:
    """TV plug-in and the upper confidence bound as the sample grows, with ε as a line.

    ``frame`` needs the columns ``m``, ``TV plug-in`` and ``TV upper``.
    """
    long = frame.melt(id_vars="m", value_vars=["TV plug-in", "TV upper"], var_name="estimate",
                      value_name="TV")
    fig, ax = _new((7, 4))
    sns.lineplot(data=long, x="m", y="TV", hue="estimate", marker="o", ax=ax)
    ax.axhline(tolerance, color="black", linestyle="--", label=f"ε = {tolerance:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("How the TV bound shrinks with the sample size m")
    ax.legend()
    fig.tight_layout()
    return fig


def power_curves(frame: pd.DataFrame) -> Figure:
    """Simulated rejection rate vs sample size, against the predicted power curves.

    ``frame`` needs the columns ``alternative``, ``m``, ``simulated``, ``se``, ``noncentral χ²`` and
    ``planner (worst case)`` (:func:`specdec_lab.notebook.power_curve`).
    """
    names = list(dict.fromkeys(frame["alternative"]))
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names):
        part = frame[frame["alternative"] == name]
        ax.errorbar(part["m"], part["simulated"], yerr=2 * part["se"], fmt="o", color="black",
                    capsize=3, label="simulated ± 2 se")
        ax.plot(part["m"], part["noncentral χ²"], label="noncentral χ² at this q")
        ax.plot(part["m"], part["planner (worst case)"], linestyle="--", label="planner, worst case at this TV")
        ax.set_xscale("log")
        ax.set_xlabel("samples m")
        ax.set_title(name, fontsize=9)
    axes.flat[0].set_ylabel("power (rejection rate)")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Power of the Pearson identity test: simulation vs prediction")
    fig.tight_layout()
    return fig


def pvalue_histograms(pvalues: dict[str, np.ndarray], bins: int = 10) -> Figure:
    """Histograms of replicate p-values: flat for a correct sampler, piled at 0 for a faulty one."""
    fig, axes = plt.subplots(1, len(pvalues), figsize=(4 * len(pvalues), 3), squeeze=False)
    for ax, (name, pv) in zip(axes.flat, pvalues.items()):
        sns.histplot(x=np.asarray(pv), bins=bins, binrange=(0, 1), stat="density", ax=ax)
        ax.axhline(1.0, color="black", linestyle="--")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("p-value")
    fig.suptitle("p-values over independent replicates")
    fig.tight_layout()
    return fig


def roofline(hardware: dict[str, tuple[float, float]], points: pd.DataFrame) -> Figure:
    """The roofline: attainable FLOP/s = min(peak, intensity × bandwidth) per accelerator (log-log),
    with decoding steps at several batch sizes as points.

    ``hardware`` maps a name to (bandwidth bytes/s, peak FLOP/s); ``points`` needs the columns
    ``hardware``, ``batch``, ``FLOP per byte`` and ``FLOP/s attained`` (:func:`specdec_lab.notebook.batch_sweep`).
    """
    fig, ax = _new((8, 5))
    intensity = np.logspace(-1, 4, 200)
    palette = dict(zip(hardware, sns.color_palette(n_colors=len(hardware))))
    for name, (bandwidth, peak) in hardware.items():
        ax.plot(intensity, np.minimum(peak, intensity * bandwidth), color=palette[name], label=name)
    for name, part in points.groupby("hardware", sort=False):
        ax.scatter(part["FLOP per byte"], part["FLOP/s attained"], color=palette.get(name, "black"), zorder=3)
        for _, row in part.iterrows():
            ax.annotate(f"B={int(row['batch'])}", (row["FLOP per byte"], row["FLOP/s attained"]), fontsize=7,
                        textcoords="offset points", xytext=(4, -8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title("Roofline: decoding at batch B sits on the bandwidth slope until B is large")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def batch_sweep(frame: pd.DataFrame) -> Figure:
    """Roofline tokens/s against batch size per accelerator (log-log); marker = what binds.

    ``frame`` from :func:`specdec_lab.notebook.batch_sweep`.
    """
    fig, ax = _new((8, 4.5))
    sns.lineplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", ax=ax)
    sns.scatterplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", style="bound", ax=ax, legend="brief")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("Tokens/s bound against batch size: linear while memory-bound, flat once compute-bound")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[len(handles) // 2:], labels[len(labels) // 2:], fontsize=7)
    fig.tight_layout()
    return fig


def tree(parents, ranks, labels=None, title: str = "") -> Figure:
    """A candidate tree drawn top-down: node 0 the root, each edge labelled by the child's rank.

    ``parents`` and ``ranks`` as :class:`specdec_lab.samplers.tree.Tree` gives them (root first,
    parents before children); ``labels`` optional text per node (e.g. its candidate token).
    """
    n = len(parents)
    children = [[] for _ in range(n)]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    depth = [0] * n
    for node in range(1, n):
        depth[node] = depth[parents[node]] + 1
    x = [0.0] * n
    next_leaf = [0]

    def place(node):  # leaves left to right, a parent centred over its children
        if not children[node]:
            x[node] = next_leaf[0]
            next_leaf[0] += 1
        else:
            for child in children[node]:
                place(child)
            x[node] = float(np.mean([x[c] for c in children[node]]))

    place(0)
    fig, ax = _new((max(6, 0.7 * next_leaf[0] + 2), 0.9 * max(depth) + 1.8))
    for node in range(1, n):
        ax.plot([x[parents[node]], x[node]], [-depth[parents[node]], -depth[node]], color="grey", zorder=1)
    colors = sns.color_palette()
    ax.scatter(x, [-d for d in depth], s=500, color=[colors[1]] + [colors[0]] * (n - 1), zorder=2)
    for node in range(n):
        text = "root" if node == 0 else (labels[node] if labels is not None else f"r{ranks[node]}")
        ax.annotate(text, (x[node], -depth[node]), ha="center", va="center", fontsize=7, color="white", zorder=3)
    ax.set_yticks([-d for d in range(max(depth) + 1)], [f"depth {d}" for d in range(max(depth) + 1)])
    ax.set_xticks([])
    ax.set_title(title or f"candidate tree: {n - 1} nodes, depth {max(depth)} (r = candidate rank)", fontsize=10)
    ax.margins(0.15)
    fig.tight_layout()
    return fig


def typical_heatmap(grid: pd.DataFrame) -> Figure:
    """Exact TV of Medusa typical acceptance against p over ε (rows) and α (columns), one panel per
    temperature. ``grid`` from :func:`specdec_lab.notebook.typical_tv_grid`."""
    temperatures = sorted(grid["temperature"].unique())
    fig, axes = plt.subplots(1, len(temperatures), figsize=(5 * len(temperatures), 4), squeeze=False)
    for ax, temperature in zip(axes.flat, temperatures):
        table = grid[grid["temperature"] == temperature].pivot(index="epsilon", columns="alpha", values="tv")
        sns.heatmap(table, annot=True, fmt=".2f", cmap="rocket_r", vmin=0, vmax=float(grid["tv"].max()), ax=ax)
        ax.set_title(f"T = {temperature:g}: TV(typical, p), first token")
        ax.set_xlabel("α (entropy-scaled threshold)")
        ax.set_ylabel("ε (hard threshold)")
    fig.suptitle("Medusa typical acceptance is lossy: exact TV from the target law (0 = lossless)")
    fig.tight_layout()
    return fig


def detection_power(power: pd.DataFrame, level: float = 0.9) -> Figure:
    """Power of the whole suite against each planted fault family, over the fault's exact TV on
    the first two tokens (from :func:`specdec_lab.notebook.detection_power`), with the 0.9 line."""
    fig, ax = _new((8, 4))
    sns.lineplot(data=power, x="exact TV (2 tokens)", y="power", hue="family", marker="o", ax=ax)
    ax.axhline(level, color="black", linestyle="--", linewidth=1, label=f"power {level:g}")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    m = int(power["m"].iloc[0])
    ax.set_title(f"What the suite can see at m = {m:,}: power against planted faults")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
