"""The ragged-batch decoder and its in-place slot cache against plain forwards of each chain's text."""

import pytest
import torch

from specdec_lab.samplers.decoder import HEADROOM, Decoder


def _alone(pair, text: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return pair.target(text[None]).logits[0, -1, : pair.vocab_size].double()  # (V,)


def test_ragged_feeds_growth_and_select_match_plain_forwards(pair, prompt):
    """Feeds with padding slots, discarded slots, chains leaving the batch, and more slots than the
    first allocation (so the buffers regrow): every chain's next-token logits equal a plain forward
    over exactly its own text."""
    gen = torch.Generator().manual_seed(5)
    B, T, steps = 4, 5, 16  # 80 slots fed after the prompt: the buffers regrow
    assert steps * T > HEADROOM
    decoder = Decoder(pair.target, pair.vocab_size, B, pair.device)
    decoder.prefill(prompt[:-1])
    capacity = decoder.cache.capacity
    context = [prompt[:-1].clone() for _ in range(B)]  # each chain's text in the cache
    chains = list(range(B))  # batch row -> chain
    for step in range(steps):
        tokens = torch.randint(0, pair.vocab_size, (len(chains), T), generator=gen)  # (B', T)
        keep = torch.rand(len(chains), T, generator=gen) < 0.7  # False: padding slots
        keep[:, -1] = True  # the slot whose logits we read belongs to the text
        logits = decoder.feed(tokens, keep)[:, -1]  # (B', V)
        cut = torch.randint(0, T + 1, (len(chains), 1), generator=gen)
        drop = torch.arange(T)[None] >= cut  # a suffix of the block, like drafts after a rejection
        decoder.discard(drop)
        for row, chain in enumerate(chains):
            seen = torch.cat([context[chain], tokens[row][keep[row]]])
            torch.testing.assert_close(logits[row], _alone(pair, seen), atol=1e-4, rtol=1e-5)
            context[chain] = torch.cat([context[chain], tokens[row][keep[row] & ~drop[row]]])
        if step == steps // 2:  # chains 1 and 3 leave the batch
            decoder.select(torch.tensor([0, 2]))
            chains = [chains[0], chains[2]]
    assert decoder.cache.capacity > capacity  # the buffers did regrow


def test_per_chain_widths_and_in_place_select_match_plain_forwards(pair, prompt):
    """Feeds where each chain fills only its first widths[b] slots (one forward per run of equal
    widths, as the speculative sampler drafts), with the batch re-sorted in place between feeds:
    every fed chain's logits equal a plain forward of its own text, the unfilled slots are zeroed
    (masked, but NaN garbage there would poison the masked sum), and the shared prompt slots are
    never moved."""
    gen = torch.Generator().manual_seed(7)
    B, T = 6, 4
    decoder = Decoder(pair.target, pair.vocab_size, B, pair.device)
    decoder.prefill(prompt[:-1], room=40)
    shared = decoder.cache.shared
    assert shared == prompt.numel() - 1
    for buffer in decoder.cache.keys + decoder.cache.values:
        buffer[:, :, shared:] = float("nan")  # what uninitialised memory may hold
    buffers = [k.data_ptr() for k in decoder.cache.keys]
    context = [prompt[:-1].clone() for _ in range(B)]
    chains = list(range(B))
    for step in range(5):
        widths = torch.randint(0, T + 1, (len(chains),), generator=gen).sort(descending=True).values
        widths[0] = T  # one chain fills the whole block
        tokens = torch.randint(0, pair.vocab_size, (len(chains), T), generator=gen)
        logits = decoder.feed(tokens, widths=widths)  # (B', T, V)
        assert logits.grad_fn is None  # no autograd graph kept (it doubled the samplers' memory once)
        for row, chain in enumerate(chains):
            w = int(widths[row])
            context[chain] = torch.cat([context[chain], tokens[row, :w]])
            if w > 0:
                torch.testing.assert_close(logits[row, w - 1], _alone(pair, context[chain]), atol=1e-4, rtol=1e-5)
            assert (logits[row, w:] == 0).all()
        filled = decoder.cache.length
        assert all(bool(torch.isfinite(k[:, :, :filled]).all()) for k in decoder.cache.keys + decoder.cache.values)
        order = torch.randperm(len(chains), generator=gen)[: max(1, len(chains) - step % 2)]  # shuffle, drop some
        decoder.select(order)
        chains = [chains[i] for i in order.tolist()]
    assert [k.data_ptr() for k in decoder.cache.keys] == buffers  # selected in place, no regrowth
    with pytest.raises(ValueError, match="non-increasing"):
        decoder.feed(torch.zeros(len(chains), 2, dtype=torch.long), widths=torch.arange(len(chains)) % 3)


def _tiny(kind: str):
    """A small randomly initialised model of another architecture (nothing is downloaded)."""
    import transformers

    torch.manual_seed(0)
    configs = {
        "gpt2": transformers.GPT2Config(vocab_size=97, n_positions=128, n_embd=32, n_layer=2, n_head=4),
        "gpt_neox": transformers.GPTNeoXConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64, rotary_pct=0.5),
        "qwen2": transformers.Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64),
    }
    config = configs[kind]
    config._attn_implementation = "eager"
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "qwen2"])
def test_other_architectures_match_plain_forwards(kind):
    """The slot cache only relies on attention layers calling ``cache.update``: GPT-2 (learned
    positions), GPT-NeoX (partial rotary) and Qwen2 (grouped KV heads) decode exactly too."""
    model = _tiny(kind)
    gen = torch.Generator().manual_seed(1)
    B, T = 3, 4
    decoder = Decoder(model, 97, B, torch.device("cpu"))
    prompt = torch.randint(0, 97, (6,), generator=gen)
    decoder.prefill(prompt)
    context = [prompt.clone() for _ in range(B)]
    for _ in range(3):
        tokens = torch.randint(0, 97, (B, T), generator=gen)
        keep = torch.rand(B, T, generator=gen) < 0.7
        keep[:, -1] = True
        logits = decoder.feed(tokens, keep)[:, -1]  # (B, V)
        for b in range(B):
            seen = torch.cat([context[b], tokens[b][keep[b]]])
            with torch.no_grad():
                alone = model(seen[None]).logits[0, -1].double()
            torch.testing.assert_close(logits[b], alone, atol=1e-5, rtol=1e-5)
            context[b] = seen


def test_sliding_window_and_unsupported_layers_are_refused():
    """Full causal masks equal a sliding window only inside it: past the window the decoder refuses,
    and layer kinds without a key/value cache are refused up front."""
    import transformers

    config = transformers.MistralConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, sliding_window=8)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    decoder = Decoder(model, 97, 2, torch.device("cpu"))
    decoder.prefill(torch.arange(6))
    decoder.feed(torch.zeros(2, 2, dtype=torch.long))  # 8 slots: inside the window
    with pytest.raises(ValueError, match="sliding window of 8"):
        decoder.feed(torch.zeros(2, 1, dtype=torch.long))
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match="linear_attention"):
        Decoder(model, 97, 2, torch.device("cpu"))
