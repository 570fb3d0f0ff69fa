"""Kernel-level audit: a verification kernel in a documented contract, judged at real vocabulary sizes.

- :mod:`~specdec_lab.kernels.contract` — the contract (inputs, output, ragged rows) and its form checks;
- :mod:`~specdec_lab.kernels.scenarios` — row scenarios and the standard heterogeneous batch;
- :mod:`~specdec_lab.kernels.law` — the exact law per row and position, in closed form;
- :mod:`~specdec_lab.kernels.harness` — streaming the kernel's draws into counts;
- :mod:`~specdec_lab.kernels.judge` — the tests, Holm, power and the report (:func:`audit_kernel`);
- :mod:`~specdec_lab.kernels.ours` — our rules and the negative controls as kernels;
- :mod:`~specdec_lab.kernels.hf`, :mod:`~specdec_lab.kernels.vllm` — adapters of engines' kernels.

The pytest helper for engine developers is :func:`specdec_lab.testing.assert_lossless_kernel`.
"""
