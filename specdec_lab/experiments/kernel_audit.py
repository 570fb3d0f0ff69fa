"""Notebook 09, auditing verification kernels: our kernel, the negative controls and vLLM's CPU
rejection sampler through :mod:`specdec_lab.kernels`, with the tables and figures the notebook shows."""

from __future__ import annotations

import pandas as pd

from specdec_lab import plots  # noqa: F401 (for the notebook)
from specdec_lab.experiments.scale import Scale, setup  # noqa: F401 (for the notebook)
from specdec_lab.kernels import vllm as vllm_kernels
from specdec_lab.kernels.contract import KernelSpec
from specdec_lab.kernels.harness import AuditSettings
from specdec_lab.kernels.judge import KernelAudit, audit_kernel
from specdec_lab.kernels.ours import BATCH_FAULTY, FAULTY, LOSSLESS, NOT_AT_KERNEL_LEVEL  # noqa: F401
from specdec_lab.kernels.scenarios import Batch, standard_batch  # noqa: F401 (for the notebook)


def batch_table(batch: Batch, verdict: KernelAudit) -> pd.DataFrame:
    """One line per scenario row: its class, settings, drafts, exact acceptance rates and tokens per call."""
    return pd.DataFrame([{"row": s, "class": row.row_class, "scenario": row.name, "T": row.temperature,
                          "top-k": row.top_k, "top-p": row.top_p, "drafts": row.n_drafts,
                          "β (acceptance) by position": ", ".join(f"{b:.2f}" for b in law.accept),
                          "tokens per call": round(law.tokens_per_call, 2)}
                         for s, (row, law) in enumerate(zip(batch.rows, verdict.laws))]).set_index("row")


def audit(kernel: KernelSpec, batch: Batch, samples: int, seed: int = 0) -> KernelAudit:
    """The verdict on ``kernel`` over ``batch`` at ``samples`` draws per row (Holm at α = 0.001)."""
    return audit_kernel(kernel, batch, AuditSettings(samples=samples, seed=seed))


def control_table(scale: Scale) -> pd.DataFrame:
    """Every kernel-level negative control on the standard batch at the scale's control budget:
    verdict, failing rows, and its description; plus the rule controls that cannot be kernels, and why."""
    batch = standard_batch(scale.kernel_control_vocab, 4)
    rows = []
    for family, controls in (("rule", FAULTY), ("batch", BATCH_FAULTY)):
        for name, spec in controls.items():
            verdict = audit(spec, batch, scale.kernel_control_samples)
            rows.append({"control": name, "family": family, "verdict": verdict.verdict.verdict,
                         "failing rows": list(verdict.failed_rows), "what it does": spec.description})
    rows += [{"control": name, "family": "rule", "verdict": "not a kernel fault", "failing rows": [],
              "what it does": why} for name, why in NOT_AT_KERNEL_LEVEL.items()]
    return pd.DataFrame(rows).set_index("control")


def vllm_audits(scale: Scale) -> dict[str, KernelAudit] | None:
    """vLLM's CPU rejection sampler as shipped (on the rows without top-k, which crash it) and with its
    ``expand_kernel`` patched (every row); None when vLLM's environment is missing."""
    if not vllm_kernels.available():
        return None
    batch = standard_batch(scale.kernel_control_vocab, 4)
    return {"as shipped (no top-k rows)": audit(vllm_kernels.vllm_kernel(), batch.select(lambda r: r.top_k == 0),
                                                scale.kernel_control_samples),
            "as shipped (all rows)": audit(vllm_kernels.vllm_kernel(), batch, scale.kernel_control_samples),
            "expand_kernel patched": audit(vllm_kernels.vllm_kernel(patch_expand=True), batch,
                                           scale.kernel_control_samples)}


def vllm_summary(verdicts: dict[str, KernelAudit] | None, chars: int = 1500) -> str:
    """The reports of :func:`vllm_audits` (each cut at ``chars``), or why they were skipped."""
    if verdicts is None:
        return "SKIPPED: vLLM's environment is missing (run `make vllm`, or set SPECDEC_LAB_VLLM_PYTHON)"
    return "\n\n".join(f"--- {label}\n{verdict.report[:chars]}" for label, verdict in verdicts.items())
