"""Helpers for engine developers' test suites.

>>> from specdec_lab.testing import assert_lossless_kernel
>>> from specdec_lab.kernels.ours import LOSSLESS
>>> verdict = assert_lossless_kernel(LOSSLESS, samples=300, vocab_size=2000)
>>> verdict.passed
True
"""

from __future__ import annotations

from specdec_lab.kernels.contract import Kernel, KernelSpec
from specdec_lab.kernels.harness import AuditSettings
from specdec_lab.kernels.judge import KernelAudit, audit_kernel
from specdec_lab.kernels.scenarios import Batch, standard_batch


def assert_lossless_kernel(kernel: Kernel | KernelSpec, *, samples: int = 2_000, seed: int = 0,
                           scenarios: Batch | None = None, vocab_size: int = 32_000, k: int = 4,
                           alpha: float = 1e-3) -> KernelAudit:
    """Fail (``AssertionError`` with a readable report) unless ``kernel`` emits exactly the target law.

    Parameters
    ----------
    kernel : callable or KernelSpec
        A verification kernel in the contract of :mod:`specdec_lab.kernels.contract`; wrap it in a
        ``KernelSpec(name, fn, ragged=False, greedy=False)`` when it takes no ragged or greedy rows.
    samples : int
        Draws per scenario row (its position 0; later positions get the draws that reach them).
    seed : int
        Seeds the kernel's ``torch.Generator``, the drafts, and the tests' randomization.
    scenarios : Batch, optional
        The rows to run; default :func:`~specdec_lab.kernels.scenarios.standard_batch` at ``vocab_size``
        and ``k`` (10 heterogeneous rows: per-row T, top-k, top-p, greedy, zero-draft, ragged, disjoint
        supports, q = 0 beside the drafts, ties, a point-mass draft).
    alpha : float
        Family-wise error of the whole audit (Holm over every test).

    Returns
    -------
    KernelAudit
        When the kernel passes: its tests, per-class TV bounds and the audit's power.

    Raises
    ------
    AssertionError
        With the report: which rows and positions failed, observed against exact mass on the worst
        tokens, the kernel's form errors, or dependent rows; and the audit's power.

    Notes
    -----
    Power: the report states the smallest TV at position 0 of any row that the audit detects with
    probability ≥ 0.99 at this budget (worst-case noncentral χ², :mod:`specdec_lab.kernels.judge`).
    At the default 2,000 draws per row and V = 32,000 that is a TV of 0.11; the size is ``alpha``.
    """
    batch = scenarios if scenarios is not None else standard_batch(vocab_size, k, seed)
    verdict = audit_kernel(kernel, batch, AuditSettings(samples=samples, seed=seed, alpha=alpha))
    if not verdict.passed:
        raise AssertionError(verdict.report)
    return verdict
