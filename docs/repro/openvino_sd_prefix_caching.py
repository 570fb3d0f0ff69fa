"""OpenVINO GenAI 2026.4.1.0: sampled speculative decoding in LLMPipeline (standalone reproduction).

Needs only ``pip install openvino-genai==2026.4.1.0`` and a small Llama target with a draft model of the same
vocabulary in OpenVINO IR (default: this repository's bundled pair, exported by
``optimum-cli export openvino --model specdec_lab/bundled/target --task text-generation-with-past --weight-format fp32 ir/target``
and the same for ``specdec_lab/bundled/draft`` into ``ir/draft``; any pair works). Run::

    python docs/repro/openvino_sd_prefix_caching.py [IR_DIR]

1. With LLMPipeline's default scheduler (prefix caching on), sampled requests (``do_sample``, one per seed) raise
   ``Check 'content_length <= prompt_ids.size() + m_generated_ids.size()' failed at src/cpp/src/sequence_group.cpp:32``
   (``Sequence::_make_hash``, the prefix-cache block hash), and from then on the same pipeline never accepts a
   draft token again (``get_num_accepted_tokens() == 0``), greedy requests included.
2. The same requests on a pipeline with ``enable_prefix_caching = False`` raise nothing and keep accepting.
3. The same pipeline without a draft model (plain sampling) raises nothing.
"""

import sys

import numpy as np
import openvino as ov
import openvino_genai as ov_genai

IR = sys.argv[1] if len(sys.argv) > 1 else "ir"
PROMPT = ov.Tensor(np.array([[40, 33, 45, 44, 37, 52, 14]], dtype=np.int64))  # "HAMLET." in the bundled tokenizer


def config(seed, sample, draft=True):
    c = ov_genai.GenerationConfig()
    c.max_new_tokens = c.min_new_tokens = 8
    c.ignore_eos = True
    if draft:
        c.num_assistant_tokens = 4
    if sample:
        c.do_sample, c.temperature, c.rng_seed = True, 1.0, seed
    return c


def pipeline(prefix_caching, draft=True):
    kwargs = {}
    if draft:
        kwargs["draft_model"] = ov_genai.draft_model(f"{IR}/draft", "CPU")
    if prefix_caching is not None:
        scheduler = ov_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = prefix_caching
        kwargs["scheduler_config"] = scheduler
    return ov_genai.LLMPipeline(f"{IR}/target", "CPU", **kwargs)


def run(pipe, sample, draft=True, n=12):
    accepted, errors = [], []
    for seed in range(n):
        try:
            result = pipe.generate(PROMPT, config(seed, sample, draft))
            metrics = result.extended_perf_metrics
            accepted.append(metrics.get_num_accepted_tokens() if metrics is not None else "-")
        except RuntimeError as exc:
            accepted.append("raised")
            errors.append(str(exc).strip().splitlines()[0])
    return accepted, errors


for prefix_caching in (None, False):
    pipe = pipeline(prefix_caching)
    label = "default (prefix caching on)" if prefix_caching is None else "prefix caching off"
    for phase, sample in (("greedy", False), ("sampled T=1", True), ("greedy again", False)):
        accepted, errors = run(pipe, sample)
        print(f"{label:28s} {phase:13s} accepted per request: {accepted}")
        for message in sorted(set(errors)):
            print(f"{'':42s}raised: {message}")
accepted, errors = run(pipeline(None, draft=False), True, draft=False, n=200)
print(f"{'no draft model (plain)':28s} {'sampled T=1':13s} {len(errors)} of 200 requests raised")
