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
