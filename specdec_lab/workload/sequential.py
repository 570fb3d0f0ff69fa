"""Decisions that stay valid when a run looks again: the look ledger, the spending rule, the e-process per cell,
and ``--until-decided``.

**Resumption.** Every judgement of a cell is a *look*, counted per cell in ``<out>/looks.json``, which a resumed
run reads. Look k judges at the spent levels α_k = α · 6/(π² k²) and δ_k = δ · 6/(π² k²) (Σ_k 6/(π² k²) = 1), so
the chance that *any* look of a correct server's cell is rejected, or that any look certifies a bound that does not
hold, stays ≤ α and ≤ δ however often the run is resumed (a union bound over the looks). The first look costs
6/π² ≈ 0.61 of the level. docs/method.md has a simulation of the error rate under resumption.

**Sequential rejection.** With ``--until-decided`` each cell's outcomes, in request order, are binned by their
exact probability into :data:`BINS` bins of about equal mass (impossible outcomes into a bin of null mass 0) and
fed to the Dirichlet-mixture e-process (:func:`specdec_lab.stats.dirichlet_eprocess`); a cell is rejected as soon
as its e-value reaches J/α (J cells: Bonferroni), which Ville's inequality keeps valid at any stopping time, and
it stops receiving requests. A cell is certified when its bound at the look's spent level is ≤ ε; the rest go on,
round-robin, until each is decided or the request budget is spent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from specdec_lab import stats

BINS = 16  # probability-quantile bins of the e-process
LEDGER = "looks.json"


def spent(level: float, look: int) -> float:
    """The level look ``look`` (1-based) may use: ``level`` · 6/(π² look²); the sum over all looks is ``level``.

    >>> round(spent(0.01, 1), 5), round(sum(spent(0.01, k) for k in range(1, 100000)), 6)
    (0.00608, 0.01)
    """
    if look < 1:
        raise ValueError(f"looks count from 1, got {look}")
    return level * 6.0 / (math.pi ** 2 * look ** 2)


class LookLedger:
    """The number of looks taken at each cell of a run folder (``<out>/looks.json``), kept across resumptions."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LEDGER
        self.looks: dict[str, int] = json.loads(self.path.read_text())["looks"] if self.path.exists() else {}

    def take(self, cells) -> dict[str, int]:
        """Count one more look at each of ``cells`` (names); return each one's look number; written at once."""
        for name in cells:
            self.looks[name] = self.looks.get(name, 0) + 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"looks": self.looks}, indent=1))
        tmp.replace(self.path)
        return {name: self.looks[name] for name in cells}


def quantile_bins(law: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """(bin of each outcome (len(law),), null mass of each bin (bins + 1,)): outcomes sorted by probability, cut
    into ``bins`` bins of about equal mass; the last bin holds the outcomes of probability 0 (null mass 0).

    >>> which, mass = quantile_bins(np.array([0.5, 0.0, 0.25, 0.25]), bins=2)
    >>> which.tolist(), mass.tolist()
    ([0, 2, 1, 1], [0.5, 0.5, 0.0])
    """
    order = np.argsort(-law, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(law[order])[:-1]])  # mass of the outcomes ahead of each
    which = np.empty(len(law), dtype=np.int64)
    which[order] = np.minimum((before * bins).astype(np.int64), bins - 1)
    which[law <= 0] = bins
    mass = np.bincount(which, weights=law, minlength=bins + 1)
    mass[bins] = 0.0
    return which, mass


def eprocess_pvalue(outcomes: np.ndarray, law: np.ndarray) -> float:
    """Anytime-valid p-value of a cell's outcomes (indices into ``law``, in arrival order) against ``law``: 0 when
    an outcome of probability 0 occurs, else the Dirichlet e-process on :func:`quantile_bins`."""
    if len(outcomes) == 0:
        return 1.0
    which, mass = quantile_bins(law)
    bins = which[outcomes]
    if (mass[bins] <= 0).any():
        return 0.0
    kept = mass[:-1] > 0
    relabel = np.cumsum(kept) - 1  # drop empty bins (a law with fewer outcomes than bins)
    return stats.dirichlet_eprocess(relabel[bins], mass[:-1][kept]).pvalue
