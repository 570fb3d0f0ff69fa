"""The report layer: tables, figures and documents of a run (``report.md``, ``results.json``), and the tables
``make docs`` renders into the README and docs from ``results/`` (:mod:`specdec_lab.report.docs`)."""

from specdec_lab.report.figures import plot_first_token, plot_pit, plot_speedup, plot_tv_bounds
from specdec_lab.report.tables import summary_table, to_markdown, verdict_rows, verdict_table

__all__ = ["plot_first_token", "plot_pit", "plot_speedup", "plot_tv_bounds", "summary_table", "to_markdown",
           "verdict_rows", "verdict_table"]
