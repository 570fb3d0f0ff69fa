"""The target's exact law after a prompt: the first token, and the first two tokens jointly.

p is the target (:mod:`specdec_lab.samplers`): one batched forward of V chains — the prompt followed by each
candidate first token — gives p(x1 | prompt) and p(x2 | prompt, x1) for every x1, in float64, under a
:class:`~specdec_lab.sampling.SamplingConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec_lab.sampling import SamplingConfig, to_probs
from specdec_lab.samplers.decoder import Decoder


@dataclass
class TwoTokenLaw:
    """The target's exact law of the first two tokens after a prompt, and the target's cache after
    each (prompt, first token): where every longer scoring forward starts."""

    first: np.ndarray  # (V,) p(x1 | prompt)
    cond: np.ndarray  # (V, V) row x1: p(x2 | prompt, x1)
    decoder: Decoder  # V chains, chain x1 holding the prompt and x1

    @property
    def joint(self) -> np.ndarray:
        """(V * V,) the joint law, cell x1 * V + x2."""
        return (self.first[:, None] * self.cond).reshape(-1)


@torch.no_grad()
def two_token_logits(pair, prompt_ids: torch.Tensor, model=None) -> tuple[torch.Tensor, Decoder]:
    """The target's (or ``model``'s, e.g. the draft's) logits (V, 2, V) float64 after the prompt (row x1, position
    0: after the prompt; position 1: after the prompt and x1), from one forward of V chains, and the decoder holding
    them."""
    V = pair.vocab_size
    decoder = Decoder(pair.target if model is None else model, V, V, pair.device)
    decoder.prefill(prompt_ids[:-1])
    inputs = torch.stack([prompt_ids[-1:].to(pair.device).expand(V), torch.arange(V, device=pair.device)], 1)
    return decoder.feed(inputs), decoder


@torch.no_grad()
def two_token_law(pair, prompt_ids: torch.Tensor, sampling: SamplingConfig) -> TwoTokenLaw:
    """One forward of V chains, each the prompt followed by one candidate first token."""
    logits, decoder = two_token_logits(pair, prompt_ids)
    p = to_probs(logits, sampling).double().cpu()  # (V, 2, V)
    return TwoTokenLaw(p[0, 0].numpy(), p[:, 1].numpy(), decoder)


def pair_law(pair, prompt_ids: torch.Tensor, sampling: SamplingConfig) -> np.ndarray:
    """Exact joint law (V * V,) of the first two tokens after the prompt, cell x1 * V + x2."""
    return two_token_law(pair, prompt_ids, sampling).joint
