"""OpenVINO GenAI 2026.4.1.0: sampled speculative decoding with a draft model samples a wrong law (standalone).

Needs ``openvino-genai==2026.4.1.0``, torch and transformers (to compute the exact laws), and a small Llama target
with a draft of the same vocabulary, both as Hugging Face folders and as OpenVINO IR (default: this repository's
bundled pair, ``specdec_lab/bundled/{target,draft}``, exported with ``optimum-cli export openvino --model specdec_lab/bundled/target
--task text-generation-with-past --weight-format fp32 ir/target`` and the same for the draft). Run::

    python docs/repro/openvino_sd_sampled_law.py [HF_DIR IR_DIR]

It draws N = 4000 continuations of 3 tokens of "HAMLET." at T = 1 with ``LLMPipeline`` + ``draft_model``
(``num_assistant_tokens`` 4; prefix caching off, which avoids the separate crash of
openvino_sd_prefix_caching.py; fp32 inference and KV cache), keeps those whose token 1 is "\\n" (p = 0.995), and
tests the law of token 2 — the first drafted position — with a G-test against:

1. the target's exact law p (what speculative decoding must give): rejected;
2. the law that ``Sampler::validate_candidate`` and ``Sampler::sample_from_sequence_group``
   (src/cpp/src/sampling/sampler.cpp) implement: the draft's candidate x ~ q is accepted iff r <= q(x) / p(y), where
   y ~ p is the target's own fresh sample at that position and r takes the 101 values 0, 0.01, ..., 1
   (``std::uniform_int_distribution<>(0, 100)`` / 100); after a rejection the loop ``continue``s to the next
   iteration, which samples from the *next* position's logits, p(. | token 1, x), and that sample becomes token 2.
   Not rejected; its acceptance matches the engine's own count.

The same pipeline without a draft model passes test 1 (``--plain``).
"""

import sys

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

args = [a for a in sys.argv[1:] if not a.startswith("--")]
HF, IR = (args + ["specdec_lab/bundled", "ir"])[:2] if len(args) < 2 else args[:2]
PLAIN = "--plain" in sys.argv
PROMPT = [40, 33, 45, 44, 37, 52, 14]  # "HAMLET." in the bundled tokenizer
NEWLINE, N = 199, 4000

properties = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
scheduler = ov_genai.SchedulerConfig()
scheduler.enable_prefix_caching = False
kwargs = dict(properties, scheduler_config=scheduler)
if not PLAIN:
    kwargs["draft_model"] = ov_genai.draft_model(f"{IR}/draft", "CPU", **properties)
pipe = ov_genai.LLMPipeline(f"{IR}/target", "CPU", **kwargs)
second, accepted = [], 0
for seed in range(N):
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = 3
    config.ignore_eos, config.do_sample, config.temperature, config.top_k, config.rng_seed = True, True, 1.0, 0, seed
    if not PLAIN:
        config.num_assistant_tokens = 4
    result = pipe.generate(ov.Tensor(np.array([PROMPT], dtype=np.int64)), config)
    if not PLAIN:
        accepted += result.extended_perf_metrics.get_num_accepted_tokens()
    if result.tokens[0][0] == NEWLINE:
        second.append(result.tokens[0][1])

target = AutoModelForCausalLM.from_pretrained(f"{HF}/target", dtype=torch.float32)
draft = AutoModelForCausalLM.from_pretrained(f"{HF}/draft", dtype=torch.float32)
context = torch.tensor(PROMPT + [NEWLINE])
with torch.no_grad():
    V = target.config.vocab_size
    p = torch.softmax(target(context[None]).logits[0, -1].double(), -1).numpy()
    q = torch.softmax(draft(context[None]).logits[0, -1].double(), -1).numpy()
    following = torch.cat([context.expand(V, -1), torch.arange(V)[:, None]], 1)
    p_next = torch.softmax(target(following).logits[:, -1].double(), -1).numpy()  # row x: p(. | "\n", x)

counts = np.bincount(second, minlength=V)
r_at_most = lambda c: np.clip((np.floor(100 * np.minimum(c, 1.0)) + 1) / 101, 0, 1)  # P(r <= c), r in {0, .01, .., 1}
accept = np.array([(p * r_at_most(q[x] / p)).sum() for x in range(V)])  # E_y~p P(r <= q(x)/p(y))
implemented = q * accept + (q * (1 - accept)) @ p_next


def g_test(law):
    expected = law * counts.sum()
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    return stats.power_divergence(observed, np.append(expected[big], expected[~big].sum()),
                                  lambda_="log-likelihood").pvalue


print(f"{'plain sampling' if PLAIN else 'draft model K=4'}: {len(second)} of {N} samples have token 1 = newline")
print(f"law of token 2 vs the target's exact law p:        G-test p = {g_test(p):.3g}")
if not PLAIN:
    print(f"law of token 2 vs the law sampler.cpp implements:  G-test p = {g_test(implemented):.3g}")
    print(f"acceptance at token 2: engine {accepted / N:.3f}, implemented rule {(q * accept).sum():.3f}, "
          f"exact speculative sampling sum min(p, q) = {np.minimum(p, q).sum():.3f}")
