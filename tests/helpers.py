"""Test helpers: sample sizes from the power planner, exact laws at the prompt."""

import numpy as np
import torch

from specdec_lab import stats
from specdec_lab.sampling import to_probs

ALPHA = 1e-3  # per test, fixed seeds in CI
DETECT_TV = 0.02  # the deviation every distributional test must see
POWER = 0.99
# Romeo and Juliet, Act II, Scene II (public domain; in the bundled models' training corpus).
ROMEO_PASSAGE = ("JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n"
                 "Or if thou wilt not, be but sworn my love,\nAnd I'll no longer be a Capulet.\n")


def first_token_law(pair, prompt, config) -> np.ndarray:
    with torch.no_grad():
        logits = pair.target(prompt[None]).logits[0, -1, : pair.vocab_size]
    return to_probs(logits, config).numpy()


def planned_samples(p: np.ndarray, tv: float = DETECT_TV, alpha: float = ALPHA, power: float = POWER) -> int:
    """Smallest m whose chi-square test (on the bins merging gives at that m) has the power asked.

    Power is against any alternative at TV >= tv on those bins (worst case λ = m (2 tv)²).
    """
    m = 1000
    for _ in range(20):
        keep, tail = stats.merge_tail(p, m)
        bins = int(keep.sum()) + int(tail.any())
        planned = stats.plan_sample_size(tv, max(bins, 2), alpha, power)
        if planned <= m:
            return m
        m = planned
    return m


# Prompts whose greedy continuations an engine's converted target must reproduce token for token
IDENTITY_PROMPTS = ["HAMLET.", "ROMEO:\n", "To be, or not to be",
                    "MERCUTIO.\nA plague o' both your houses!\nMERCUTIO.\nA plag", "KING.\nWhat", "First Citizen",
                    "JULIET.\nO", "Enter", "OTHELLO.\nIt is the cause", "My lord,", "Exeunt.\n\n", "What, ho!"]


def require_engine(module, python) -> None:
    """Skip the calling test module when the engine's environment is missing — or fail it when the environment
    variable that names it (``module.ENV_PYTHON``, set by .ci/run) is set: CI must not skip an engine silently."""
    import os

    import pytest

    try:
        python()
    except FileNotFoundError as exc:
        if os.environ.get(module.ENV_PYTHON):
            pytest.fail(f"${module.ENV_PYTHON} is set but {exc}", pytrace=False)
        pytest.skip(str(exc), allow_module_level=True)
