"""ONNX Runtime GenAI 0.18.0: top-p keeps tokens outside the nucleus when the vocabulary has more than 64 tokens
(standalone reproduction; no speculation involved).

Needs ``onnxruntime-genai==0.18.0`` and a model converted by its builder (default: this repository's bundled target,
``python -m onnxruntime_genai.models.builder -m specdec_lab/bundled/target -i specdec_lab/bundled/target -o ort/target -p fp32 -e cpu``).
Run::

    python docs/repro/ortgenai_top_p_nucleus.py [MODEL_DIR]

After "HAMLET." the target gives "\\n" probability 0.995 (T = 1), so the top-p 0.9 nucleus — "the most probable
tokens with probabilities that add up to top_p or higher" (``search.top_p`` in ONNX Runtime GenAI's config) — is
{"\\n"} alone, and top-p 0.9 sampling must return "\\n" every time. ONNX Runtime GenAI also returns the second token
(p = 0.0037) about 0.4% of the time: ``FindNucleus`` (src/sampling_distribution.h) stops where the kept mass reaches
p x (kept mass + an *upper bound* on the rest, (V - i - 1) x the current token's weight), so it keeps a superset of
the nucleus; the exact cumulative cutoff that follows runs only for vocabularies of at most 64 tokens.
"""

import collections
import sys

import onnxruntime_genai as og

MODEL = sys.argv[1] if len(sys.argv) > 1 else "ort/target"
PROMPT = [40, 33, 45, 44, 37, 52, 14]  # "HAMLET." in the bundled tokenizer
NEWLINE, N = 199, 3000

model = og.Model(MODEL)
counts = collections.Counter()
for seed in range(N):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 1, min_length=len(PROMPT) + 1, do_sample=True,
                              temperature=1.0, top_k=0, top_p=0.9, random_seed=seed)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    while not generator.is_done():
        generator.generate_next_token()
    counts[int(generator.get_sequence(0)[-1])] += 1
outside = N - counts[NEWLINE]
print(f"top-p 0.9, {N} samples of token 1: {dict(counts.most_common())}")
print(f"outside the nucleus {{'\\n'}}: {outside} ({outside / N:.2%}); exact top-p sampling gives 0")
