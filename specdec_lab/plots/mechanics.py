"""Figures of the algorithm itself, for the notebooks that explain it: one verification step, the block
argument, the negative controls' anatomy, same-seed agreement, exact TV by enumeration, Medusa's trees.

Laws are arrays (V,) over one vocabulary (p the target, q the draft); ``top`` keeps the most likely tokens under
p. Each function returns a closed figure (:mod:`specdec_lab.plots.common`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from specdec_lab.plots.common import VERDICT_COLORS, finish, finish_grid, new_axes, new_grid, token_axis, wrap


def step_decomposition(p: np.ndarray, q: np.ndarray, kept: np.ndarray, replaced: np.ndarray,
                       top: int = 20, tokens=None) -> Figure:
    """One verification step on a real distribution: accepted-draft mass min(p, q) stacked under
    the residual mass ρ·norm((p − q)+); together they rebuild p (black ticks); q shown as dots."""
    order = np.argsort(p)[::-1][:top]
    x = np.arange(len(order))
    colors = sns.color_palette()
    fig, ax = new_axes((10, 4.6))
    ax.bar(x, kept[order], color=colors[0], label="kept draft: min(p, q)")
    ax.bar(x, replaced[order], bottom=kept[order], color=colors[1], label="residual: ρ · norm((p − q)+)")
    ax.scatter(x, p[order], marker="_", s=300, color="black", label="target p", zorder=3)
    ax.scatter(x, q[order], marker="o", color=colors[2], label="draft q", zorder=3)
    token_axis(ax, order, tokens)
    return finish(fig, ax, "Modified rejection sampling, one step: the two parts add up to p",
                  ylabel="probability")


def three_token_step(p: np.ndarray, q: np.ndarray, kept: np.ndarray, replaced: np.ndarray, tokens,
                     rule: str = "leviathan", sampled: np.ndarray | None = None) -> Figure:
    """One verification step on a tiny vocabulary, as a picture of the proof.

    Left: p and q side by side, the overlap min(p, q) shaded: that much of each token's mass is emitted as
    an accepted draft; the part of p above q, (p − q)+, is missing and is what the residual must supply.
    Right: what ``rule`` emits, kept part (the accepted draft) stacked under the replaced part ρ·r(x), against p
    (black ticks); TV(out, p) in the title; ``sampled`` frequencies as white dots when given.
    """
    colors = sns.color_palette()
    x = np.arange(len(p))
    fig, axes = new_grid(1, 2, (10.5, 3.9), sharey=True)
    left, right = axes[0]
    left.bar(x - 0.2, p, width=0.4, color="white", edgecolor="black", linewidth=1.5, label="target p")
    left.bar(x + 0.2, q, width=0.4, color="white", edgecolor=colors[2], linewidth=1.5, label="draft q")
    overlap = np.minimum(p, q)
    left.bar(x - 0.2, overlap, width=0.4, color=colors[0], alpha=0.8, label="min(p, q): kept")
    left.bar(x - 0.2, np.maximum(p - q, 0), bottom=overlap, width=0.4, color=colors[1], alpha=0.8,
             label="(p − q)+: the residual's job")
    left.set_xticks(x, tokens)
    left.set_ylabel("probability")
    left.set_title("p against q: the overlap is kept", fontsize=11)
    left.legend(fontsize=9, loc="upper right")
    out = kept + replaced
    right.bar(x, kept, width=0.5, color=colors[0], label="kept draft")
    right.bar(x, replaced, bottom=kept, width=0.5, color=colors[1], label="replaced: ρ · r(x)")
    right.scatter(x, p, marker="_", s=900, linewidths=2.5, color="black", label="target p", zorder=3)
    if sampled is not None:
        right.scatter(x, sampled, marker="o", s=40, color="white", edgecolor="black", zorder=4,
                      label="sampled frequency")
    right.set_xticks(x, tokens)
    tv = 0.5 * float(np.abs(out - p).sum())
    right.set_title(wrap(f"what {rule} emits: TV(out, p) = {tv:.3f}", 5, 11), fontsize=11,
                    color="black" if tv < 1e-9 else VERDICT_COLORS["rejected"])
    right.legend(fontsize=9, loc="upper right")
    left.set_ylim(0, max(1.0, float(out.max()) * 1.15))
    fig.tight_layout()
    return fig


# An exact TV below EXACT_LEVEL is float64 rounding of 0 (notebook 02 asserts the lossless rules sit below it)
EXACT_LEVEL = 1e-12
ROUTE_DODGE = 0.8  # block_routes: the routes' markers spread over this share of a token's width


def block_routes(routes: dict[str, np.ndarray], p_next: np.ndarray, tv: pd.DataFrame, top: int = 15,
                 tokens=None, given: str = "") -> Figure:
    """The block argument in one figure. Left: the law of token 2 given token 1 by each route through the
    block (``routes``: name → law (V,)), against p(· | token 1) (``p_next``, (V,)), over the ``top`` most likely
    tokens; the routes sit side by side at each token (dodged by :data:`ROUTE_DODGE` of a token's width), so
    routes that agree exactly (the correct ones all equal p(· | token 1)) do not hide one another. Right: the exact
    TV over the first two tokens (``tv``: columns ``rule`` and ``exact TV``; :func:`_exact_tv_bars`: the correct
    rules noted as exact, the wrong ones far from 0)."""
    order = np.argsort(p_next)[::-1][:top]
    x = np.arange(len(order))
    fig, axes = new_grid(1, 2, (12, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    left, right = axes[0]
    left.plot(x, p_next[order], color="black", linewidth=6, alpha=0.25, label="p(· | token 1)", zorder=1)
    markers = "os^Dvx*P"
    offsets = ROUTE_DODGE * (np.arange(len(routes)) - (len(routes) - 1) / 2) / max(1, len(routes) - 1)
    for i, (name, law) in enumerate(routes.items()):
        left.plot(x + offsets[i], np.asarray(law)[order], marker=markers[i % len(markers)], linestyle="none",
                  markersize=5, color=sns.color_palette()[i % 10], label=name, zorder=2, alpha=0.9)
    token_axis(left, order, tokens, xlabel=f"token 2, most likely under p first{given}")
    left.set_ylabel("probability")
    left.set_title("Token 2 given token 1, by route through the block (side by side at each token)", fontsize=11)
    left.legend(fontsize=8.5)
    values = tv["exact TV"].to_numpy(dtype=float)
    colors = [VERDICT_COLORS["equivalent"] if v < 1e-9 else VERDICT_COLORS["rejected"] for v in values]
    _exact_tv_bars(right, [wrap(r, 3.2, 9) for r in tv["rule"]], values, colors, fontsize=9)
    right.set_xlabel("exact TV from p, first two tokens")
    right.set_title("Enumerated on the bundled pair", fontsize=11)
    fig.tight_layout()
    return fig


def bug_anatomy(parts: list[dict], top: int = 12, tokens=None, cols: int = 4) -> Figure:
    """One panel per negative control: the first step it emits, split into the accepted-draft part and the
    replacement part, against the true target law p (black ticks) over p's ``top`` tokens; its exact TV in
    the title. ``parts``: dicts with ``name``, ``p``, ``kept``, ``replaced``, ``tv`` and ``label`` (what the two
    parts are called, e.g. for the bonus fault) from
    :func:`specdec_lab.experiments.negative_controls.bug_anatomy`."""
    rows = -(-len(parts) // cols)
    # own y range each: no panel flattened; 85 dpi keeps a dozen panels' PNG small in a committed notebook
    fig, axes = new_grid(rows, cols, (3.4 * cols, 2.7 * rows + 0.9), dpi=85)
    colors = sns.color_palette()
    for ax, part in zip(axes.flat, parts):
        order = np.argsort(part["p"])[::-1][:top]
        x = np.arange(len(order))
        kept_label, replaced_label = part.get("labels", ("kept draft", "replaced"))
        ax.bar(x, part["kept"][order], color=colors[0], label=kept_label)
        if part["replaced"].any():
            ax.bar(x, part["replaced"][order], bottom=part["kept"][order], color=colors[1], label=replaced_label)
        ax.scatter(x, part["p"][order], marker="_", s=180, linewidths=2, color="black", label="target p", zorder=3)
        if tokens is not None:
            ax.set_xticks(x, [tokens[i] for i in order], rotation=90, fontsize=8)
        else:
            ax.set_xticks([])
        ax.set_title(wrap(f"{part['name']}: exact TV {part['tv']:.3f}", 3.3, 9), fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    return finish_grid(fig, axes, len(parts), "probability",
                       wrap("Anatomy of each negative control: where its one step puts the mass (bars) against "
                            "where p puts it (ticks)", 3.4 * cols, 12), 12)


def agreement_by_position(agreement: np.ndarray, independent_first: float) -> Figure:
    """How often same-seed naive and speculative chains emit the same token at each position (``agreement``,
    (L,), fractions in [0, 1], position 1 first), with the chance that two *independent* draws from p agree on the
    first token (``independent_first`` = Σ p(x)²) as a reference mark at position 1 only: it is the first token's
    law, and later positions have no such single reference (their laws depend on the differing prefixes)."""
    agreement = np.asarray(agreement, dtype=float)
    x = np.arange(1, len(agreement) + 1)
    fig, ax = new_axes((7.5, 3.6))
    ax.plot(x, agreement, marker="o", label="same seed: naive and speculative emit the same token")
    ax.plot([1 - 0.3, 1 + 0.3], [independent_first] * 2, color="black", linestyle="--", linewidth=1.5,
            label=f"two independent draws from p, position 1 only: Σ p² = {independent_first:.3f}")
    ax.set_xticks(x)
    ax.set_ylim(0, 1)
    return finish(fig, ax, "Same seed, different samples: agreement by position", xlabel="position",
                  ylabel="fraction of chains", legend=dict(fontsize=9))


def exact_tv(table: pd.DataFrame) -> Figure:
    """Exact TV between each rule's law and p, one bar per row (:func:`_exact_tv_bars`: a linear axis over TV's
    range, each bar's value written; lossless rules, at rounding level, noted as exact instead of a bar).

    ``table`` needs the columns ``rule``, ``exact TV`` and ``lossless`` (bool).
    """
    frame = table.reset_index(drop=True)
    kinds = {"lossless rule": sns.color_palette()[0], "negative control": sns.color_palette()[1]}
    colors = [kinds["lossless rule" if lossless else "negative control"] for lossless in frame["lossless"]]
    fig, ax = new_axes((9, 0.4 * len(frame) + 1.8))
    _exact_tv_bars(ax, list(frame["rule"]), frame["exact TV"].to_numpy(dtype=float), colors)
    handles = [Patch(color=color, label=kind) for kind, color in kinds.items()]
    return finish(fig, ax, wrap("The theorem by enumeration: ≈ 1e-16 (rounding) for lossless rules, far from 0 for "
                                "the bugs", 6),
                  xlabel="exact TV(rule's law, p) over the first two tokens", ylabel="",
                  legend=dict(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False))


def _exact_tv_bars(ax, labels: list[str], values: np.ndarray, colors, fontsize: float = 10) -> None:
    """Horizontal bars of exact TVs ``values`` (n,), one per label, top to bottom, on a linear axis from 0 over
    TV's range [0, 1], each bar's value written at its end. A TV below :data:`EXACT_LEVEL` is float64 rounding
    of 0: its bar has width 0 and the note "exact (≈ 2e-16, rounding)" stands in its place (a log axis would
    draw such a value as a bar from an arbitrary floor such as 1e-17). Axes patches: one bar per label, in order."""
    y = np.arange(len(values))
    exact = values < EXACT_LEVEL
    ax.barh(y, np.where(exact, 0.0, values), color=colors)
    for i, value in enumerate(values):
        note = ("exact (0)" if value == 0 else f"exact (≈ {value:.0e}, rounding)") if exact[i] else f"{value:.3g}"
        ax.annotate(note, (0.0 if exact[i] else value, i), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=fontsize, color="dimgrey" if exact[i] else "black")
    ax.set_yticks(y, labels, fontsize=fontsize)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)  # room for the value written after a bar near 1
    ax.set_xticks(np.linspace(0, 1, 6))


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
    fig, ax = new_axes((max(7, 1.1 * next_leaf[0] + 2), 1.1 * max(depth) + 2.0))
    for node in range(1, n):
        ax.plot([x[parents[node]], x[node]], [-depth[parents[node]], -depth[node]], color="grey", zorder=1)
    colors = sns.color_palette()
    ax.scatter(x, [-d for d in depth], s=1400, color=[colors[1]] + [colors[0]] * (n - 1), zorder=2)
    for node in range(n):
        text = "root" if node == 0 else (labels[node] if labels is not None else f"r{ranks[node]}")
        ax.annotate(text, (x[node], -depth[node]), ha="center", va="center", fontsize=13 if node else 10, color="white",
                    fontweight="bold", zorder=3)
        if node > 0:
            ax.annotate(f"r{ranks[node]}", (x[node], -depth[node]), textcoords="offset points", xytext=(0, 22),
                        ha="center", fontsize=9, color="dimgrey", zorder=3)
    ax.set_yticks([-d for d in range(max(depth) + 1)], [f"depth {d}" for d in range(max(depth) + 1)])
    ax.set_xticks([])
    ax.set_title(title or f"candidate tree: {n - 1} nodes, depth {max(depth)} (r = candidate rank)")
    ax.margins(0.12, 0.18)
    fig.tight_layout()
    return fig


def typical_heatmap(grid: pd.DataFrame) -> Figure:
    """Exact TV of Medusa typical acceptance against p over ε (rows) and α (columns), one panel per
    temperature. ``grid`` from :func:`specdec_lab.experiments.medusa_trees.typical_tv_grid`."""
    temperatures = sorted(grid["temperature"].unique())
    fig, axes = new_grid(1, len(temperatures), (4.7 * len(temperatures), 4.4))
    for ax, temperature in zip(axes.flat, temperatures):
        table = grid[grid["temperature"] == temperature].pivot(index="epsilon", columns="alpha", values="tv")
        sns.heatmap(table, annot=True, fmt=".2f", cmap="rocket_r", vmin=0, vmax=float(grid["tv"].max()), ax=ax)
        ax.set_title(f"T = {temperature:g}: TV(typical, p), first token")
        ax.set_xlabel("α (entropy-scaled threshold)")
        ax.set_ylabel("ε (hard threshold)")
    fig.suptitle(wrap("Medusa typical acceptance is lossy: exact TV from the target law (0 = lossless)",
                      4.7 * len(temperatures)))
    fig.tight_layout()
    return fig
