"""The naive target sampler: its law, its reproducibility, and parity with a full forward pass."""

import numpy as np
import pytest
import torch

from helpers import ALPHA, DETECT_TV, POWER, first_token_law, planned_samples
from specdec_lab import stats
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.samplers.naive import NaiveConfig, sample_naive


@pytest.mark.parametrize("config", [SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9)],
                         ids=["T=1", "T=0.7 top-p=0.9"])
def test_first_token_matches_exact_target(pair, prompt, config):
    p = first_token_law(pair, prompt, config)
    m = planned_samples(p)  # power >= 0.99 at TV 0.02, alpha 1e-3 (see helpers.planned_samples)
    tokens = sample_naive(pair, prompt, m, 1, NaiveConfig(config), make_generator(11)).tokens
    counts = np.bincount(tokens[:, 0].numpy(), minlength=len(p))
    res = stats.chisquare_identity(counts, p, rng=np.random.default_rng(0))
    assert res.pvalue > ALPHA and (np.isnan(res.tail_pvalue) or res.tail_pvalue > ALPHA)
    assert stats.power_chisquare(m, DETECT_TV, res.n_bins, ALPHA) >= POWER


def test_first_token_test_catches_a_wrong_temperature(pair, prompt):
    """Negative control for the test above: samples at T=0.9 judged against the T=1 law."""
    p = first_token_law(pair, prompt, SamplingConfig())
    m = planned_samples(p)
    tokens = sample_naive(pair, prompt, m, 1, NaiveConfig(SamplingConfig(temperature=0.9)), make_generator(12)).tokens
    counts = np.bincount(tokens[:, 0].numpy(), minlength=len(p))
    assert stats.chisquare_identity(counts, p).pvalue < ALPHA


def test_same_seed_same_samples(pair, prompt):
    config = NaiveConfig()
    a = sample_naive(pair, prompt, 64, 10, config, make_generator(5)).tokens
    torch.manual_seed(999)  # global RNG is never used
    b = sample_naive(pair, prompt, 64, 10, config, make_generator(5)).tokens
    c = sample_naive(pair, prompt, 64, 10, config, make_generator(6)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("config", [SamplingConfig(), SamplingConfig(temperature=0.8, top_k=40)],
                         ids=["T=1", "T=0.8 top-k=40"])
def test_per_step_probs_match_full_forward(pair, prompt, config):
    """The cached, batched sampler sees the same laws as one uncached forward over the whole text."""
    res = sample_naive(pair, prompt, 32, 12, NaiveConfig(config), make_generator(3), return_probs=True)
    seqs = torch.cat([prompt.expand(32, -1), res.tokens], dim=1)
    with torch.no_grad():
        logits = pair.target(seqs).logits[:, len(prompt) - 1: -1, : pair.vocab_size]  # (32, 12, V)
    reference = to_probs(logits, config)
    assert res.probs.shape == (32, 12, pair.vocab_size)
    assert (res.probs - reference).abs().max() < 1e-4
    # every sampled token had positive probability under its own step's law
    assert (res.probs.gather(-1, res.tokens[..., None]) > 0).all()


def test_exactly_length_tokens_and_bad_arguments(pair, prompt):
    assert sample_naive(pair, prompt, 3, 1, NaiveConfig(), make_generator(0)).tokens.shape == (3, 1)
    with pytest.raises(ValueError, match="non-empty"):
        sample_naive(pair, prompt[:0], 3, 4, NaiveConfig(), make_generator(0))
    with pytest.raises(ValueError, match="n >= 1"):
        sample_naive(pair, prompt, 0, 4, NaiveConfig(), make_generator(0))


def test_one_token_prompt(pair):
    tokens = sample_naive(pair, pair.encode("O"), 8, 5, NaiveConfig(), make_generator(0)).tokens
    assert tokens.shape == (8, 5) and (tokens < pair.vocab_size).all()
