"""mlx-lm 0.32.2: with a draft model, the repetition penalty (and the presence/frequency penalties) see only the
prompt's last token, not the prompt (standalone reproduction).

Needs ``mlx[cpu]==0.32.4`` and ``mlx-lm==0.32.2`` (``make mlx``) and this repository's bundled pair, which
``mlx_lm.load`` reads as it is. Run from the repository root::

    .venv-mlx/bin/python docs/repro/mlx_lm_speculative_repetition_penalty.py [TARGET_DIR DRAFT_DIR]

``make_logits_processors(repetition_penalty=1.3)`` penalises the tokens among the last 20 of the context.
``generate_step`` feeds the prompt to its processors (its prefill loop adds the prompt's tokens to ``tokens``), but
``speculative_generate_step``'s ``_prefill`` never touches ``prev_tokens``, so its first ``_step`` — the draft's
and the target's verification alike — starts the processors' context at the prompt's *last* token. Part 1 records
the context the processor is handed for token 1 on both paths; part 2 counts how often token 2 repeats one of the
prompt's earlier tokens: the plain path penalises them, the speculative path does not.
"""

import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.sample_utils import make_logits_processors, make_sampler

TARGET, DRAFT = sys.argv[1:3] if len(sys.argv) > 2 else ("specdec_lab/bundled/target", "specdec_lab/bundled/draft")
PROMPT = [40, 33, 45, 44, 37, 52, 14]  # "HAMLET." in the bundled tokenizer
N = 1000

target, _ = load(TARGET)
draft, _ = load(DRAFT)
prompt = mx.array(PROMPT, dtype=mx.uint32)
sampler = make_sampler(temp=1.0)
penalty = make_logits_processors(repetition_penalty=1.3)


def spy(seen):
    def processor(tokens, logits):
        seen.append(tokens.tolist())
        return logits
    return processor


plain_seen, spec_seen = [], []
list(generate_step(prompt, target, max_tokens=1, sampler=sampler, logits_processors=[spy(plain_seen)]))
list(speculative_generate_step(prompt, target, draft, num_draft_tokens=4, max_tokens=1, sampler=sampler,
                               logits_processors=[spy(spec_seen)]))
print(f"context the processors see for token 1, generate_step:             {plain_seen[0]}")
# speculative: the draft's step for token 1, then the target's verification pass (token 1, token 2)
print(f"context the processors see for token 1, speculative_generate_step: {spec_seen[0]} (draft), "
      f"{spec_seen[1]} (target)")

earlier = set(PROMPT[:-1])  # penalised on the plain path only
for name in ("generate_step", "speculative_generate_step"):
    repeats = 0
    for seed in range(N):
        mx.random.seed(seed)
        if name == "generate_step":
            steps = generate_step(prompt, target, max_tokens=2, sampler=sampler, logits_processors=penalty)
        else:
            steps = speculative_generate_step(prompt, target, draft, num_draft_tokens=4, max_tokens=2,
                                              sampler=sampler, logits_processors=penalty)
        tokens = [int(step[0]) for step in steps]
        repeats += tokens[1] in earlier
    print(f"{name}: token 2 repeats one of the prompt's earlier tokens in {repeats} of {N} samples")
