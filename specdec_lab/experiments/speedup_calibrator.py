"""Notebook 06, the speedup calibrator: α measured on real models, the α published speedups imply, the widget."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from specdec_lab import plots, theory
from specdec_lab.experiments.proof_by_numbers import PROMPTS, SETTINGS, real_logits  # noqa: F401 (for the notebook)
from specdec_lab.experiments.scale import default_device, setup  # noqa: F401 (for the notebook)
from specdec_lab.sampling import make_generator, to_probs
from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative


def alpha_from_logits(target_logits: torch.Tensor, draft_logits: torch.Tensor, settings: dict) -> pd.DataFrame:
    """Mean acceptance α = Σ min(p, q) over real prefixes, for each sampling setting."""
    return pd.DataFrame([{"settings": label,
                          "α = Σ min(p, q)": float(np.mean(theory.acceptance_rate(to_probs(target_logits, config),
                                                                                   to_probs(draft_logits, config))))}
                         for label, config in settings.items()])


def measured_speculation(pair, prompt_ids: torch.Tensor, ks, n: int, length: int, seed: int = 0) -> pd.DataFrame:
    """Run the speculative sampler for each K: measured α and tokens per target pass, and the
    theory's (1 − α^{K+1})/(1 − α) at the measured α."""
    rows = []
    for k in ks:
        s = sample_speculative(pair, prompt_ids, n, length, SpeculativeConfig(k=int(k)),
                               make_generator(seed + int(k), pair.device)).stats
        rows.append({"K": int(k), "α measured": s["acceptance"], "tokens/pass measured": s["tokens_per_target_pass"],
                     "tokens/pass theory": s["theory_tokens_per_target_pass"]})
    return pd.DataFrame(rows)


def implied_alpha(speedup: float, k: int, c: float) -> float:
    """The acceptance α at which :func:`theory.expected_speedup` (α, K, c) equals ``speedup``
    (bisection; nan when even α = 1 cannot reach it).

    >>> round(implied_alpha(theory.expected_speedup(0.8, 4, 0.05), 4, 0.05), 6)
    0.8
    """
    if theory.expected_speedup(1.0, k, c) < speedup:
        return float("nan")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.expected_speedup(mid, k, c) < speedup else (lo, mid)
    return (lo + hi) / 2


# Llama-2 shapes (config.json of meta-llama/Llama-2-{7b,70b}-hf) for the gpt-fast headline, int4 weights.
LLAMA2_7B_INT4 = theory.ModelSpec("llama-2-7b int4", 6_738_415_616, layers=32, hidden_size=4096, attention_heads=32,
                                  kv_heads=32, head_dim=128, vocab_size=32_000, bytes_per_param=0.5)


LLAMA2_70B_INT4 = theory.ModelSpec("llama-2-70b int4", 68_976_648_192, layers=80, hidden_size=8192,
                                   attention_heads=64, kv_heads=8, head_dim=128, vocab_size=32_000, bytes_per_param=0.5)


CLAIMS = [  # (source, claimed speedup, target, draft, hardware); see the shared ANCHORS
    ("seed article: Llama-3.3-70B + Llama-3.2-1B", 2.5, "llama-70b", "llama-1b", "h100-sxm5"),
    ("gpt-fast: Llama-2-70B + 7B, int4 (48.4 vs 25.3 tok/s)", 48.4 / 25.3, LLAMA2_70B_INT4, LLAMA2_7B_INT4, "a100-80gb"),
]


def implied_alpha_table(ks=(3, 4, 5, 6)) -> pd.DataFrame:
    """For each published speedup claim: c from the roofline, and the α each K needs to deliver it."""
    rows = []
    for source, speedup, target, draft, hardware in CLAIMS:
        c = theory.draft_cost_ratio(target, draft, hardware)
        rows.append({"claim": source, "speedup": speedup, "c (roofline)": c,
                     **{f"α needed, K={k}": implied_alpha(speedup, int(k), c) for k in ks}})
    return pd.DataFrame(rows)


MANUAL_C = "manual c"  # the calibrator's hardware choice that keeps the c slider's value


def calibrator_view(alpha: float, k: int, c: float, hardware: str = MANUAL_C, target: str = "llama-70b",
                    draft: str = "llama-1b", k_max: int = 12):
    """What the calibrator shows for (α, K, c): the speedup curve over K = 0..k_max with K in red,
    one summary line, and the speedup table.

    ``hardware`` other than "manual c" replaces c by the roofline ratio of ``draft`` to ``target`` on it.
    Returns (figure, summary text, :func:`specdec_lab.theory.speedup_table` at the c used).

    >>> fig, text, table = calibrator_view(0.75, 4, 0.05)
    >>> text
    'K = 4: 3.05 tokens per target pass, speedup 2.54×. Best K = 7: 2.67×.\\nc = 0.0500 (slider).'
    >>> int(table.loc[table.best, "K"].iloc[0])
    7
    """
    source = "slider"
    if hardware != MANUAL_C:
        c = theory.draft_cost_ratio(target, draft, hardware)
        source = f"roofline of {draft} against {target} on {hardware}, batch 1"
    table = theory.speedup_table(alpha, c, k_max)
    fig = plots.speedup(table, k=k, title=f"Expected speedup at α = {alpha:.2f}, c = {c:.4f}")
    best = int(table.loc[table["best"], "K"].iloc[0])
    text = (f"K = {k}: {theory.expected_tokens_per_pass(alpha, k):.2f} tokens per target pass, speedup "
            f"{theory.expected_speedup(alpha, k, c):.2f}×. Best K = {best}: "
            f"{theory.expected_speedup(alpha, best, c):.2f}×.\nc = {c:.4f} ({source}).")
    return fig, text, table


def speedup_styler(table: pd.DataFrame, k: int):
    """The speedup table as the calibrator shows it: one column per K, best K in bold green,
    the chosen K shaded red."""
    wide = table.set_index("K")[["tokens/pass", "speedup"]].rename(columns={"speedup": "speedup ×"}).T
    best = int(table.loc[table["best"], "K"].iloc[0])

    def mark(column):
        style = "background-color: #fde0dd;" if column.name == k else ""
        style += " font-weight: bold; color: #1a7f37;" if column.name == best else ""
        return [style] * len(column)

    return wide.style.format("{:.3f}").apply(mark, axis=0).set_caption("K = draft tokens per target pass")


C_CHOICES = (0.001, 0.002, 0.003, 0.005, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5,
             0.7, 1.0)  # the calibrator's c slider: round values on a log-like scale (a 70B/1B pair is ~0.02)


def calibrator(alpha: float = 0.75, k: int = 4, c: float = 0.05):
    """ipywidgets controls (α, K, c, hardware) over :func:`calibrator_view`: the summary line, the
    speedup table and the curve. Picking a hardware takes c from the roofline and greys the c slider out."""
    import ipywidgets as widgets
    from IPython.display import display

    controls = dict(
        alpha=widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="α"),
        k=widgets.IntSlider(value=k, min=1, max=12, description="K"),
        c=widgets.SelectionSlider(options=sorted({*C_CHOICES, c}), value=c, description="c"),
        hardware=widgets.Dropdown(options=[MANUAL_C, *theory.HARDWARE], description="hardware"))

    def show(alpha, k, c, hardware):
        controls["c"].disabled = hardware != MANUAL_C
        fig, text, table = calibrator_view(alpha, k, c, hardware)
        print(text)
        display(speedup_styler(table, k))
        display(fig)

    return widgets.interactive(show, **controls)
