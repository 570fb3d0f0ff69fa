"""Speedup theory (Leviathan et al. 2023, Section 3): what acceptance buys.

α is the per-token acceptance probability, K the draft tokens per target pass, c the cost of one
draft pass relative to one target pass.
"""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 − α^{K+1}) / (1 − α): mean tokens per target pass for i.i.d. acceptance α.

    >>> round(expected_tokens_per_pass(0.8, 4), 4)
    3.3616
    >>> expected_tokens_per_pass(1.0, 4)
    5.0
    >>> expected_tokens_per_pass(0.0, 4)
    1.0
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Wall-clock speedup (1 − α^{K+1}) / ((1 − α)(K c + 1)) over plain decoding.

    >>> round(expected_speedup(0.8, 4, 0.05), 3)
    2.801
    """
    return expected_tokens_per_pass(alpha, k) / (k * c + 1.0)
