"""One model's KV cache over B independent chains whose lengths may differ (ragged batches).

Every chain shares one physical cache of S slots; a boolean ``valid`` mask (B, S) says which slots
belong to the chain's text. Rejected draft tokens stay in the cache as invalid slots, hidden from
attention by the mask, and each chain's RoPE positions count only its valid slots, so a chain sees
exactly the context it would see alone.

The cache is a :class:`SlotCache`: per-layer buffers written in place. transformers' DynamicCache
concatenates on every forward, which copies every chain's whole cache each step — after a 122-token
prompt, 1,024 chains of the bundled target move ≈ 1 GB per step that way, and the samplers ran at
8% of the matmul peak. Each forward gets an explicit 4-D additive mask (B, 1, T, S + T), so the
model never asks the cache for lengths or offsets: its attention layers only call ``update``.
"""

from __future__ import annotations

import torch

HEADROOM = 16  # spare slots at allocation; a full buffer grows by max(HEADROOM, a quarter)


class SlotCache:
    """Keys and values of every layer, (B, H, capacity, D) each; slots [0, length) are filled."""

    def __init__(self, config, batch: int, capacity: int, dtype: torch.dtype, device: torch.device):
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, heads, capacity, dim)
        # uninitialised: attention only ever reads slots [0, length), all written
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more slots (copies only when the buffers must grow)."""
        need = self.length + extra
        if need > self.capacity:
            capacity = need + max(HEADROOM, need // 4)
            self.keys = [_moved(k, capacity, self.length) for k in self.keys]
            self.values = [_moved(v, capacity, self.length) for v in self.values]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer: write the new (B, H, T, D) slots, return all (B, H, S + T, D)."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length:end] = key_states
        self.values[layer_idx][:, :, self.length:end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps

    def get_seq_length(self) -> int:
        """Filled slots (transformers' Cache name, so code that inspects caches reads both kinds)."""
        return self.length

    def select(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]

    def repeat(self, batch: int) -> None:
        """Copy a one-chain cache (1, H, capacity, D) to ``batch`` chains (the filled slots only)."""
        self.keys = [_moved(k, k.shape[2], self.length, batch) for k in self.keys]
        self.values = [_moved(v, v.shape[2], self.length, batch) for v in self.values]


def _moved(buffer: torch.Tensor, capacity: int, filled: int, batch: int | None = None) -> torch.Tensor:
    """A new (batch, H, capacity, D) buffer holding ``buffer``'s first ``filled`` slots (broadcast
    from one chain when ``batch`` is given)."""
    B, H, _, D = buffer.shape
    out = torch.empty(batch or B, H, capacity, D, dtype=buffer.dtype, device=buffer.device)
    out[:, :, :filled] = buffer[:, :, :filled]
    return out


def attention_window(config) -> int | None:
    """The sliding window of a model with sliding-window layers; None when every layer attends to the
    whole context. The decoder's explicit masks are full causal masks, which equal a sliding window
    only while the context fits in it; other layer kinds (linear attention, state-space) have state
    that a key/value cache does not hold."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        unsupported = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unsupported:
            raise ValueError(f"{config.model_type}: layer types {unsupported} are not supported by the "
                             "ragged decoder (it needs attention layers with a key/value cache)")
        if "sliding_attention" not in types:
            return None
    return getattr(config, "sliding_window", None)


class Decoder:
    """Feed tokens to ``model`` for B chains and return next-token logits in float64."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, batch: int, device: torch.device):
        self.model, self.vocab_size, self.device = model, vocab_size, device
        self.window = attention_window(model.config)
        self.dtype = model.get_output_embeddings().weight.dtype
        self.cache = SlotCache(model.config, batch, 0, self.dtype, device)  # allocated on first feed or prefill
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # (B, S)
        self.passes = 0  # decoding forwards (the prompt prefill is not counted)

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(dim=1)  # (B,)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, allowed_new: torch.Tensor, positions: torch.Tensor,
                keep: torch.Tensor, hidden: bool = False):
        """Run the model on tokens (B, T). allowed_new (B, T, T): which new slots each new token
        sees; keep (B, T): which new slots join their chain. Returns the model output."""
        B, T = tokens.shape
        if self.window is not None and self.cache.length + T > self.window:
            raise ValueError(f"{self.cache.length + T} cache slots exceed the model's sliding window of "
                             f"{self.window} tokens; the ragged decoder applies full attention, exact only "
                             "within the window (use a shorter prompt or length)")
        past = self.valid[:, None, :].expand(B, T, -1)  # (B, T, S)
        allowed = torch.cat([past, allowed_new], dim=2)[:, None]  # (B, 1, T, S + T)
        # additive form, the finite minimum (a row that sees nothing stays finite, as in transformers)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min)
        self.cache.reserve(T)
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=self.cache,
                         use_cache=True, output_hidden_states=hidden)
        self.cache.advance(T)
        self.valid = torch.cat([self.valid, keep], dim=1)
        return out

    def feed(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Append tokens (B, T) (slots with keep=False are padding) -> logits (B, T, V) float64."""
        B, T = tokens.shape
        if keep is None:
            keep = torch.ones(B, T, dtype=torch.bool, device=self.device)
        positions = self.lengths[:, None] + torch.cumsum(keep, dim=1) - keep.long()  # (B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()  # (T, T)
        out = self.forward(tokens, causal[None] & keep[:, None, :], positions, keep)
        self.passes += 1
        return out.logits[..., : self.vocab_size].double()  # (B, T, V)

    def discard(self, drop: torch.Tensor) -> None:
        """Mark the last T slots' entries with drop=True (B, T) as no longer part of their chains.

        RoPE positions are fixed when slots are fed, so what a chain keeps must have consecutive
        positions: drop the drafts after a rejection, or the tree nodes off the accepted path."""
        T = drop.shape[1]
        if T > 0:
            self.valid[:, -T:] &= ~drop

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the chains at ``rows`` (B',): finished chains leave the batch."""
        self.cache.select(rows)
        self.valid = self.valid[rows]

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, hidden: bool = False):
        """Feed prompt (P,) once for one chain and copy its cache to all B chains; returns the
        model output of that one forward (None for an empty prompt)."""
        if prompt.numel() == 0:
            return None
        B, P = self.valid.shape[0], prompt.numel()
        self.cache = SlotCache(self.model.config, 1, P + HEADROOM, self.dtype, self.device)
        self.valid = torch.zeros(1, 0, dtype=torch.bool, device=self.device)
        causal = torch.ones(1, P, P, dtype=torch.bool, device=self.device).tril()
        keep = torch.ones(1, P, dtype=torch.bool, device=self.device)
        out = self.forward(prompt[None].to(self.device), causal, torch.arange(P, device=self.device)[None],
                           keep, hidden)
        self.cache.repeat(B)
        self.valid = self.valid.expand(B, -1).clone()
        return out
