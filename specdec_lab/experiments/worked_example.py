"""Notebook 00, the worked example: one speculative step on a 3-token vocabulary, by hand and by the library.

p is the target, q the draft (Leviathan et al. 2023); the law of what the sampler emits is called ``out``.
Everything here is small enough to read: :func:`proof_lines` writes the proof with the numbers put in,
:func:`library_law` asks :mod:`specdec_lab.laws` for the same law through the rule the samplers run
(:data:`specdec_lab.samplers.rules.LEVIATHAN`), and :func:`explorer` is the interactive version.

>>> out = library_law(P, Q)
>>> [round(float(x), 12) for x in out]
[0.5, 0.3, 0.2]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from specdec_lab import laws, plots
from specdec_lab.experiments.scale import setup  # noqa: F401 (for the notebook)
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.faulty import FAULTY
from specdec_lab.samplers.rules import LEVIATHAN, Verifier, accept_ratio, residual_positive_part

TOKENS = ["A", "B", "C"]
P = np.array([0.5, 0.3, 0.2])  # the target's law of the next token
Q = np.array([0.2, 0.2, 0.6])  # the draft's: too little A and B, too much C

# Rules the explorer offers: the correct one and the faulty ones whose fault shows at T = 1 on one step.
EXPLORER_RULES = ("leviathan", "always_accept", "residual_from_p", "residual_from_q", "swapped_ratio")


def _laws(p, q) -> tuple[torch.Tensor, torch.Tensor]:
    p, q = (torch.as_tensor(np.asarray(v, dtype=np.float64)) for v in (p, q))
    if not (torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64)) and
            torch.isclose(q.sum(), torch.tensor(1.0, dtype=torch.float64))):
        raise ValueError(f"p and q must each sum to 1; got {float(p.sum())} and {float(q.sum())}")
    return p, q


def user_verifier(rule) -> Verifier:
    """A :class:`~specdec_lab.samplers.rules.Verifier` whose acceptance and residual are the reader's ``rule``.

    ``rule(p, q)`` takes the target and draft laws as numpy arrays (V,) and returns ``(accept, residual)``:
    ``accept[x]`` the chance of keeping a proposed x, ``residual`` the law a replacement is drawn from after a
    rejection. The library calls the acceptance on whole laws (a token the draft never proposes is looked up
    with q = 1 there and its keep mass is zeroed), so the rule may divide by q.
    """
    def laws(p, q):
        accept, residual = rule(p.numpy(), q.numpy())
        accept = np.broadcast_to(np.asarray(accept, dtype=np.float64), p.shape)
        residual = np.asarray(residual, dtype=np.float64)
        if not ((accept >= 0) & (accept <= 1)).all():
            raise ValueError(f"accept must lie in [0, 1] for every token, got {accept.tolist()}")
        if residual.shape != p.shape or (residual < 0).any() or not np.isclose(residual.sum(), 1.0):
            raise ValueError(f"residual must be a law over the {len(p)} tokens (>= 0, sum 1), got {residual.tolist()}")
        return torch.as_tensor(accept.copy()), torch.as_tensor(residual)

    name = getattr(rule, "__name__", "your rule")
    return Verifier(name, False, f"the reader's rule {name}",
                    accept_prob=lambda p, q: laws(p, q)[0], residual=lambda p, q: laws(p, q)[1])


def _verifier(rule) -> Verifier:
    if callable(rule):
        return user_verifier(rule)
    return LEVIATHAN if rule == "leviathan" else FAULTY[rule]


def library_parts(p, q, rule="leviathan") -> tuple[np.ndarray, np.ndarray]:
    """(kept, replaced) of one step by the library's rule ``rule`` (:func:`specdec_lab.laws.step_parts`):
    kept(x) = q(x)·acc(x), the mass of emitting x as the accepted draft; replaced(x) = ρ·r(x). ``rule`` is a
    rule's name (``"leviathan"`` or a negative control's) or a function, as in :func:`user_verifier`."""
    p, q = _laws(p, q)
    verifier = _verifier(rule)
    kept, replaced = laws.step_parts(torch.log(p), torch.log(q), SamplingConfig(), verifier)  # log 0 = -inf: fine
    return kept.numpy(), replaced.numpy()


def library_law(p, q, rule="leviathan") -> np.ndarray:
    """The exact law ``out`` of the emitted token under the library's rule (kept + replaced)."""
    kept, replaced = library_parts(p, q, rule)
    return kept + replaced


def exact_law_of_rule(rule, p=P, q=Q) -> pd.DataFrame:
    """The exact law of the token one step of ``rule`` emits, per token, by :func:`specdec_lab.laws.step_parts`
    (no sampling): p, q, the kept and replaced parts and their sum ``out``; ``attrs["tv"]`` is TV(out, p).
    ``rule``: a function ``rule(p, q) -> (accept, residual)`` (:func:`user_verifier`) or a rule's name.

    >>> def keep_everything(p, q):
    ...     return np.ones_like(p), p
    >>> law = exact_law_of_rule(keep_everything)
    >>> law["out"].round(12).tolist(), round(law.attrs["tv"], 12)
    ([0.2, 0.2, 0.6], 0.4)
    """
    kept, replaced = library_parts(p, q, rule)
    p, q = (np.asarray(v, dtype=np.float64) for v in (p, q))
    out = kept + replaced
    frame = pd.DataFrame({"token": TOKENS[: len(p)], "p": p, "q": q, "kept": kept, "replaced": replaced,
                          "out": out, "out − p": out - p})
    frame.attrs["tv"] = 0.5 * float(np.abs(out - p).sum())
    return frame


def rule_pieces(p, q) -> pd.DataFrame:
    """The library's acceptance probability min(1, p/q) and residual norm((p − q)+), per token
    (:func:`specdec_lab.samplers.rules.accept_ratio`, :func:`~specdec_lab.samplers.rules.residual_positive_part`),
    the pieces the notebook's numpy sampler writes by hand."""
    p, q = _laws(p, q)
    return pd.DataFrame({"token": TOKENS[: len(p)], "p (target)": p.numpy(), "q (draft)": q.numpy(),
                         "library: accept min(1, p/q)": accept_ratio(p, q).numpy(),
                         "library: residual norm((p−q)+)": residual_positive_part(p, q).numpy()})


def proof_table(p, q) -> pd.DataFrame:
    """Every quantity of the proof, per token: min(p, q), (p − q)+, ρ, r, ρ·r and out = min(p, q) + ρ·r."""
    p, q = (np.asarray(v, dtype=np.float64) for v in (p, q))
    kept = np.minimum(p, q)
    excess = np.maximum(p - q, 0.0)
    rho = 1.0 - kept.sum()
    r = excess / excess.sum() if excess.sum() > 0 else p
    return pd.DataFrame({"token": TOKENS[: len(p)], "p": p, "q": q, "kept = min(p, q)": kept,
                         "(p − q)+": excess, "r = (p − q)+ / ρ": r, "ρ · r": rho * r,
                         "out = min(p, q) + ρ·r": kept + rho * r})


def _f(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if abs(v - round(v, 2)) < 1e-12 else f"{v:.4f}"


def proof_lines(p, q):
    """The proof, line by line, with the numbers of ``p`` and ``q`` put in (an IPython Markdown object)."""
    from IPython.display import Markdown

    p, q = (np.asarray(v, dtype=np.float64) for v in (p, q))
    kept = np.minimum(p, q)
    excess = np.maximum(p - q, 0.0)
    rho = 1.0 - kept.sum()
    lines = [
        "**1. Keep.** The draft proposes $x \\sim q$ and keeps it with probability $\\min(1, p(x)/q(x))$, so "
        "$P(\\text{emit } x \\text{ as the draft}) = q(x)\\min\\!\\left(1, \\tfrac{p(x)}{q(x)}\\right) = \\min(p(x), q(x))$:",
        "",
        *[f"- {t}: $\\min({_f(a)}, {_f(b)}) = {_f(k)}$" for t, a, b, k in zip(TOKENS, p, q, kept)],
        "",
        f"**2. Reject.** The draft is rejected with probability $\\rho = 1 - \\sum_x \\min(p, q) = 1 - "
        f"({' + '.join(_f(k) for k in kept)}) = {_f(rho)}$. "
        f"This is also $\\sum_x (p(x) - q(x))_+ = {' + '.join(_f(e) for e in excess)} = {_f(excess.sum())}$, "
        "since both equal $1 - \\sum_x \\min(p, q)$.",
        "",
        "**3. Replace.** After a rejection the token is drawn from $r = (p - q)_+ / \\rho$:",
        "",
        *[f"- {t}: $r = {_f(e)} / {_f(rho)} = {_f(e / rho if rho > 0 else 0.0)}$"
          for t, e in zip(TOKENS, excess)],
        "",
        "**4. Add.** $\\mathrm{out}(x) = \\min(p(x), q(x)) + \\rho\\, r(x) = \\min(p(x), q(x)) + (p(x) - q(x))_+ = p(x)$, "
        "because $\\min(a, b) + (a - b)_+ = a$ for any numbers $a, b$:",
        "",
        *[f"- {t}: ${_f(k)} + {_f(rho)} \\times {_f(e / rho if rho > 0 else 0.0)} = {_f(k)} + {_f(e)} = {_f(k + e)} = p({t})$"
          for t, k, e in zip(TOKENS, kept, excess)],
    ]
    return Markdown("\n".join(lines))


def sampled_check(p, draws, seed_note: str = "") -> pd.DataFrame:
    """The notebook sampler's draws against p: frequency, the ±2 sd band at that sample size, the exact law
    from the library, and a Pearson test of the counts against p (one row per token; the test's p-value in
    the frame's ``attrs``)."""
    p = np.asarray(p, dtype=np.float64)
    draws = np.asarray(draws)
    m = len(draws)
    counts = np.bincount(draws, minlength=len(p))
    sd = np.sqrt(p * (1 - p) / m)
    frame = pd.DataFrame({"token": TOKENS[: len(p)], "p": p, "numpy sampler: frequency": counts / m,
                          "± 2 sd": 2 * sd, "inside the band": np.abs(counts / m - p) <= 2 * sd})
    frame.attrs["pearson p-value"] = float(scipy_stats.chisquare(counts, m * p).pvalue)
    frame.attrs["m"] = m
    return frame


def sampled_reading(check: pd.DataFrame, alpha: float = 0.01) -> str:
    """What a :func:`sampled_check` says, in words that hold for any seed: how many frequencies fall outside their
    ±2 sd band (each does so by chance about 1 time in 22 for a correct sampler), and the Pearson p-value read as
    "a deviation at least this large happens to an exact sampler about once in 1/p runs".

    >>> frame = pd.DataFrame({"inside the band": [True, False, True]})
    >>> frame.attrs.update({"pearson p-value": 0.04, "m": 20_000})
    >>> print(sampled_reading(frame))
    1 of 3 frequencies outside its ±2 sd band; Pearson p-value 0.04: an exact sampler deviates at least this much in about 1 run of 25, so this is not evidence of a bug (not rejected at α = 0.01).
    """
    outside = int((~check["inside the band"]).sum())
    pvalue = check.attrs["pearson p-value"]
    often = f"about 1 run of {1 / pvalue:,.0f}" if pvalue >= 1e-6 else "fewer than 1 run in a million"
    verdict = (f"not evidence of a bug (not rejected at α = {alpha:g})" if pvalue > alpha
               else f"rejected at α = {alpha:g}: for an exact sampler this happens in a share α of seeds")
    return (f"{outside} of {len(check)} frequencies outside its ±2 sd band; Pearson p-value {pvalue:.2f}: an exact "
            f"sampler deviates at least this much in {often}, so this is {verdict}.")


def picture(p, q, rule="leviathan", draws=None):
    """:func:`specdec_lab.plots.three_token_step` for the library's ``rule`` (a name or a function, as in
    :func:`library_parts`) and the notebook sampler's draws."""
    kept, replaced = library_parts(p, q, rule)
    freq = None if draws is None else np.bincount(np.asarray(draws), minlength=len(TOKENS)) / len(draws)
    label = _verifier(rule).name
    return plots.three_token_step(np.asarray(p, float), np.asarray(q, float), kept, replaced, TOKENS, rule=label,
                                  sampled=freq)


def normalise(weights) -> np.ndarray:
    """Non-negative slider weights as a law (uniform when they are all 0).

    >>> normalise([2, 1, 1]).tolist()
    [0.5, 0.25, 0.25]
    """
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    return w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))


def explorer_text(p, q, rule="leviathan") -> str:
    """The explorer's summary line: p, q, α = Σ min(p, q), the output law and its TV from p.

    >>> print(explorer_text(P, Q))
    p = A 0.500 · B 0.300 · C 0.200 | q = A 0.200 · B 0.200 · C 0.600
    rule leviathan: out = A 0.500 · B 0.300 · C 0.200 | acceptance α = 0.600 | TV(out, p) = 0.000
    """
    out = library_law(p, q, rule)

    def law(v):
        return " · ".join(f"{t} {x:.3f}" for t, x in zip(TOKENS, v))

    alpha = float(np.minimum(p, q).sum())
    tv = 0.5 * float(np.abs(out - np.asarray(p)).sum())
    return f"p = {law(p)} | q = {law(q)}\nrule {rule}: out = {law(out)} | acceptance α = {alpha:.3f} | TV(out, p) = {tv:.3f}"


def explorer(p=P, q=Q):
    """ipywidgets sliders for the weights of p and q (each normalised to a law) and a choice of rule; shows
    :func:`explorer_text` and :func:`picture`, recomputed by the library at every move."""
    import ipywidgets as widgets
    from IPython.display import display

    def slider(name, value):
        return widgets.FloatSlider(value=float(value), min=0.0, max=1.0, step=0.05, description=name,
                                   readout_format=".2f", continuous_update=False)

    controls = {f"p_{t}": slider(f"p {t}", v) for t, v in zip(TOKENS, p)}
    controls |= {f"q_{t}": slider(f"q {t}", v) for t, v in zip(TOKENS, q)}
    controls["rule"] = widgets.Dropdown(options=list(EXPLORER_RULES), value="leviathan", description="rule")

    def show(rule, **weights):
        p_now = normalise([weights[f"p_{t}"] for t in TOKENS])
        q_now = normalise([weights[f"q_{t}"] for t in TOKENS])
        print(explorer_text(p_now, q_now, rule))
        display(picture(p_now, q_now, rule))

    return widgets.interactive(show, **controls)
