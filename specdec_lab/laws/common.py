"""What the exact-law modules share: the ``logits_at`` callback type, a sequence law beside its target, TV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Total variation ½ Σ |a − b| over the last axis."""
    return 0.5 * (a - b).abs().sum(dim=-1)


LogitsAt = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class SequenceLaw:
    law: torch.Tensor  # (V,)*L joint law of the first L emitted tokens
    target: torch.Tensor  # (V,)*L the target's own joint law, the chain rule of p

    @property
    def tv(self) -> float:
        return float(0.5 * (self.law - self.target).abs().sum())

    @property
    def max_abs_error(self) -> float:
        return float((self.law - self.target).abs().max())
