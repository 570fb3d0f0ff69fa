"""Figures of the statistical evidence: what verify's report and the audit and power notebooks show.

TV bounds coloured by the suite's verdict (:func:`tv_bounds`, :func:`audit_verdicts`), sampled against exact
first-token laws (:func:`first_token`, :func:`observed_vs_expected`), randomized PIT (:func:`pit`), how the
bound shrinks with m (:func:`tv_bound_path`), the suite's size and power (:func:`size_meta_test`,
:func:`power_curves`, :func:`pvalue_histograms`, :func:`detection_power`) and the kernel audit
(:func:`kernel_tests`, :func:`kernel_rows`). Each returns a closed figure (:mod:`specdec_lab.plots.common`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from specdec_lab.plots.common import (VERDICT_COLORS, finish, finish_grid, new_axes, new_grid, plain_ticks,
                                      token_axis, wrap)


# tv_bounds' log axis starts at ε / BAR_FLOOR_BELOW_TOLERANCE: a decade below ε, room to see how far under ε a
# bound sits, and a bar's base that does not move with the data
BAR_FLOOR_BELOW_TOLERANCE = 10


def tv_bounds(summary: pd.DataFrame, tolerance: float) -> Figure:
    """Bars of the upper confidence bound on TV per sampler, coloured by the **verdict**, with ε as a line.

    A bar's colour is what the suite decided (equivalent, rejected, inconclusive), not what the row was
    expected to be: a negative control whose TV bound sits below ε but that another test rejected is red, with
    the note "rejected by the tests, not the bound" beside it. Expected negative controls are hatched.
    ``summary`` needs the columns ``sampler``, ``TV upper 99%``, ``expected`` and ``verdict``
    (:func:`specdec_lab.report.summary_table`; ``Holm p`` is quoted when present).

    The axis is logarithmic (what matters is a bound's ratio to ε) and starts at a fixed floor, ε/10: every bar
    runs from that floor to its bound (a bar on a log axis has no zero to start from), the floor is named in the
    axis label, and a bound below it is drawn as a marker at the floor with its value written beside it. Axes
    patches: one bar per row, in row order.
    """
    frame = summary.reset_index(drop=True)
    fig, ax = new_axes((10, 0.42 * len(frame) + 2.2))
    y = np.arange(len(frame))
    bounds = frame["TV upper 99%"].to_numpy(dtype=float)
    floor = tolerance / BAR_FLOOR_BELOW_TOLERANCE
    for i, row in frame.iterrows():
        control = row["expected"] != "lossless"
        color = VERDICT_COLORS.get(row["verdict"], "black")
        ax.barh(i, max(bounds[i] - floor, 0.0), left=floor, color=color, hatch="//" if control else None,
                edgecolor="white" if control else None, linewidth=0)
        if bounds[i] < floor:
            ax.plot([floor], [i], marker="<", color=color, markersize=8, clip_on=False)
            ax.annotate(f"{bounds[i]:.2g}, below ε/{BAR_FLOOR_BELOW_TOLERANCE:g}", (floor, i), xytext=(8, 0),
                        textcoords="offset points", va="center", fontsize=9, color=color)
        if row["verdict"] == "rejected" and bounds[i] <= tolerance:
            holm = f", Holm p = {row['Holm p']:.1e}" if "Holm p" in frame else ""
            ax.annotate(f"rejected by the tests, not the bound{holm}", (max(bounds[i], floor), i), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=9, color=VERDICT_COLORS["rejected"])
    ax.set_yticks(y, frame["sampler"], fontsize=10)
    ax.invert_yaxis()
    ax.axvline(tolerance, color="black", linestyle="--")
    ax.set_xscale("log")
    plain_ticks(ax)
    ax.set_xlim(floor, max(1.0, bounds.max() * 1.5))
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items() if v in set(frame["verdict"])]
    handles += [Patch(facecolor="lightgrey", hatch="//", edgecolor="white", label="negative control (expected rejected)"),
                Line2D([], [], color="black", linestyle="--", label=f"tolerance ε = {tolerance:g}")]
    ax.set_xlabel(f"upper 99% confidence bound on TV(sampler, p), first token (log scale from ε/"
                  f"{BAR_FLOOR_BELOW_TOLERANCE:g} = {floor:g})")
    height = fig.get_figheight()
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False, fontsize=10)
    fig.suptitle(wrap("Upper 99% bound on TV from the target, per sampler, coloured by the suite's verdict "
                      "(equivalent = no test rejects and the bound is below ε)", 10, 12), fontsize=12)
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))
    return fig


def audit_verdicts(table: pd.DataFrame, tolerance: float = 0.02) -> Figure:
    """An audit table (:func:`specdec_lab.audit.run_audits`, several engines concatenated) as
    :func:`tv_bounds`: one bar per audited row (implementation and settings), coloured by verdict, hatched
    when it is a negative control."""
    frame = table.assign(sampler=[f"{i}: {s}" if s else str(i) for i, s in zip(table["implementation"],
                                                                              table["settings"])])
    frame["sampler"] = [wrap(name, 6, 10) if len(name) > 70 else name for name in frame["sampler"]]
    return tv_bounds(frame[["sampler", "TV upper 99%", "expected", "verdict", "Holm p"]], tolerance)


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
    fig, ax = new_axes((10.5, 4.8))
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
    token_axis(ax, order, tokens)
    return finish(fig, ax, wrap(f"First token: sampled frequencies against the exact target law p ({len(order)} most "
                                  "likely tokens)", 9), ylabel="probability", legend=dict(fontsize=9))


def observed_vs_expected(counts: np.ndarray, p: np.ndarray, top: int = 30, tokens=None) -> Figure:
    """Observed counts against expected counts m·p for the ``top`` most likely tokens, with a
    ±2 standard deviation band (binomial), so a reader sees which bars are within noise."""
    counts = np.asarray(counts, dtype=np.float64)
    m = counts.sum()
    order = np.argsort(p)[::-1][:top]
    expected = m * p[order]
    sd = np.sqrt(m * p[order] * (1 - p[order]))
    fig, ax = new_axes((10, 4.6))
    x = np.arange(len(order))
    ax.bar(x, counts[order], color=sns.color_palette()[0], label="observed")
    ax.errorbar(x, expected, yerr=2 * sd, fmt="o", color="black", capsize=3, label="expected m·p ± 2 sd")
    token_axis(ax, order, tokens)
    return finish(fig, ax, f"First token: observed vs expected (m = {int(m):,})", ylabel="count")


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
    fig, axes = new_grid(rows, cols, (3.4 * cols, 2.7 * rows + 1.1), sharex=True, sharey=True)
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
        ax.set_title(wrap(name + (f" — {verdict}" if verdict else ""), 3.3, 10), fontsize=10,
                     color=VERDICT_COLORS.get(verdict, "black"))
    ax0 = axes.flat[0]
    ax0.set_ylim(0, ymax)
    ax0.set_xlim(0, 1)
    for col in range(cols):  # the lowest panel shown in each column carries the u axis
        shown = [axes[row, col] for row in range(rows) if row * cols + col < len(pits)]
        shown[-1].xaxis.set_tick_params(labelbottom=True)
        shown[-1].set_xlabel("u")
    return finish_grid(fig, axes, len(pits), "density",
                       wrap("Randomized PIT under the exact target law. Lossless ⇒ flat (dashed line); flat does "
                            "not imply lossless: some faults keep every token's PIT uniform"
                            + (f". Shown: {selection}" if selection else ""), 3.4 * cols, 11), 11)


def tv_bound_path(frame: pd.DataFrame, tolerance: float) -> Figure:
    """TV plug-in and the upper confidence bound as the sample grows, with ε as a line.

    ``frame`` needs the columns ``m``, ``TV plug-in`` and ``TV upper``.
    """
    long = frame.melt(id_vars="m", value_vars=["TV plug-in", "TV upper"], var_name="estimate",
                      value_name="TV")
    fig, ax = new_axes((8, 4.5))
    sns.lineplot(data=long, x="m", y="TV", hue="estimate", marker="o", ax=ax)
    ax.axhline(tolerance, color="black", linestyle="--", label=f"ε = {tolerance:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_ticks(ax)
    return finish(fig, ax, "How the TV bound shrinks with the sample size m", xlabel="samples m")


def size_meta_test(frame: pd.DataFrame, alpha: float, limit: float) -> Figure:
    """The suite's size under H0, per test: the rejection rate over replicates drawn from the exact law at
    level α (bars; α and the binomial limit α + 3 se as lines), and each single test's KS p-value of its
    p-values against Uniform(0, 1) (dots, right; small = not uniform).

    ``frame`` from :func:`specdec_lab.experiments.negative_controls.meta_test_figure_frame`."""
    fig, axes = new_grid(1, 2, (12, 0.35 * len(frame) + 2.0), sharey=True)
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


def power_curves(frame: pd.DataFrame) -> Figure:
    """Simulated rejection rate vs sample size, against the predicted power curves.

    ``frame`` needs the columns ``alternative``, ``m``, ``simulated``, ``se``, ``noncentral χ²`` and
    ``planner (worst case)`` (:func:`specdec_lab.experiments.negative_controls.power_curve`).
    """
    names = list(dict.fromkeys(frame["alternative"]))
    fig, axes = new_grid(1, len(names), (4.7 * len(names), 4.6), sharey=True)
    for ax, name in zip(axes.flat, names):
        part = frame[frame["alternative"] == name]
        ax.errorbar(part["m"], part["simulated"], yerr=2 * part["se"], fmt="o", color="black",
                    capsize=3, label="simulated ± 2 se")
        ax.plot(part["m"], part["noncentral χ²"], label="noncentral χ² at this law")
        ax.plot(part["m"], part["planner (worst case)"], linestyle="--", label="planner, worst case at this TV")
        ax.set_xscale("log")
        plain_ticks(ax)
        ax.set_xlabel("samples m")
        ax.set_title(wrap(name, 4.2, 11), fontsize=11)
    axes.flat[0].set_ylabel("power (rejection rate)")
    axes.flat[0].legend(fontsize=10)
    fig.suptitle("Power of the Pearson identity test: simulation vs prediction")
    fig.tight_layout()
    return fig


def pvalue_histograms(pvalues: dict[str, np.ndarray], bins: int = 10) -> Figure:
    """Histograms of replicate p-values: flat for a correct sampler, piled at 0 for a faulty one."""
    fig, axes = new_grid(1, len(pvalues), (4.5 * len(pvalues), 3.6))
    for ax, (name, pv) in zip(axes.flat, pvalues.items()):
        sns.histplot(x=np.asarray(pv), bins=bins, binrange=(0, 1), stat="density", ax=ax)
        ax.axhline(1.0, color="black", linestyle="--")
        ax.set_title(wrap(name, 4.0, 11), fontsize=11)
        ax.set_xlabel("p-value")
    fig.suptitle("p-values over independent replicates (flat = calibrated)")
    fig.tight_layout()
    return fig


def detection_power(power: pd.DataFrame, level: float = 0.9) -> Figure:
    """Power of the whole suite against each planted fault family, over the fault's exact TV on
    the first two tokens (from :func:`specdec_lab.experiments.negative_controls.detection_power`), with the 0.9 line."""
    fig, ax = new_axes((8, 4))
    sns.lineplot(data=power, x="exact TV (2 tokens)", y="power", hue="family", marker="o", ax=ax)
    ax.axhline(level, color="black", linestyle="--", linewidth=1, label=f"power {level:g}")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    m = int(power["m"].iloc[0])
    return finish(fig, ax, f"What the suite can see at m = {m:,}: power against planted faults",
                  legend=dict(fontsize=8))


def kernel_tests(tests: pd.DataFrame, title: str) -> Figure:
    """A kernel audit at a glance: −log10 of each law and acceptance test's Holm-adjusted p-value by
    scenario row and position (darker = stronger evidence against the kernel; 3 is α = 0.001)."""
    cells = tests[tests["kind"].isin(["law", "acceptance"])].copy()
    cells["evidence"] = -np.log10(cells["holm"].clip(lower=1e-300))
    cells["test"] = cells["kind"] + " @" + cells["position"].astype(int).astype(str)
    grid = cells.pivot_table(index="row", columns="test", values="evidence", aggfunc="max")
    fig, ax = new_axes((11, 0.45 * len(grid) + 2))
    sns.heatmap(grid.clip(upper=10), ax=ax, cmap="rocket_r", vmin=0, vmax=10, linewidths=0.5,
                cbar_kws={"label": "−log10 Holm p (capped at 10)"})
    ax.set_ylabel("scenario row")
    ax.set_xlabel("")
    ax.set_title(wrap(title, 11))
    fig.tight_layout()
    return fig


def kernel_rows(panels: list[tuple[str, np.ndarray, np.ndarray]], top: int = 20) -> Figure:
    """Observed against exact mass for the ``top`` tokens of largest gap, one panel per (title, counts, p)."""
    fig, axes = new_grid(len(panels), 1, (10, 3.2 * len(panels)))
    for ax, (title, counts, p) in zip(axes[:, 0], panels):
        observed = counts / max(1, counts.sum())
        order = np.argsort(-np.abs(observed - p))[:top]
        x = np.arange(len(order))
        ax.bar(x - 0.2, observed[order], width=0.4, label="observed")
        ax.bar(x + 0.2, p[order], width=0.4, label="exact p", color=sns.color_palette()[2])
        ax.set_xticks(x, [str(t) for t in order], rotation=90, fontsize=8)
        ax.set_ylabel("mass")
        ax.set_title(wrap(title, 10, 11), fontsize=11)
        ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def findings(frame: pd.DataFrame, tolerance: float) -> Figure:
    """The README's figure: one bar per row (``sampler``, ``TV upper 99%``, ``verdict``, ``group``: 'ours' or
    'engines'), the certified TV bound against ε on a log axis from ε/10, coloured by verdict, the two groups
    separated. Ours bound token 1; the engines bound tokens 1–2 jointly (the first law holding a drafted token)."""
    frame = frame.reset_index(drop=True)
    fig, ax = new_axes((12, 0.34 * len(frame) + 1.8))
    floor = tolerance / BAR_FLOOR_BELOW_TOLERANCE
    bounds = frame["TV upper 99%"].to_numpy(dtype=float)
    colors = [VERDICT_COLORS.get(v, "black") for v in frame["verdict"]]
    ax.barh(np.arange(len(frame)), np.maximum(bounds - floor, 0.0), left=floor, color=colors)
    ax.set_yticks(np.arange(len(frame)), frame["sampler"], fontsize=9)
    ax.invert_yaxis()
    split = int((frame["group"] == "ours").sum())
    if 0 < split < len(frame):
        ax.axhline(split - 0.5, color="grey", linewidth=0.8)
    ax.axvline(tolerance, color="black", linestyle="--")
    ax.set_xscale("log")
    plain_ticks(ax)
    ax.set_xlim(floor, 1.5)
    ax.set_xlabel("upper 99% bound on TV from p (ours: token 1; engines: tokens 1–2); log scale")
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items() if v in set(frame["verdict"])]
    handles.append(Line2D([], [], color="black", linestyle="--", label=f"ε = {tolerance:g}: equivalent below it"))
    ax.legend(handles=handles, loc="upper right", fontsize=9)
    ax.set_title("Certified TV bound: our samplers above the line, the engines below", fontsize=11)
    fig.tight_layout()
    return fig
