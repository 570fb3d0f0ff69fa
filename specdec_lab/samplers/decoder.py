"""One model's KV cache over B independent chains whose lengths may differ (ragged batches).

Every chain shares one physical cache of S slots; a boolean ``valid`` mask (B, S) says which slots
belong to the chain's text. Rejected draft tokens stay in the cache as invalid slots, hidden from
attention by the mask, and each chain's RoPE positions count only its valid slots, so a chain sees
exactly the context it would see alone.
"""

from __future__ import annotations

import torch


class Decoder:
    """Feed tokens to ``model`` for B chains and return next-token logits in float64."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, batch: int, device: torch.device):
        from transformers import DynamicCache

        self.model, self.vocab_size, self.device = model, vocab_size, device
        self.cache = DynamicCache()
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # (B, S)
        self.passes = 0  # decoding forwards (the prompt prefill is not counted)

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(dim=1)  # (B,)

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Append tokens (B, T) (slots with keep=False are padding) -> logits (B, T, V) float64."""
        B, T = tokens.shape
        if keep is None:
            keep = torch.ones(B, T, dtype=torch.bool, device=self.device)
        positions = self.lengths[:, None] + torch.cumsum(keep, dim=1) - keep.long()  # (B, T)
        mask = torch.cat([self.valid, keep], dim=1)  # (B, S + T)
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                         cache=self.cache, use_cache=True)
        self.cache = out.cache
        self.valid = mask
        self.passes += 1
        return out.logits[..., : self.vocab_size].double()  # (B, T, V)

    def discard(self, drop: torch.Tensor) -> None:
        """Mark the last T slots' entries with drop=True (B, T) as no longer part of their chains."""
        T = drop.shape[1]
        if T > 0:
            self.valid[:, -T:] &= ~drop

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the chains at ``rows`` (B',): finished chains leave the batch."""
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]

    def prefill(self, prompt: torch.Tensor) -> None:
        """Feed prompt (P,) once and share its cache across all B chains."""
        from transformers import DynamicCache

        B = self.valid.shape[0]
        if prompt.numel() == 0:
            return
        with torch.no_grad():
            out = self.model(input_ids=prompt[None].to(self.device), cache=DynamicCache(), use_cache=True)
        self.cache = out.cache
        self.cache.batch_repeat_interleave(B)
        self.valid = torch.ones(B, prompt.numel(), dtype=torch.bool, device=self.device)
