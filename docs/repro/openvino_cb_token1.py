"""OpenVINO GenAI 2026.4.1.0: ContinuousBatchingPipeline + draft model drafts token 1 in large batches (standalone).

Needs ``openvino-genai==2026.4.1.0``, torch and transformers (for the target's exact token-1 law), and a small Llama
target with a draft of the same vocabulary, both as Hugging Face folders and as OpenVINO IR (default: this
repository's bundled pair, ``specdec_lab/bundled/{target,draft}``, exported with ``optimum-cli export openvino --model
specdec_lab/bundled/target --task text-generation-with-past --weight-format fp32 ir/target`` and the same for the draft).
Run::

    python docs/repro/openvino_cb_token1.py [HF_DIR IR_DIR] [--n N]

N requests (seeds 0..N-1, T = 1, top_k = 20, max_new_tokens = 2, num_assistant_tokens = 4, fp32) go into one
``ContinuousBatchingPipeline.generate`` call, on two prompts: "HAMLET." (the audit's prompt; token 1 is "\\n" with
p = 0.995) and "HAMLET.\\n" (token 1 has a spread law, so the draft and the target disagree often).

What happens (src/cpp/src/speculative_decoding/continuous_batching/{fast_draft_strategy,pipeline_impl}.cpp,
src/cpp/src/sampling/sampler.cpp): the main model's scheduler prefills only ``max_num_batched_tokens`` (256) prompt
tokens per step. For every request it has not prefilled yet, the main pipeline reports an empty generation, and the
draft pipeline's ``update_request`` un-pauses the draft request (only Eagle3 keeps it paused). The draft then prefills
the prompt itself and samples token 1, x ~ q, which the main pipeline receives as a candidate to validate. There,
``validate_candidate`` does *not* use the r <= q/p rule at token 1 (its guard ``generated_len !=
num_tokens_to_validate`` is false): it accepts x iff x equals the target's own sample y ~ p. When x != y, the
sampler ``continue``s and samples token 1 from the *next* position's logits, p(. | prompt, x), so token 1 can be
outside the target's top-20 at token 1. A second path: when the main scheduler then prefills such a
request in two chunks (the one request per step that straddles the 256-token budget), the first chunk's
``finish_iteration`` clears the request's validation count, so x is never validated: it stays as token 1, and the
target's own draw y from the token-1 logits is appended as token 2. The engine's per-request SD metrics (printed to
stdout when ``OPENVINO_LOG_LEVEL`` > 2) count the candidates each request got from the draft: with
max_new_tokens = 2 the draft only ever proposes token 1.

Evidence printed per run: requests drafted at token 1; the draft's candidate x and the target's own first draw y are
read off separate target-only and draft-only pipelines with the same seed (same per-request std::mt19937, first
draw); token 1 outside the target's top-20 at token 1; and, for drafted requests with x != y, whether token 1 lies in
the top-20 of p(. | prompt, x) (the next-position resample) or equals x (then token 2 equals y: the split-prefill
path, not an acceptance by r <= q/p). After the resample, token 2 follows p(. | prompt, x, token id 0), not
p(. | prompt, z): the resample leaves ``max_removed_tokens_per_request`` at 0, so x's KV entry stays and the main
model's next input is read one past the end of ``generated_ids`` (model_runner.hpp), which here held 0.
The same pipeline with ``max_num_batched_tokens`` large enough to prefill every prompt in the first step drafts no
token 1 and gives no such tokens.
"""

import os
import re
import sys
import tempfile

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
import torch
from transformers import AutoModelForCausalLM

argv = sys.argv[1:]
N = int(argv.pop(argv.index("--n") + 1)) if "--n" in argv else 1000
args = [a for a in argv if not a.startswith("--")]
HF, IR = args[:2] if len(args) >= 2 else ("specdec_lab/bundled", "ir")
HAMLET = [40, 33, 45, 44, 37, 52, 14]  # "HAMLET." in the bundled tokenizer
PROMPTS = {'"HAMLET."': HAMLET, '"HAMLET.\\n"': HAMLET + [199]}
TOP_K = 20
PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def pipeline(model, draft=False, max_num_batched_tokens=None):
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    if max_num_batched_tokens:
        scheduler.max_num_batched_tokens = max_num_batched_tokens
    properties = dict(PROPERTIES)
    if draft:
        properties["draft_model"] = ov_genai.draft_model(f"{IR}/draft", "CPU", **PROPERTIES)
    return ov_genai.ContinuousBatchingPipeline(f"{IR}/{model}", scheduler, "CPU", properties)


def generate(pipe, prompt, draft):
    """Token ids of N requests in one generate() call, and (draft) the engine's per-request count of draft tokens."""
    configs = []
    for seed in range(N):
        c = ov_genai.GenerationConfig()
        c.max_new_tokens = c.min_new_tokens = 2
        c.ignore_eos, c.do_sample, c.temperature, c.top_k, c.rng_seed = True, True, 1.0, TOP_K, seed
        if draft:
            c.num_assistant_tokens = 4
        configs.append(c)
    # SpeculativeDecodingImpl::step prints SpeculativeDecodingMetrics per request at the end of generate() when
    # OPENVINO_LOG_LEVEL > WARNING ("Generated tokens by draft model: n"); catch the C++ stdout in a file
    sys.stdout.flush()
    saved, sink = os.dup(1), tempfile.TemporaryFile(mode="w+")
    os.environ["OPENVINO_LOG_LEVEL"] = "4"
    os.dup2(sink.fileno(), 1)
    try:
        results = pipe.generate([ov.Tensor(np.array([prompt], dtype=np.int64))] * N, configs)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        del os.environ["OPENVINO_LOG_LEVEL"]
    sink.seek(0)
    drafted = {int(r): int(n) for r, n in re.findall(
        r"REQUEST_ID: (\d+)\n(?:.*\n){2}Generated tokens by draft model: (\d+)", sink.read())}
    tokens = np.array([r.m_generation_ids[0] for r in results])
    return tokens, np.array([drafted.get(i, -1) for i in range(N)])


target = AutoModelForCausalLM.from_pretrained(f"{HF}/target", dtype=torch.float32)
V = target.config.vocab_size
plain_target, plain_draft = pipeline("target"), pipeline("draft")
speculative = {"default scheduler (max_num_batched_tokens 256)": pipeline("target", draft=True),
               "max_num_batched_tokens = 16N (every prompt in step 1)": pipeline("target", True, 16 * N)}
print(f"openvino_genai {ov_genai.__version__}, N = {N} requests per generate(), T = 1, top_k = {TOP_K}, "
      "max_new_tokens = 2, num_assistant_tokens = 4")
for name, prompt in PROMPTS.items():
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
        following = torch.cat([torch.tensor(prompt).expand(V, -1), torch.arange(V)[:, None]], 1)
        p_next = target(following).logits[:, -1]  # row x: logits of p(. | prompt, x)
    top1 = set(np.argsort(-p1)[:TOP_K].tolist())
    top_next = torch.topk(p_next, TOP_K, -1).indices.numpy()  # row x: top-20 of p(. | prompt, x)
    y = generate(plain_target, prompt, False)[0][:, 0]  # the target's first draw per seed
    x = generate(plain_draft, prompt, False)[0][:, 0]  # the draft's first draw per seed: its token-1 candidate
    plain_off = sum(t not in top1 for t in y)
    print(f"\nprompt {name}: P(top token) = {p1.max():.3f}; plain (no draft): {plain_off} of {N} token-1 outside "
          f"the target's top-{TOP_K}")
    for label, pipe in speculative.items():
        tokens, drafted = generate(pipe, prompt, True)
        t1 = tokens[:, 0]
        is_drafted = drafted > 0
        differ = is_drafted & (x != y)
        off = np.array([t not in top1 for t in t1])
        print(f"  draft model, {label}:")
        print(f"    requests drafted at token 1 (engine's per-request count > 0): {is_drafted.sum()} of {N} "
              f"(first: {np.flatnonzero(is_drafted)[:3].tolist()})")
        print(f"    token 1 outside the target's top-{TOP_K}: {off.sum()} (of them drafted: {(off & is_drafted).sum()})")
        print(f"    token 1 != the plain target's token 1 (same seed): {(t1 != y).sum()} "
              f"(not drafted: {((t1 != y) & ~is_drafted).sum()}; drafted with x == y: "
              f"{((t1 != y) & is_drafted & (x == y)).sum()})")
        if differ.any():
            in_next = np.array([t1[i] in top_next[x[i]] for i in range(N)])
            kept = differ & (t1 == x)
            print(f"    drafted with x != y: {differ.sum()}; token 1 in the top-{TOP_K} of p(. | prompt, x): "
                  f"{(differ & in_next).sum()}; token 1 == x: {kept.sum()} (of them token 2 == y: "
                  f"{(kept & (tokens[:, 1] == y)).sum()}); token 1 == y: {(differ & (t1 == y)).sum()}; "
                  f"outside the top-{TOP_K} at token 1: {(differ & off).sum()}")
            resampled = np.flatnonzero(differ & in_next & (t1 != x))
            with torch.no_grad():  # token 2 after the resample: top-20 of p(. | prompt, z) vs p(. | prompt, x, <id 0>)
                after_z = target(torch.tensor([prompt + [int(t1[i])] for i in resampled])).logits[:, -1]
                after_x0 = target(torch.tensor([prompt + [int(x[i]), 0] for i in resampled])).logits[:, -1]
            in_z = sum(t in row for t, row in zip(tokens[resampled, 1], torch.topk(after_z, TOP_K, -1).indices.numpy()))
            in_x0 = sum(t in row for t, row in zip(tokens[resampled, 1], torch.topk(after_x0, TOP_K, -1).indices.numpy()))
            print(f"    token 2 after the resample (z = token 1; {len(resampled)} requests): in the top-{TOP_K} of "
                  f"p(. | prompt, z): {in_z}; of p(. | prompt, x, token id 0): {in_x0}")
            for i in np.flatnonzero(differ & off)[:3]:
                print(f"      seed {i}: x = {x[i]}, y = {y[i]}, token 1 = {t1[i]} "
                      f"(p(token 1) = {p1[t1[i]]:.2e}, rank {int((p1 > p1[t1[i]]).sum()) + 1} at token 1; "
                      f"in the top-{TOP_K} of p(. | prompt, x): {t1[i] in top_next[x[i]]})")
