"""Seaborn figures shared by the report (saved as PNG) and the notebooks (shown inline).

One import path for all of them: ``from specdec_lab import plots; plots.tv_bounds(...)``. Every function
returns a :class:`matplotlib.figure.Figure` already closed in pyplot (shown once in a notebook, written by
:func:`save`); functions take plain arrays and data frames, never models. One module per idea:

- :mod:`~specdec_lab.plots.common` — making, finishing and saving figures, token labels, verdict colours;
- :mod:`~specdec_lab.plots.evidence` — the statistical evidence: verify's and the audits' figures, power, size;
- :mod:`~specdec_lab.plots.mechanics` — the algorithm: one step, the block argument, exact TV, Medusa trees;
- :mod:`~specdec_lab.plots.speed` — roofline, batch sweep, speedup.
"""

from specdec_lab.plots.common import VERDICT_COLORS, save, token_label, token_strings
from specdec_lab.plots.evidence import (audit_verdicts, detection_power, findings, first_token, kernel_rows, kernel_tests,
                                        observed_vs_expected, pit, power_curves, pvalue_histograms, size_meta_test,
                                        tv_bound_path, tv_bounds)
from specdec_lab.plots.mechanics import (agreement_by_position, block_routes, bug_anatomy, exact_tv,
                                         step_decomposition, three_token_step, tree, typical_heatmap)
from specdec_lab.plots.speed import batch_sweep, roofline, speedup

__all__ = [
    "VERDICT_COLORS", "agreement_by_position", "audit_verdicts", "findings", "batch_sweep", "block_routes", "bug_anatomy",
    "detection_power", "exact_tv", "first_token", "kernel_rows", "kernel_tests", "observed_vs_expected", "pit",
    "power_curves", "pvalue_histograms", "roofline", "save", "size_meta_test", "speedup", "step_decomposition",
    "three_token_step", "token_label", "token_strings", "tree", "tv_bound_path", "tv_bounds", "typical_heatmap",
]
