"""mistral.rs 0.6.0: speculative decoding with a draft model samples nothing — it returns the greedy continuation
at any temperature (standalone reproduction).

Needs ``mistralrs==0.6.0`` (PyPI, CPU wheel for CPython 3.11) and a target/draft pair of Llama folders with
``rope_theta`` at the top level of ``config.json`` (default: the copies of this repository's bundled pair that
``specdec_lab.adapters.mistralrs.bundled_folders()`` writes under ``~/.cache/specdec-lab/mistralrs-*``). Run::

    python docs/repro/mistralrs_speculative_argmax.py [TARGET_DIR DRAFT_DIR]

The same 200 requests at T = 1, without and with the draft model (``which_draft``, ``speculative_gamma`` = 1), and
the speculative runner at T = 0.7 and top-k 20: the plain runner returns many different continuations, the
speculative one the same continuation every time — the plain runner's greedy one. Both pipelines call one sampler
with ``sample_speculative = true`` (speculative.rs:401 for the draft, sampling.rs:497 for the target), and that flag
makes ``Sampler::sample`` (sampler.rs:833) call ``sample_speculative_top_kp_min_p``, which ends in
``argmax_sample_last_dim`` (sampler.rs:561): the draft's and the target's "samples" are both argmaxes of the
filtered law, and the Leviathan acceptance rule the pipeline's doc comment promises (speculative.rs:157–160) is never
run. A further gamma >= 2 finishes no request: the runner's engine thread panics after the draft's position passes
its RoPE table (max_position_embeddings), and ``speculative_gamma`` defaults to 32.
"""

import collections
import glob
import os
import sys

import mistralrs as mr

if len(sys.argv) == 3:
    TARGET, DRAFT = sys.argv[1:]
else:
    root = sorted(glob.glob(os.path.expanduser("~/.cache/specdec-lab/mistralrs-*-0.6.0")))[-1]
    TARGET, DRAFT = f"{root}/target", f"{root}/draft"
TEMPLATE = f"{TARGET}/chat_template.jinja"  # "{% for message in messages %}{{ message['content'] }}{% endfor %}"
N = 200


def plain(folder):
    return mr.Which.Plain(model_id=folder, arch=mr.Architecture.Llama, tokenizer_json=f"{folder}/tokenizer.json",
                          dtype=mr.ModelDType.F32)


def continuations(runner, **sampling):
    counts = collections.Counter()
    for _ in range(N):
        response = runner.send_chat_completion_request(mr.ChatCompletionRequest(
            messages=[{"role": "user", "content": "HAMLET."}], model="m", max_tokens=2, **sampling))
        counts[response.choices[0].message.content] += 1
    return counts


base = mr.Runner(which=plain(TARGET), token_source="none", max_seqs=1, jinja_explicit=TEMPLATE)
speculative = mr.Runner(which=plain(TARGET), token_source="none", max_seqs=1, jinja_explicit=TEMPLATE,
                        which_draft=plain(DRAFT), speculative_gamma=1)
greedy = continuations(base, temperature=0.0).most_common(1)[0][0]
for name, runner, sampling in (("plain T=1", base, {"temperature": 1.0}),
                               ("draft model T=1", speculative, {"temperature": 1.0}),
                               ("draft model T=0.7", speculative, {"temperature": 0.7}),
                               ("draft model top-k 20", speculative, {"temperature": 1.0, "top_k": 20})):
    counts = continuations(runner, **sampling)
    print(f"{name:22s} {len(counts):3d} distinct continuations of {N}; the greedy one {counts[greedy]} times; "
          f"most common {counts.most_common(3)}")
