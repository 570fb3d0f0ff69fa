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

A feed may give each chain its own width (how many of the T new slots it fills): with chains sorted
by width, each run of equal widths is one forward over a contiguous range of cache rows, and the
slots a chain does not fill are zeroed and invalid. The speculative sampler uses this to draft only
as many tokens as a chain still needs.
"""

from __future__ import annotations

import torch

HEADROOM = 16  # spare slots at allocation; a full buffer grows by max(HEADROOM, a quarter)
MAX_ROOM = 64  # at most this many slots are allocated ahead of need at the prefill


class SlotCache:
    """Keys and values of every layer, (B, H, capacity, D) each; slots [0, length) are filled."""

    def __init__(self, config, batch: int, capacity: int, dtype: torch.dtype, device: torch.device):
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, heads, capacity, dim)
        # uninitialised: attention reads only slots [0, length), each written by a feed or zeroed by
        # ``clear`` (a masked slot must still be finite: masked weight 0 × NaN garbage is NaN)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.length = 0
        self.shared = 0  # leading slots equal in every chain (the prompt copied by ``repeat``)

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
        return self.write(slice(None), key_states, value_states, layer_idx)

    def write(self, rows: slice, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int):
        """Write new slots (b, H, T, D) of the chains at ``rows`` after the filled ones; return their
        keys and values up to the new slots (b, H, S + T, D)."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][rows, :, self.length:end] = key_states
        self.values[layer_idx][rows, :, self.length:end] = value_states
        return self.keys[layer_idx][rows, :, :end], self.values[layer_idx][rows, :, :end]

    def clear(self, rows: slice, start: int, stop: int) -> None:
        """Zero slots [length + start, length + stop) of the chains at ``rows``: new slots a narrow
        feed leaves unwritten (masked, but read by attention's matmuls)."""
        for buffer in self.keys + self.values:
            buffer[rows, :, self.length + start : self.length + stop] = 0

    def rows(self, rows: slice) -> "RowRange":
        return RowRange(self, rows)

    def advance(self, steps: int) -> None:
        self.length += steps

    def get_seq_length(self) -> int:
        """Filled slots (transformers' Cache name, so code that inspects caches reads both kinds)."""
        return self.length

    def select(self, rows: torch.Tensor) -> None:
        """Keep the chains at ``rows`` (B' <= B), in that order. In place: the shared prompt slots stay
        where they are (every chain holds the same ones) and only the later filled slots move, so a
        long prompt costs nothing here."""
        B = self.keys[0].shape[0]
        if len(rows) > B:
            raise ValueError(f"select keeps at most the {B} chains there are, got {len(rows)} rows")
        filled = slice(self.shared, self.length)
        for buffer in self.keys + self.values:
            buffer[: len(rows), :, filled] = buffer[rows, :, filled]
        self.keys = [k[: len(rows)] for k in self.keys]
        self.values = [v[: len(rows)] for v in self.values]

    def gathered(self, rows: torch.Tensor) -> "SlotCache":
        """A new cache whose chain i is a copy of chain rows[i] (rows may repeat)."""
        out = SlotCache.__new__(SlotCache)
        out.keys = [k[rows] for k in self.keys]
        out.values = [v[rows] for v in self.values]
        out.length, out.shared = self.length, self.shared
        return out

    def repeat(self, batch: int) -> None:
        """Copy a one-chain cache (1, H, capacity, D) to ``batch`` chains (the filled slots only)."""
        self.keys = [_moved(k, k.shape[2], self.length, batch) for k in self.keys]
        self.values = [_moved(v, v.shape[2], self.length, batch) for v in self.values]
        self.shared = self.length


class RowRange:
    """A :class:`SlotCache` as one forward over the contiguous chains ``rows`` sees it."""

    def __init__(self, cache: SlotCache, rows: slice):
        self.cache, self.range = cache, rows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.cache.write(self.range, key_states, value_states, layer_idx)

    def get_seq_length(self) -> int:
        return self.cache.length


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
        T = tokens.shape[1]
        self._open(T)
        out = self._run(slice(None), tokens, allowed_new, positions, hidden)
        self._close(keep)
        return out

    def _open(self, T: int) -> None:
        if self.window is not None and self.cache.length + T > self.window:
            raise ValueError(f"{self.cache.length + T} cache slots exceed the model's sliding window of "
                             f"{self.window} tokens; the ragged decoder applies full attention, exact only "
                             "within the window (use a shorter prompt or length)")
        self.cache.reserve(T)

    def _run(self, rows: slice, tokens: torch.Tensor, allowed_new: torch.Tensor, positions: torch.Tensor,
             hidden: bool = False):
        """One model forward over the chains ``rows``: tokens (b, w) into the w slots after the filled ones."""
        b, w = tokens.shape
        past = self.valid[rows, None, :].expand(b, w, -1)  # (b, w, S)
        allowed = torch.cat([past, allowed_new], dim=2)[:, None]  # (b, 1, w, S + w)
        # additive form, the finite minimum (a row that sees nothing stays finite, as in transformers)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min)
        return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                          cache=self.cache.rows(rows), use_cache=True, output_hidden_states=hidden)

    def _close(self, keep: torch.Tensor) -> None:
        self.cache.advance(keep.shape[1])
        self.valid = torch.cat([self.valid, keep], dim=1)

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, keep: torch.Tensor | None = None,
             widths: torch.Tensor | None = None) -> torch.Tensor:
        """Append tokens (B, T) -> logits (B, T, V) float64. Slots with keep=False are padding.

        widths (B,), non-increasing, in [0, T]: chain b fills only its first widths[b] slots (the rest
        are padding, and its logits there are 0); each run of equal widths is one forward over
        exactly that many slots, so narrow chains cost only what they use."""
        B, T = tokens.shape
        if keep is None:
            keep = torch.ones(B, T, dtype=torch.bool, device=self.device)
        runs = None if widths is None else _runs(widths)  # [(rows, width)], checked before the cache changes
        if runs == [(slice(0, B), T)]:
            runs = None  # every chain fills every slot: the plain path
        if runs is not None:
            keep = keep & (torch.arange(T, device=self.device)[None] < widths[:, None])
        positions = self.lengths[:, None] + torch.cumsum(keep, dim=1) - keep.long()  # (B, T)
        allowed_new = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()[None] & keep[:, None, :]
        self._open(T)
        if runs is None:
            logits = self._run(slice(None), tokens, allowed_new, positions).logits[..., : self.vocab_size]
        else:
            logits = torch.zeros(B, T, self.vocab_size, dtype=self.dtype, device=self.device)
            for rows, w in runs:
                if w > 0:
                    out = self._run(rows, tokens[rows, :w], allowed_new[rows, :w, :w], positions[rows, :w])
                    logits[rows, :w] = out.logits[..., : self.vocab_size]
                if w < T:
                    self.cache.clear(rows, w, T)
        self._close(keep)
        self.passes += 1
        return logits.double()  # (B, T, V)

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

    def branch(self, rows: torch.Tensor) -> "Decoder":
        """A new decoder of len(rows) chains, chain i continuing a copy of this one's chain rows[i]
        (rows may repeat): many continuations of a few shared contexts without feeding them again."""
        new = Decoder(self.model, self.vocab_size, len(rows), self.device)
        new.cache, new.valid = self.cache.gathered(rows), self.valid[rows]
        return new

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, hidden: bool = False, room: int = HEADROOM):
        """Feed prompt (P,) once for one chain and copy its cache to all B chains; returns the
        model output of that one forward (None for an empty prompt). ``room``: slots the caller
        expects to feed after the prompt, allocated now (at most MAX_ROOM; the cache grows past them)."""
        if prompt.numel() == 0:
            return None
        B, P = self.valid.shape[0], prompt.numel()
        self.cache = SlotCache(self.model.config, 1, P + min(max(room, HEADROOM), MAX_ROOM), self.dtype, self.device)
        self.valid = torch.zeros(1, 0, dtype=torch.bool, device=self.device)
        causal = torch.ones(1, P, P, dtype=torch.bool, device=self.device).tril()
        keep = torch.ones(1, P, dtype=torch.bool, device=self.device)
        out = self.forward(prompt[None].to(self.device), causal, torch.arange(P, device=self.device)[None],
                           keep, hidden)
        self.cache.repeat(B)
        self.valid = self.valid.expand(B, -1).clone()
        return out


def _runs(widths: torch.Tensor) -> list[tuple[slice, int]]:
    """Contiguous runs of equal values in non-increasing widths (B,) -> [(rows, width), ...]."""
    values, counts = torch.unique_consecutive(widths, return_counts=True)
    if len(values) > 1 and bool((values[1:] > values[:-1]).any()):
        raise ValueError(f"widths must be non-increasing (chains sorted by width), got {widths.tolist()}")
    runs, start = [], 0
    for value, count in zip(values.tolist(), counts.tolist()):
        runs.append((slice(start, start + count), value))
        start += count
    return runs
