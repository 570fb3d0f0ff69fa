"""Training the bundled models and heads (jobs run by ``make train``).

- :mod:`~specdec_lab.training.base` — the tokenizer, target and draft (``python -m specdec_lab.training.base``),
  and what the head trainers share (corpus, windows, optimiser, schedule, manifest entries);
- :mod:`~specdec_lab.training.medusa` — Medusa heads on the frozen target;
- :mod:`~specdec_lab.training.eagle` — an EAGLE head, in vLLM's layout;
- :mod:`~specdec_lab.training.eagle3` — an EAGLE-3 head, in vLLM's layout.

The bundled files stay under ``specdec_lab/bundled`` (its head folders ``eagle`` and ``eagle3``); nothing here names a model
directory after a method, since vLLM infers a speculative method from substrings of the draft's path.
"""
