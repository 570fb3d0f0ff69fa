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
