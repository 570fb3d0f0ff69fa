"""Reference samplers.

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"):
**p is the target** model's next-token law and **q is the draft**'s, both after the same
:func:`specdec_lab.sampling.to_probs` (temperature, top-k, top-p).

- :mod:`.naive` — plain autoregressive sampling from p, batched over chains.
- :mod:`.speculative` — draft proposes K tokens, one target pass verifies them.
- :mod:`.rules` — the verification rules (lossless ones and the pieces faulty ones replace).
- :mod:`.faulty` — deliberately wrong variants: negative controls the statistics must catch.
"""
