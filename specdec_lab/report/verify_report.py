"""The documents of a ``verify`` run: ``report.md``, ``summary.csv``, ``tests.csv``, the figures and
``results.json`` (one :class:`~specdec_lab.verdicts.Verdict` record per sampler, with the run's provenance)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specdec_lab import results, verdicts
from specdec_lab.report.tables import to_markdown, verdict_rows


@dataclass(frozen=True)
class RunFacts:
    """What the report states about the run besides its tables."""

    prompt: str
    medusa_prompt: str
    k: int
    seed: int
    scale: str
    tolerance: float
    joint_tolerance: float | None
    assurance: float
    planned: bool  # lossless rows' m planned from the exact laws
    window: str  # the tokens each row draws, in words
    workers: int
    seconds: float


def write_verify_documents(folder: Path, summary: pd.DataFrame, table: pd.DataFrame, facts: RunFacts, pair,
                           row_details: dict) -> tuple[list[verdicts.Verdict], int]:
    """Write ``report.md``, ``summary.csv``, ``tests.csv`` and ``results.json`` into ``folder``; return the rows
    and the run's exit status (:func:`specdec_lab.verdicts.expectation_status`)."""
    rows = verdict_rows(summary, facts.tolerance, row_details)
    status = verdicts.expectation_status(rows)
    (folder / "report.md").write_text(markdown(summary, table, facts, pair, status))
    summary.to_csv(folder / "summary.csv", index=False)
    table.to_csv(folder / "tests.csv", index=False)
    settings = {"scale": facts.scale, "prompt": facts.prompt, "medusa_prompt": facts.medusa_prompt, "k": facts.k,
                "seed": facts.seed, "tolerance": facts.tolerance, "joint_tolerance": facts.joint_tolerance,
                "alpha": 0.01, "confidence": 0.99, "assurance": facts.assurance, "planned": facts.planned,
                "window": facts.window, "workers": facts.workers}
    doc = results.document("verify", rows, settings=settings, models=results.model_identity(pair),
                           exit_status=status, extra={"seconds": round(facts.seconds, 1)})
    results.write(folder / "results.json", doc)
    return rows, status


def overall_line(status: int) -> str:
    """The run's one-line outcome."""
    return {0: "PASS: every lossless sampler equivalent, every negative control rejected",
            3: "INCONCLUSIVE: no wrong call, but some lossless sampler is only inconclusive (more samples needed)",
            1: "FAIL: some verdict is not the expected one (see the 'correct call' column)"}[status]


def markdown(summary: pd.DataFrame, table: pd.DataFrame, facts: RunFacts, pair, status: int) -> str:
    identity = pair.identity
    tolerances = (f"ε = {facts.tolerance:g} on the first token"
                  + (f" and {facts.joint_tolerance:g} on the first two tokens' joint law" if facts.joint_tolerance
                     else " (the joint two-token bound is reported)"))
    planned = (f"Lossless rows' m planned from the exact laws (bounds within tolerance with probability "
               f"{facts.assurance:g}). " if facts.planned else "")
    lines = [
        "# specdec-lab verify",
        "",
        f"Models: `{identity.get('pair')}` (target sha256 `{identity.get('target_sha256', '')[:16]}…`, "
        f"draft sha256 `{identity.get('draft_sha256', '')[:16]}…`), vocabulary {pair.vocab_size}.",
        f"Prompt {facts.prompt!r} (Medusa rows: {facts.medusa_prompt!r}), {facts.window}, K = {facts.k}, "
        f"seed {facts.seed}, scale `{facts.scale}`, {tolerances}, α = 0.01 per sampler (Holm across its tests). "
        f"{planned}Wall time {facts.seconds / 60:.1f} min, {facts.workers} worker process(es).",
        "",
        f"**Overall: {overall_line(status)}** — every lossless sampler must be *equivalent*, "
        "every negative control *rejected*.",
        "",
        *[f"**Window warning** — {row['sampler']}: {row['window']}" for _, row in summary.iterrows()
          if row.get("window")],
        "",
        "## Summary",
        "",
        to_markdown(summary),
        "",
        "## Every test",
        "",
        to_markdown(table),
        "",
        "![TV bounds](tv_bounds.png)",
        "![first token](first_token.png)",
        "![PIT](pit.png)",
        "",
    ]
    return "\n".join(lines)


def window_words(fixed: int | None) -> str:
    """The tokens each row draws, in words (``fixed``: one L for every row)."""
    if fixed:
        return f"L = {fixed} new tokens per row"
    return ("L = K + 2 new tokens per speculative row (every draft position, the bonus token and the next "
            "block's first token), tree depth + 2 per Medusa row, 2 per naive row")
