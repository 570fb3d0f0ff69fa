"""Exact laws, computed by enumeration on the real models — no sampling: the one home of every exact law.

- :mod:`specdec_lab.laws.target` — the target's law p after a prompt: token 1, and tokens 1–2 jointly;
- :mod:`specdec_lab.laws.samplers` — the output law of each verification rule (speculative sampling, its
  faulty variants, Medusa trees) over the first L tokens: the proof, checked by numbers;
- :mod:`specdec_lab.laws.block` — block verification's law, enumerated block by block, and its exact tokens per
  pass beside the token-wise rule's;
- :mod:`specdec_lab.laws.workload` — a workload cell's law of tokens 1–2 under its whole sampler chain
  (penalties, min-p, the engine's order) and the client-visible outcomes of text cells.

The names below are the public ones; import them from here.
"""

from specdec_lab.laws.samplers import (LogitsAt, SequenceLaw, cached_logits_at, first_token_law, first_token_logits,
                                      first_token_rule_law, markov_logits_at, medusa_first_token_law, medusa_tree_at,
                                      model_logits_at, sequence_law, step_law, step_parts, tree_first_token_law, tv,
                                      tv_typical, typical_first_token_law)
from specdec_lab.laws.samplers import __all__ as _samplers_all
from specdec_lab.laws.block import (BlockOutcomes, BlockTree, block_first_token_parts, block_outcomes,
                                   block_sequence_law, block_tree, tokens_per_pass)
from specdec_lab.laws.target import TwoTokenLaw, pair_law, two_token_law, two_token_logits
from specdec_lab.laws.workload import LawBook, stop_outcome

__all__ = [*_samplers_all, "BlockOutcomes", "BlockTree", "block_first_token_parts", "block_outcomes",
           "block_sequence_law", "block_tree", "tokens_per_pass", "LawBook", "TwoTokenLaw", "pair_law", "stop_outcome",
           "two_token_law", "two_token_logits"]
