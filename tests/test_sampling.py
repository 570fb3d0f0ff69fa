"""The one logits -> probabilities function: cases table, invalid settings, precision."""

import math

import pytest
import torch

from specdec_lab.sampling import SamplingConfig, make_generator, sample, to_probs

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64)
SOFT = torch.softmax(LOGITS, 0)


def _renorm(p, keep):
    q = torch.where(torch.tensor(keep), p, 0.0)
    return q / q.sum()


CASES = [
    ("identity", SamplingConfig(), SOFT),
    ("greedy", SamplingConfig(temperature=0), torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64)),
    ("temperature 0.5", SamplingConfig(temperature=0.5), torch.softmax(LOGITS / 0.5, 0)),
    ("top_k 2", SamplingConfig(top_k=2), _renorm(SOFT, [True, True, False, False, False])),
    ("top_k >= V keeps all", SamplingConfig(top_k=10), SOFT),
    # top-p keeps the smallest prefix with mass >= top_p: p0 = 0.53, p0 + p1 = 0.73
    ("top_p 0.6", SamplingConfig(top_p=0.6), _renorm(SOFT, [True, True, False, False, False])),
    ("top_p tiny keeps top token", SamplingConfig(top_p=1e-9), torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64)),
    ("temperature then top_k", SamplingConfig(temperature=2.0, top_k=3),
     _renorm(torch.softmax(LOGITS / 2, 0), [True, True, True, False, False])),
]


@pytest.mark.parametrize("name,config,expected", CASES, ids=[c[0] for c in CASES])
def test_cases(name, config, expected):
    got = to_probs(LOGITS, config)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert math.isclose(float(got.sum()), 1.0, abs_tol=1e-12)


def test_batched_shapes_and_fp32():
    logits = torch.randn(3, 4, 17, generator=torch.Generator().manual_seed(0))
    p = to_probs(logits, SamplingConfig(top_k=5, top_p=0.8, dtype=torch.float32))
    assert p.shape == (3, 4, 17) and p.dtype == torch.float32
    assert ((p > 0).sum(-1) <= 5).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 4))


def _sorted_nucleus(probs, top_p):
    """The nucleus by a full sort (the rule written out): keep a token when the mass sorted before it is below top_p."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.zeros_like(sorted_p, dtype=torch.bool).scatter(-1, order, (sorted_p.cumsum(-1) - sorted_p) < top_p)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("vocab,scale", [(512, 1.0), (512, 2.5), (512, 0.3), (40, 1.0), (70, 0.2)])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_probed_nucleus_equals_a_full_sort(vocab, scale, top_p):
    """The topk probe (NUCLEUS_PROBE) and its fallback give the full sort's set: flat laws (scale 0.3: nuclei of
    hundreds of tokens, every row through the fallback), peaked ones, mixed batches, a vocabulary below the probe."""
    g = torch.Generator().manual_seed(vocab * 7 + int(100 * top_p))
    logits = torch.randn(600, vocab, dtype=torch.float64, generator=g) * scale * torch.rand(600, 1, generator=g, dtype=torch.float64) * 4
    probs = torch.softmax(logits, -1)
    got = to_probs(logits, SamplingConfig(top_p=top_p))
    torch.testing.assert_close(got, _sorted_nucleus(probs, top_p), rtol=0, atol=1e-15)


def test_nucleus_keeps_every_token_tied_at_its_boundary():
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]], dtype=torch.float64))
    got = to_probs(logits, SamplingConfig(top_p=0.5))
    torch.testing.assert_close(got[0], torch.tensor([0.4, 0.2, 0.2, 0.2], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64), rtol=0, atol=1e-12)
    # in a wide row (the probe's fallback) too: 200 equal tokens straddle top-p 0.5
    wide = torch.softmax(torch.zeros(1, 300, dtype=torch.float64).index_fill(1, torch.arange(100), -30.0), -1)
    assert int((to_probs(torch.log(wide), SamplingConfig(top_p=0.5)) > 0).sum()) == 200


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"dtype": torch.float16}, "dtype"),
])
def test_invalid_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_sample_uses_only_its_generator():
    p = torch.softmax(torch.randn(1000, 50, generator=torch.Generator().manual_seed(1)), -1)
    a = sample(p, make_generator(7))
    torch.manual_seed(123)  # global RNG must not matter
    b = sample(p, make_generator(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, sample(p, make_generator(8)))


# ------------------------------------------------- the full chain (penalties, min-p) against HF's logits processors

from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,  # noqa: E402
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from specdec_lab.sampling import ORDERS, WINDOWED, ChainConfig, apply_penalties, chain_probs  # noqa: E402

HF_STEPS = {"temperature": lambda c: TemperatureLogitsWarper(c.sampling.temperature),
            "top_k": lambda c: TopKLogitsWarper(c.sampling.top_k) if c.sampling.top_k else None,
            "top_p": lambda c: TopPLogitsWarper(c.sampling.top_p) if c.sampling.top_p < 1 else None,
            "min_p": lambda c: MinPLogitsWarper(c.min_p) if c.min_p > 0 else None}
CHAIN_CASES = [  # (sampling, min_p, repetition penalty)
    (SamplingConfig(temperature=0.7, top_p=0.9), 0.0, 1.0),
    (SamplingConfig(temperature=1.3, top_k=20), 0.05, 1.0),
    (SamplingConfig(temperature=0.7, top_k=50, top_p=0.8), 0.1, 1.3),
    (SamplingConfig(temperature=1.0), 0.2, 0.8),
    (SamplingConfig(temperature=2.0, top_p=0.95), 0.02, 1.5),
]


def _hf_chain(logits, input_ids, config):
    """The same steps composed from HF's own processors, in ``config.order``."""
    scores = logits[None].clone()
    if config.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(config.repetition_penalty)(input_ids[None], scores)
    for step in ORDERS[config.order][1:]:
        processor = HF_STEPS[step](config)
        if processor is not None:
            scores = processor(input_ids[None], scores)
    return torch.softmax(scores[0], dim=-1)


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("sampling, min_p, repetition", CHAIN_CASES)
def test_chain_matches_hf_processors(order, sampling, min_p, repetition):
    """Each order's chain equals HF's processors composed in that order, on a real model's logits."""
    from specdec_lab.models import load_pair

    pair = load_pair("bundled")
    ids = pair.encode("ROMEO:\nGood night, good night! parting is such sweet sorrow")
    with torch.no_grad():
        logits = pair.target(ids[None]).logits[0, -1, : pair.vocab_size].double()
    config = ChainConfig(sampling, min_p=min_p, repetition_penalty=repetition, order=order, penalty_last_n=0
                         if order not in WINDOWED else 10_000)  # the window holds the whole prompt
    context, output = config.counts(ids.tolist(), [], pair.vocab_size)
    ours = chain_probs(logits, config, context, output)
    theirs = _hf_chain(logits, ids, config)
    assert torch.allclose(ours, theirs, atol=1e-12), (ours - theirs).abs().max()
    assert abs(float(ours.sum()) - 1) < 1e-12


def test_orders_differ_where_documented():
    """llama.cpp's top-p sees the untempered law: at T = 0.7 its nucleus is wider than HF's/vLLM's."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0])
    s = SamplingConfig(temperature=0.7, top_p=0.8)
    hf = chain_probs(logits, ChainConfig(s, order="hf"))
    llama = chain_probs(logits, ChainConfig(s, order="llama.cpp"))
    assert int((hf > 0).sum()) < int((llama > 0).sum())
    assert torch.allclose(chain_probs(logits, ChainConfig(s, order="vllm")), to_probs(logits, s))


def test_presence_frequency_penalties_by_scope():
    """OpenAI's presence/frequency penalties, written out by hand: vLLM counts output tokens only,
    llama.cpp the whole window of prompt + output."""
    logits = torch.zeros(5, dtype=torch.float64)
    prompt, output = [1, 1, 2], [2, 3, 3]
    for order, counts in (("vllm", [0, 0, 1, 2, 0]), ("llama.cpp", [0, 2, 2, 2, 0])):
        config = ChainConfig(presence_penalty=0.5, frequency_penalty=0.25, order=order)
        context, out = config.counts(prompt, output, 5)
        expected = torch.tensor([-(0.25 * c + 0.5 * (c > 0)) for c in counts], dtype=torch.float64)
        assert torch.allclose(apply_penalties(logits, context, out, config), expected)


def test_llama_cpp_window_drops_old_tokens():
    context, _ = ChainConfig(order="llama.cpp", penalty_last_n=3).counts([7, 1, 2], [3], 8)
    assert context.tolist() == [0, 1, 1, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("length", [1, 5, 7, 8])
def test_llama_cpp_window_keeps_every_token_of_a_shorter_context(length):
    """Fewer than n tokens: all of them are in the window (a negative slice start once kept only the last
    n − len: with a 43-token prompt and n = 64, 21 tokens, which made llama-server's penalised law look wrong)."""
    context, _ = ChainConfig(order="llama.cpp", penalty_last_n=8).counts(list(range(length - 1)), [7], 8)
    assert int(context.sum()) == length and context[7] == 1


def test_greedy_chain_is_argmax_of_penalised_logits():
    config = ChainConfig(SamplingConfig(temperature=0.0), repetition_penalty=4.0)
    context = torch.tensor([1.0, 0.0, 0.0])
    probs = chain_probs(torch.tensor([3.0, 1.0, 0.5]), config, context, torch.zeros(3))
    assert probs.tolist() == [0.0, 1.0, 0.0]  # 3 / 4 < 1


@pytest.mark.parametrize("kwargs, message", [({"order": "sglang"}, "unknown order"), ({"min_p": 1.0}, "min_p"),
                                             ({"repetition_penalty": 0.0}, "repetition_penalty")])
def test_chain_invalid_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChainConfig(**kwargs)
