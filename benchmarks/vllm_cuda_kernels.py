"""Audit vLLM's rejection sampler on a GPU machine: its Triton kernels and, with ``--flashinfer``, FlashInfer's
sampler for the bonus tokens. Ready to run where a GPU and a CUDA build of vLLM exist; never run in CI.

    SPECDEC_LAB_VLLM_PYTHON=/path/to/cuda-vllm-venv/bin/python \\
        PYTHONPATH=$PWD .venv/bin/python benchmarks/vllm_cuda_kernels.py [--flashinfer] [--vocab 128256] [--samples 4000]

The kernel runs in a worker process of that vLLM environment (``specdec_lab.adapters.vllm_worker``'s
``rejection_kernel`` job with ``device="cuda"``: no CPU overrides, so ``expand_batch_to_tokens``,
``rejection_random_sample_kernel`` and ``sample_recovered_tokens_kernel`` are vLLM's Triton kernels); the
harness, the exact laws and the tests run here. ``--flashinfer`` sets ``VLLM_USE_FLASHINFER_SAMPLER=1`` for
the worker, which routes the bonus tokens' top-k/top-p sampling through FlashInfer. Prints each verdict's
report; exit status 1 when the kernel is rejected.
"""

from __future__ import annotations

import argparse
import os
import sys

from specdec_lab.kernels.harness import AuditSettings
from specdec_lab.kernels.judge import audit_kernel
from specdec_lab.kernels.scenarios import standard_batch
from specdec_lab.kernels.vllm import available, vllm_kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/vllm_cuda_kernels.py", description=__doc__.splitlines()[0])
    parser.add_argument("--flashinfer", action="store_true", help="VLLM_USE_FLASHINFER_SAMPLER=1 in the worker")
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--samples", type=int, default=4_000)
    args = parser.parse_args(argv)
    if not available():
        print("no vLLM environment: set SPECDEC_LAB_VLLM_PYTHON to a CUDA build of vLLM's python", file=sys.stderr)
        return 2
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "1" if args.flashinfer else "0"  # the worker inherits it
    verdict = audit_kernel(vllm_kernel(device="cuda"), standard_batch(args.vocab, 4),
                           AuditSettings(samples=args.samples))
    print(f"vLLM on CUDA ({'FlashInfer' if args.flashinfer else 'Triton/PyTorch'} sampler for bonus tokens), "
          f"V = {args.vocab:,}, {verdict.samples_per_second:.0f} row-draws/s")
    print(verdict.report)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
