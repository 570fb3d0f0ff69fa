"""Seaborn figures shared by the report (saved as PNG) and the notebooks (shown inline).

Every function returns a :class:`matplotlib.figure.Figure` already closed in pyplot: a notebook
cell that ends with the call shows it exactly once (an open pyplot figure is shown twice in
Jupyter: once by the inline backend at the end of the cell, once as the cell's value), and
:func:`save` writes it to a file on any machine. Functions take plain arrays and data frames, never models;
token axes take the vocabulary's strings (:func:`token_label` makes whitespace visible).
"""

from __future__ import annotations

from pathlib import Path

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch


def save(fig: Figure, path: Path | str, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` and close it (so long runs do not accumulate open figures)."""
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def _new(figsize) -> tuple[Figure, plt.Axes]:
    fig, axes = _grid(1, 1, figsize)
    return fig, axes[0, 0]


def _grid(rows: int, cols: int, figsize, **kwargs) -> tuple[Figure, np.ndarray]:
    """A figure made by pyplot (so Jupyter's inline backend knows how to show it) and closed at once
    (so the backend does not show it a second time at the end of the cell)."""
    fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False, **kwargs)
    plt.close(fig)
    return fig, axes


def _finish(fig: Figure, ax, title: str, *, xlabel: str | None = None, ylabel: str | None = None,
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


def _wrap(text: str, width: float, fontsize: float = 12) -> str:
    """``text`` broken into lines that fit ``width`` inches at ``fontsize`` points (so no title is cut)."""
    return textwrap.fill(text, max(20, int(width * 72 / (0.55 * fontsize))), break_on_hyphens=False)


def _plain_ticks(ax) -> None:
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


def _token_axis(ax, order: np.ndarray, tokens, xlabel: str = "token, most likely under p first") -> None:
    """Tick labels of a token axis: the tokens' strings when given, else their rank under p."""
    x = np.arange(len(order))
    if tokens is None:
        ax.set_xticks(x[::max(1, len(x) // 10)])
        ax.set_xlabel("token rank under p")
        return
    ax.set_xticks(x, [tokens[i] for i in order], rotation=90, fontsize=10)
    ax.set_xlabel(xlabel)


VERDICT_COLORS = {"equivalent": "#1a7f37", "rejected": "#c62828", "inconclusive": "#9e9e9e"}  # green, red, grey


def tv_bounds(summary: pd.DataFrame, tolerance: float) -> Figure:
    """Bars of the upper confidence bound on TV per sampler, coloured by the **verdict**, with ε as a line.

    A bar's colour is what the suite decided (equivalent, rejected, inconclusive), not what the row was
    expected to be: a negative control whose TV bound sits below ε but that another test rejected is red, with
    the note "rejected by the tests, not the bound" beside it. Expected negative controls are hatched.
    ``summary`` needs the columns ``sampler``, ``TV upper 99%``, ``expected`` and ``verdict``
    (:func:`specdec_lab.report.summary_table`; ``Holm p`` is quoted when present).
    """
    frame = summary.reset_index(drop=True)
    fig, ax = _new((10, 0.42 * len(frame) + 2.2))
    y = np.arange(len(frame))
    bounds = frame["TV upper 99%"].to_numpy(dtype=float)
    for i, row in frame.iterrows():
        control = row["expected"] != "lossless"
        ax.barh(i, bounds[i], color=VERDICT_COLORS.get(row["verdict"], "black"), hatch="//" if control else None,
                edgecolor="white" if control else None, linewidth=0)
        if row["verdict"] == "rejected" and bounds[i] <= tolerance:
            holm = f", Holm p = {row['Holm p']:.1e}" if "Holm p" in frame else ""
            ax.annotate(f"rejected by the tests, not the bound{holm}", (bounds[i], i), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=9, color=VERDICT_COLORS["rejected"])
    ax.set_yticks(y, frame["sampler"], fontsize=10)
    ax.invert_yaxis()
    ax.axvline(tolerance, color="black", linestyle="--")
    ax.set_xscale("log")
    _plain_ticks(ax)
    low = max(min(bounds.min(), tolerance) / 2, 1e-4)
    ax.set_xlim(low, max(1.0, bounds.max() * 1.5))
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items() if v in set(frame["verdict"])]
    handles += [Patch(facecolor="lightgrey", hatch="//", edgecolor="white", label="negative control (expected rejected)"),
                Line2D([], [], color="black", linestyle="--", label=f"tolerance ε = {tolerance:g}")]
    ax.set_xlabel("upper 99% confidence bound on TV(sampler, p), first token (log scale)")
    height = fig.get_figheight()
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False, fontsize=10)
    fig.suptitle(_wrap("Upper 99% bound on TV from the target, per sampler, coloured by the suite's verdict "
                       "(equivalent = no test rejects and the bound is below ε)", 10, 12), fontsize=12)
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))
    return fig


def first_token(laws: dict[str, np.ndarray], exact: np.ndarray, top: int = 25, tokens=None,
                samples: dict[str, int] | int | None = None) -> Figure:
    """Empirical first-token frequencies of several samplers next to the exact target law, over the
    ``top`` most likely tokens (labelled by ``tokens[i]``, the vocabulary's strings, when given).

    ``samples`` (one m for all, or m per sampler) adds the band a lossless sampler's frequency falls in
    about 95% of the time, p ± 2·sqrt(p(1 − p)/m), once per distinct m: a marker outside its band is a
    deviation, inside it is noise.
    """
    order = np.argsort(exact)[::-1][:top]
    x = np.arange(len(order))
    fig, ax = _new((10.5, 4.8))
    ax.plot(x, exact[order], color="black", linewidth=2, alpha=0.6, label="exact target p", zorder=1)
    if samples is not None:
        sizes = samples if isinstance(samples, dict) else {name: samples for name in laws}
        for j, m in enumerate(sorted(set(int(v) for v in sizes.values()))):
            sd = np.sqrt(exact[order] * (1 - exact[order]) / m)
            ax.fill_between(x, np.maximum(exact[order] - 2 * sd, 0), exact[order] + 2 * sd, color="grey", alpha=0.25 - 0.08 * j,
                            linewidth=0, label=f"p ± 2 sd at m = {m:,}", zorder=0)
    markers = "os^Dvx*P"
    for i, (name, freq) in enumerate(laws.items()):
        ax.plot(x, np.asarray(freq)[order], marker=markers[i % len(markers)], linestyle="none",
                color=sns.color_palette()[i % 10], label=name, zorder=2, alpha=0.85)
    _token_axis(ax, order, tokens)
    return _finish(fig, ax, _wrap(f"First token: sampled frequencies against the exact target law p ({len(order)} most "
                                  "likely tokens)", 9), ylabel="probability", legend=dict(fontsize=9))


def observed_vs_expected(counts: np.ndarray, p: np.ndarray, top: int = 30, tokens=None) -> Figure:
    """Observed counts against expected counts m·p for the ``top`` most likely tokens, with a
    ±2 standard deviation band (binomial), so a reader sees which bars are within noise."""
    counts = np.asarray(counts, dtype=np.float64)
    m = counts.sum()
    order = np.argsort(p)[::-1][:top]
    expected = m * p[order]
    sd = np.sqrt(m * p[order] * (1 - p[order]))
    fig, ax = _new((10, 4.6))
    x = np.arange(len(order))
    ax.bar(x, counts[order], color=sns.color_palette()[0], label="observed")
    ax.errorbar(x, expected, yerr=2 * sd, fmt="o", color="black", capsize=3, label="expected m·p ± 2 sd")
    _token_axis(ax, order, tokens)
    return _finish(fig, ax, f"First token: observed vs expected (m = {int(m):,})", ylabel="count")


def pit(pits: dict[str, np.ndarray], bins: int = 20, verdicts: dict[str, str] | None = None,
        ymax: float | None = None, selection: str | None = None) -> Figure:
    """Randomized PIT histograms of every sampled token under the exact target law, one panel per sampler.

    A lossless sampler's histogram is flat (density 1, dashed); a bent one shows a wrong law. The converse
    does **not** hold: a sampler can be wrong and still look flat (``residual_from_p`` at a few thousand samples,
    and overlapping random streams, whose every token has the right law, do), which is why the verdict rests on the whole battery, not this picture.
    Every panel shares one y range, 0..``ymax`` (default: the tallest bin, kept between 1.5 and 2.5), so no tall
    panel flattens the others; a bin above it is cut and its height written in the panel. ``verdicts`` (sampler → verdict) colours each panel's title.
    ``selection`` says, in the title, which samplers are shown when they are not all of a run's.
    """
    cols = min(3, len(pits))
    rows = -(-len(pits) // cols)
    fig, axes = _grid(rows, cols, (3.4 * cols, 2.7 * rows + 1.1), sharex=True, sharey=True)
    histograms = {name: np.histogram(np.asarray(u).ravel(), bins=bins, range=(0, 1), density=True)
                  for name, u in pits.items()}
    if ymax is None:
        ymax = float(np.clip(1.1 * max(d.max() for d, _ in histograms.values()), 1.5, 2.5))
    for ax, (name, (density, edges)) in zip(axes.flat, histograms.items()):
        ax.bar(edges[:-1], np.minimum(density, ymax), width=np.diff(edges), align="edge",
               color=sns.color_palette()[0], edgecolor="white", linewidth=0.5)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        if density.max() > ymax:
            ax.annotate(f"peak {density.max():.1f} (cut)", (0.5, 0.93), xycoords="axes fraction", ha="center",
                        va="top", fontsize=9, color="dimgrey")
        verdict = (verdicts or {}).get(name)
        ax.set_title(_wrap(name + (f" — {verdict}" if verdict else ""), 3.3, 10), fontsize=10,
                     color=VERDICT_COLORS.get(verdict, "black"))
    ax0 = axes.flat[0]
    ax0.set_ylim(0, ymax)
    ax0.set_xlim(0, 1)
    for col in range(cols):  # the lowest panel shown in each column carries the u axis
        shown = [axes[row, col] for row in range(rows) if row * cols + col < len(pits)]
        shown[-1].xaxis.set_tick_params(labelbottom=True)
        shown[-1].set_xlabel("u")
    return _finish_grid(fig, axes, len(pits), "density",
                        _wrap("Randomized PIT under the exact target law. Lossless ⇒ flat (dashed line); flat does "
                              "not imply lossless: some faults keep every token's PIT uniform"
                              + (f". Shown: {selection}" if selection else ""), 3.4 * cols, 11), 11)


def _finish_grid(fig: Figure, axes, used: int, ylabel: str, title: str, fontsize: int) -> Figure:
    """Hide the grid's unused panels, label the first column, title the figure."""
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    return fig


def step_decomposition(p: np.ndarray, q: np.ndarray, kept: np.ndarray, replaced: np.ndarray,
                       top: int = 20, tokens=None) -> Figure:
    """One verification step on a real distribution: accepted-draft mass min(p, q) stacked under
    the residual mass ρ·norm((p − q)+); together they rebuild p (black ticks); q shown as dots."""
    order = np.argsort(p)[::-1][:top]
    x = np.arange(len(order))
    colors = sns.color_palette()
    fig, ax = _new((10, 4.6))
    ax.bar(x, kept[order], color=colors[0], label="kept draft: min(p, q)")
    ax.bar(x, replaced[order], bottom=kept[order], color=colors[1], label="residual: ρ · norm((p − q)+)")
    ax.scatter(x, p[order], marker="_", s=300, color="black", label="target p", zorder=3)
    ax.scatter(x, q[order], marker="o", color=colors[2], label="draft q", zorder=3)
    _token_axis(ax, order, tokens)
    return _finish(fig, ax, "Modified rejection sampling, one step: the two parts add up to p",
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
    fig, axes = _grid(1, 2, (10.5, 3.9), sharey=True)
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
    right.set_title(_wrap(f"what {rule} emits: TV(out, p) = {tv:.3f}", 5, 11), fontsize=11,
                    color="black" if tv < 1e-9 else VERDICT_COLORS["rejected"])
    right.legend(fontsize=9, loc="upper right")
    left.set_ylim(0, max(1.0, float(out.max()) * 1.15))
    fig.tight_layout()
    return fig


def block_routes(routes: dict[str, np.ndarray], p_next: np.ndarray, tv: pd.DataFrame, top: int = 15,
                 tokens=None, given: str = "") -> Figure:
    """The block argument in one figure. Left: the law of token 2 given token 1 by each route through the
    block (``routes``: name → law), against p(· | token 1), over the ``top`` most likely tokens. Right: the exact
    TV over the first two tokens (``tv``: columns ``rule`` and ``exact TV``, log scale; the correct rules at
    rounding level, the wrong ones far from 0)."""
    order = np.argsort(p_next)[::-1][:top]
    x = np.arange(len(order))
    fig, axes = _grid(1, 2, (12, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    left, right = axes[0]
    left.plot(x, p_next[order], color="black", linewidth=6, alpha=0.25, label="p(· | token 1)", zorder=1)
    markers = "os^Dvx*P"
    for i, (name, law) in enumerate(routes.items()):
        left.plot(x, np.asarray(law)[order], marker=markers[i % len(markers)], linestyle="none", markersize=7,
                  color=sns.color_palette()[i % 10], label=name, zorder=2, alpha=0.9)
    _token_axis(left, order, tokens, xlabel=f"token 2, most likely under p first{given}")
    left.set_ylabel("probability")
    left.set_title("Token 2 given token 1, by route through the block", fontsize=11)
    left.legend(fontsize=8.5)
    frame = tv.assign(shown=np.maximum(tv["exact TV"].to_numpy(dtype=float), 1e-18))
    colors = [VERDICT_COLORS["equivalent"] if v < 1e-9 else VERDICT_COLORS["rejected"] for v in frame["shown"]]
    right.barh(np.arange(len(frame)), frame["shown"], color=colors)
    right.set_yticks(np.arange(len(frame)), [_wrap(r, 3.2, 9) for r in frame["rule"]], fontsize=9)
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("exact TV from p, first two tokens")
    right.set_title("Enumerated on the bundled pair", fontsize=11)
    fig.tight_layout()
    return fig


def bug_anatomy(parts: list[dict], top: int = 12, tokens=None, cols: int = 3) -> Figure:
    """One panel per negative control: the first step it emits, split into the accepted-draft part and the
    replacement part, against the true target law p (black ticks) over p's ``top`` tokens; its exact TV in
    the title. ``parts``: dicts with ``name``, ``p``, ``kept``, ``replaced``, ``tv`` and ``label`` (what the two
    parts are called, e.g. for the bonus fault) from
    :func:`specdec_lab.experiments.negative_controls.bug_anatomy`."""
    rows = -(-len(parts) // cols)
    fig, axes = _grid(rows, cols, (4.3 * cols, 3.3 * rows + 0.9))  # own y range each: no panel flattened
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
        ax.set_title(_wrap(f"{part['name']}: exact TV {part['tv']:.3f}", 4.1, 10), fontsize=10)
        ax.legend(fontsize=7.5, loc="upper right")
    return _finish_grid(fig, axes, len(parts), "probability",
                        _wrap("Anatomy of each negative control: where its one step puts the mass (bars) against "
                              "where p puts it (ticks)", 4.3 * cols, 12), 12)


def agreement_by_position(agreement: np.ndarray, independent_first: float) -> Figure:
    """How often same-seed naive and speculative chains emit the same token at each position, with the chance
    that two *independent* draws from p agree on the first token (Σ p(x)²) as a reference line."""
    agreement = np.asarray(agreement, dtype=float)
    x = np.arange(1, len(agreement) + 1)
    fig, ax = _new((7.5, 3.6))
    ax.plot(x, agreement, marker="o", label="same seed: naive and speculative emit the same token")
    ax.axhline(independent_first, color="black", linestyle="--", linewidth=1,
               label=f"two independent draws from p, position 1: Σ p² = {independent_first:.3f}")
    ax.set_xticks(x)
    ax.set_ylim(0, 1)
    return _finish(fig, ax, "Same seed, different samples: agreement by position", xlabel="position",
                   ylabel="fraction of chains", legend=dict(fontsize=9))


def audit_verdicts(table: pd.DataFrame, tolerance: float = 0.02) -> Figure:
    """An audit table (:func:`specdec_lab.audit.run_audits`, several engines concatenated) as
    :func:`tv_bounds`: one bar per audited row (implementation and settings), coloured by verdict, hatched
    when it is a negative control."""
    frame = table.assign(sampler=[f"{i}: {s}" if s else str(i) for i, s in zip(table["implementation"],
                                                                              table["settings"])])
    frame["sampler"] = [_wrap(name, 6, 10) if len(name) > 70 else name for name in frame["sampler"]]
    return tv_bounds(frame[["sampler", "TV upper 99%", "expected", "verdict", "Holm p"]], tolerance)


def size_meta_test(frame: pd.DataFrame, alpha: float, limit: float) -> Figure:
    """The suite's size under H0, per test: the rejection rate over replicates drawn from the exact law at
    level α (bars; α and the binomial limit α + 3 se as lines), and each single test's KS p-value of its
    p-values against Uniform(0, 1) (dots, right; small = not uniform).

    ``frame`` from :func:`specdec_lab.experiments.negative_controls.meta_test_figure_frame`."""
    fig, axes = _grid(1, 2, (12, 0.35 * len(frame) + 2.0), sharey=True)
    left, right = axes[0]
    y = np.arange(len(frame))
    rate = frame["rejection rate"].to_numpy(dtype=float)
    left.barh(y, rate, color=[VERDICT_COLORS["rejected"] if r > limit else sns.color_palette()[0] for r in rate])
    left.axvline(alpha, color="black", linestyle="--", linewidth=1, label=f"α = {alpha:g}")
    left.axvline(limit, color="black", linestyle=":", linewidth=1.5, label=f"α + 3 se = {limit:.3f}")
    left.set_yticks(y, frame["test"], fontsize=9)
    left.invert_yaxis()
    left.set_xlim(0, max(limit * 1.5, rate.max() * 1.1 + 1e-3))
    left.set_xlabel("rejection rate under H0")
    left.legend(fontsize=9, loc="lower right")
    ks = frame["KS p-value"].to_numpy(dtype=float)
    right.scatter(np.where(np.isnan(ks), np.nan, np.maximum(ks, 1e-6)), y, color="black")
    right.axvline(1e-3, color=VERDICT_COLORS["rejected"], linestyle="--", linewidth=1, label="1e-3")
    right.set_xscale("log")
    right.set_xlim(1e-6, 1.5)
    right.set_xlabel("KS p-value: p-values uniform? (Holm-combined: not shown)")
    right.legend(fontsize=9, loc="lower left")
    fig.suptitle("Size of the suite on samples of the exact law: rejections at about α, p-values uniform", fontsize=12)
    fig.tight_layout()
    return fig


def exact_tv(table: pd.DataFrame) -> Figure:
    """Exact TV between each rule's law and p (log scale); lossless rules sit at rounding level.

    ``table`` needs the columns ``rule``, ``exact TV`` and ``lossless``.
    """
    frame = table.assign(kind=np.where(table["lossless"], "lossless rule", "negative control"),
                         shown=np.maximum(table["exact TV"].to_numpy(dtype=float), 1e-18))
    fig, ax = _new((9, 0.4 * len(frame) + 1.8))
    sns.barplot(data=frame, y="rule", x="shown", hue="kind", dodge=False, ax=ax)
    ax.set_xscale("log")
    return _finish(fig, ax, _wrap("The theorem by enumeration: ~1e-16 for lossless rules, far from 0 for the bugs", 6),
                   xlabel="exact TV(rule's law, p) over the first two tokens", ylabel="",
                   legend=dict(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False))


def tv_bound_path(frame: pd.DataFrame, tolerance: float) -> Figure:
    """TV plug-in and the upper confidence bound as the sample grows, with ε as a line.

    ``frame`` needs the columns ``m``, ``TV plug-in`` and ``TV upper``.
    """
    long = frame.melt(id_vars="m", value_vars=["TV plug-in", "TV upper"], var_name="estimate",
                      value_name="TV")
    fig, ax = _new((8, 4.5))
    sns.lineplot(data=long, x="m", y="TV", hue="estimate", marker="o", ax=ax)
    ax.axhline(tolerance, color="black", linestyle="--", label=f"ε = {tolerance:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax)
    return _finish(fig, ax, "How the TV bound shrinks with the sample size m", xlabel="samples m")


def power_curves(frame: pd.DataFrame) -> Figure:
    """Simulated rejection rate vs sample size, against the predicted power curves.

    ``frame`` needs the columns ``alternative``, ``m``, ``simulated``, ``se``, ``noncentral χ²`` and
    ``planner (worst case)`` (:func:`specdec_lab.experiments.negative_controls.power_curve`).
    """
    names = list(dict.fromkeys(frame["alternative"]))
    fig, axes = _grid(1, len(names), (4.7 * len(names), 4.6), sharey=True)
    for ax, name in zip(axes.flat, names):
        part = frame[frame["alternative"] == name]
        ax.errorbar(part["m"], part["simulated"], yerr=2 * part["se"], fmt="o", color="black",
                    capsize=3, label="simulated ± 2 se")
        ax.plot(part["m"], part["noncentral χ²"], label="noncentral χ² at this law")
        ax.plot(part["m"], part["planner (worst case)"], linestyle="--", label="planner, worst case at this TV")
        ax.set_xscale("log")
        _plain_ticks(ax)
        ax.set_xlabel("samples m")
        ax.set_title(_wrap(name, 4.2, 11), fontsize=11)
    axes.flat[0].set_ylabel("power (rejection rate)")
    axes.flat[0].legend(fontsize=10)
    fig.suptitle("Power of the Pearson identity test: simulation vs prediction")
    fig.tight_layout()
    return fig


def pvalue_histograms(pvalues: dict[str, np.ndarray], bins: int = 10) -> Figure:
    """Histograms of replicate p-values: flat for a correct sampler, piled at 0 for a faulty one."""
    fig, axes = _grid(1, len(pvalues), (4.5 * len(pvalues), 3.6))
    for ax, (name, pv) in zip(axes.flat, pvalues.items()):
        sns.histplot(x=np.asarray(pv), bins=bins, binrange=(0, 1), stat="density", ax=ax)
        ax.axhline(1.0, color="black", linestyle="--")
        ax.set_title(_wrap(name, 4.0, 11), fontsize=11)
        ax.set_xlabel("p-value")
    fig.suptitle("p-values over independent replicates (flat = calibrated)")
    fig.tight_layout()
    return fig


def roofline(hardware: dict[str, tuple[float, float]], points: pd.DataFrame) -> Figure:
    """The roofline: attainable FLOP/s = min(peak, intensity × bandwidth) per accelerator (log-log),
    with decoding steps at several batch sizes as points.

    ``hardware`` maps a name to (bandwidth bytes/s, peak FLOP/s); ``points`` needs the columns
    ``hardware``, ``batch``, ``FLOP per byte`` and ``FLOP/s attained`` (:func:`specdec_lab.experiments.memory_wall.batch_sweep`).
    """
    fig, ax = _new((9, 5.5))
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
    return _finish(fig, ax, _wrap("Roofline: decoding at batch B sits on the bandwidth slope until B is large", 8.2),
                   xlabel="arithmetic intensity (FLOP per byte moved)", ylabel="attainable FLOP/s",
                   legend=dict(title="hardware"))


def batch_sweep(frame: pd.DataFrame) -> Figure:
    """Roofline tokens/s against batch size per accelerator (log-log); marker = what binds.

    ``frame`` from :func:`specdec_lab.experiments.memory_wall.batch_sweep`.
    """
    fig, ax = _new((9, 5))
    sns.lineplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", legend=False, ax=ax)
    sns.scatterplot(data=frame, x="batch", y="tokens/s ≤", hue="hardware", style="bound", s=60, ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_ticks(ax)
    batches = sorted(frame["batch"].unique())
    ax.set_xticks(batches, [f"{b:,}" for b in batches])
    ax.set_ylabel("tokens/s (upper bound)")
    ax.set_title(_wrap("Tokens/s bound against batch size: linear while memory-bound, flat once compute-bound", 8.2))
    sns.move_legend(ax, "upper left")
    fig.tight_layout()
    return fig


def speedup(table: pd.DataFrame, k: int | None = None, title: str = "") -> Figure:
    """Speedup over K from :func:`specdec_lab.theory.speedup_table` (and a ``roofline speedup``
    column, if present), the best K marked, 1× (no speculation) as a line, and ``k`` (the K chosen)
    in red when given."""
    value_columns = [c for c in ("speedup", "roofline speedup") if c in table]
    long = table.melt(id_vars="K", value_vars=value_columns, var_name="model", value_name="speedup ×")
    fig, ax = _new((8, 4.5))
    sns.lineplot(data=long, x="K", y="speedup ×", hue="model", marker="o", ax=ax)
    best = table.loc[table["best"]].iloc[0]
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no speculation")
    ax.axvline(best["K"], color="grey", linestyle=":", linewidth=2, label=f"best K = {int(best['K'])}")
    if k is not None:
        ax.axvline(k, color="red", linewidth=1.5, label=f"your K = {k}")
    ax.set_xticks(table["K"])
    return _finish(fig, ax, _wrap(title or "Expected wall-clock speedup (1 − α^{K+1}) / ((1 − α)(Kc + 1))", 6.5),
                   legend=dict(loc="best"))


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
    fig, ax = _new((max(7, 1.1 * next_leaf[0] + 2), 1.1 * max(depth) + 2.0))
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
    fig, axes = _grid(1, len(temperatures), (4.7 * len(temperatures), 4.4))
    for ax, temperature in zip(axes.flat, temperatures):
        table = grid[grid["temperature"] == temperature].pivot(index="epsilon", columns="alpha", values="tv")
        sns.heatmap(table, annot=True, fmt=".2f", cmap="rocket_r", vmin=0, vmax=float(grid["tv"].max()), ax=ax)
        ax.set_title(f"T = {temperature:g}: TV(typical, p), first token")
        ax.set_xlabel("α (entropy-scaled threshold)")
        ax.set_ylabel("ε (hard threshold)")
    fig.suptitle(_wrap("Medusa typical acceptance is lossy: exact TV from the target law (0 = lossless)",
                       4.7 * len(temperatures)))
    fig.tight_layout()
    return fig


def detection_power(power: pd.DataFrame, level: float = 0.9) -> Figure:
    """Power of the whole suite against each planted fault family, over the fault's exact TV on
    the first two tokens (from :func:`specdec_lab.experiments.negative_controls.detection_power`), with the 0.9 line."""
    fig, ax = _new((8, 4))
    sns.lineplot(data=power, x="exact TV (2 tokens)", y="power", hue="family", marker="o", ax=ax)
    ax.axhline(level, color="black", linestyle="--", linewidth=1, label=f"power {level:g}")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    m = int(power["m"].iloc[0])
    return _finish(fig, ax, f"What the suite can see at m = {m:,}: power against planted faults",
                   legend=dict(fontsize=8))


def kernel_tests(tests: pd.DataFrame, title: str) -> Figure:
    """A kernel audit at a glance: −log10 of each law and acceptance test's Holm-adjusted p-value by
    scenario row and position (darker = stronger evidence against the kernel; 3 is α = 0.001)."""
    cells = tests[tests["kind"].isin(["law", "acceptance"])].copy()
    cells["evidence"] = -np.log10(cells["holm"].clip(lower=1e-300))
    cells["test"] = cells["kind"] + " @" + cells["position"].astype(int).astype(str)
    grid = cells.pivot_table(index="row", columns="test", values="evidence", aggfunc="max")
    fig, ax = _new((11, 0.45 * len(grid) + 2))
    sns.heatmap(grid.clip(upper=10), ax=ax, cmap="rocket_r", vmin=0, vmax=10, linewidths=0.5,
                cbar_kws={"label": "−log10 Holm p (capped at 10)"})
    ax.set_ylabel("scenario row")
    ax.set_xlabel("")
    ax.set_title(_wrap(title, 11))
    fig.tight_layout()
    return fig


def kernel_rows(panels: list[tuple[str, np.ndarray, np.ndarray]], top: int = 20) -> Figure:
    """Observed against exact mass for the ``top`` tokens of largest gap, one panel per (title, counts, p)."""
    fig, axes = _grid(len(panels), 1, (10, 3.2 * len(panels)))
    for ax, (title, counts, p) in zip(axes[:, 0], panels):
        observed = counts / max(1, counts.sum())
        order = np.argsort(-np.abs(observed - p))[:top]
        x = np.arange(len(order))
        ax.bar(x - 0.2, observed[order], width=0.4, label="observed")
        ax.bar(x + 0.2, p[order], width=0.4, label="exact p", color=sns.color_palette()[2])
        ax.set_xticks(x, [str(t) for t in order], rotation=90, fontsize=8)
        ax.set_ylabel("mass")
        ax.set_title(_wrap(title, 10, 11), fontsize=11)
        ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
