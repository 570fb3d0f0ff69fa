"""Block verification (Sun et al. 2025): its exact law is p, its sampler follows that law, it keeps at least as many
drafts as the token-wise rule, and its faulty variants move the law."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import ALPHA, first_token_law, planned_samples
from specdec_lab import stats
from specdec_lab.laws import block_tree, cached_logits_at, markov_logits_at, sequence_law, tokens_per_pass
from specdec_lab.sampling import SamplingConfig, make_generator
from specdec_lab.samplers.faulty import FAULTY
from specdec_lab.samplers.rules import BLOCK, LEVIATHAN
from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative
from specdec_lab.suite import SuiteSettings, run_suite, score
from specdec_lab.verify import BLOCK_K, BLOCK_TOP_K

# the settings of the verify rows: temperature 1 and 0.7, top-p 0.9, and the block row's top-k
SETTINGS = {"T=1": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7), "top-p=0.9": SamplingConfig(top_p=0.9),
            f"top-k={BLOCK_TOP_K}": SamplingConfig(top_k=BLOCK_TOP_K)}


def _markov(seed: int, V: int = 6, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    target, draft = (torch.log_softmax(scale * torch.randn(V, V, generator=g, dtype=torch.float64), -1) for _ in "pq")
    return target, draft


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("length", [1, 2, 4])
def test_block_law_is_p_on_small_vocabularies(k, length):
    target, draft = _markov(10 * k + length)
    law = sequence_law(markov_logits_at(target, draft), 6, k, length, SamplingConfig(), BLOCK)
    assert law.max_abs_error < 1e-12
    assert abs(float(law.law.sum()) - 1) < 1e-12


@pytest.mark.parametrize("case", ["q equals p", "disjoint supports", "draft one-hot"])
def test_block_law_is_p_in_edge_cases(case):
    """p = q (every weight 1: the 0/0 stop rule), supports that never meet (every draft rejected), a point-mass draft."""
    target, draft = _markov(1, V=5)
    if case == "q equals p":
        draft = target.clone()
    elif case == "disjoint supports":
        target[:, 3:], draft[:, :3] = -torch.inf, -torch.inf
    else:
        draft = torch.full_like(draft, -torch.inf)
        draft[:, 2] = 0.0
    law = sequence_law(markov_logits_at(target, draft), 5, 3, 3, SamplingConfig(), BLOCK)
    assert law.max_abs_error < 1e-12


def test_block_law_is_p_on_the_real_models(pair, prompt):
    law = sequence_law(cached_logits_at(pair, prompt), pair.vocab_size, BLOCK_K, 2, SamplingConfig(top_k=BLOCK_TOP_K),
                       BLOCK)
    assert law.max_abs_error < 1e-12 and law.law.shape == (pair.vocab_size, pair.vocab_size)


@pytest.mark.parametrize("name", ["block_no_lookahead", "block_tokenwise_residual"])
def test_block_controls_move_the_law_where_the_rule_is_exact(name):
    """On the same small-vocabulary chain where BLOCK is exact, each one-piece fault is not."""
    target, draft = _markov(3)
    law = sequence_law(markov_logits_at(target, draft), 6, 3, 3, SamplingConfig(), FAULTY[name])
    assert law.tv > 1e-3


def test_block_with_one_draft_is_the_tokenwise_rule(pair, prompt):
    """At K = 1 the block step is Leviathan's step, drawing the same uniforms: the same tokens for the same seed."""
    a = sample_speculative(pair, prompt, 500, 6, SpeculativeConfig(k=1, verifier=BLOCK), make_generator(3)).tokens
    b = sample_speculative(pair, prompt, 500, 6, SpeculativeConfig(k=1, verifier=LEVIATHAN), make_generator(3)).tokens
    assert torch.equal(a, b)


@pytest.mark.parametrize("setting", SETTINGS)
def test_block_keeps_at_least_as_many_drafts_exactly(pair, prompt, setting):
    """Sun et al.'s Theorem 3 on the real models: E[tokens per pass] of one block at K = 2, by enumeration."""
    tree = block_tree(cached_logits_at(pair, prompt), torch.zeros(0, dtype=torch.long), 2, SETTINGS[setting], BLOCK,
                      bonus=False)
    exact = tokens_per_pass(tree, BLOCK)
    assert exact["block"] >= exact["tokenwise"] > 1.0


def test_block_sampler_follows_the_target(pair, prompt):
    """The suite on the planned m (a TV of 0.02 on token 1 seen with power 0.99 at α = 1e-3) does not reject."""
    sampling = SamplingConfig(top_k=BLOCK_TOP_K)
    config = SpeculativeConfig(k=BLOCK_K, sampling=sampling, verifier=BLOCK)
    m = planned_samples(first_token_law(pair, prompt, sampling))
    result = sample_speculative(pair, prompt, m, 4, config, make_generator(11))
    tokens = result.tokens.numpy()
    suite = run_suite("block", tokens, score(pair, prompt, tokens, sampling), SuiteSettings(alpha=ALPHA, n_resamples=2000),
                      np.random.default_rng(11))
    assert suite.verdict != "rejected", suite.verdict_text


def test_block_sampler_accepts_more_than_the_tokenwise_rule(pair, prompt):
    """Measured at K = 4, T = 1 over the same chains and seed (the gap is several standard errors at this size)."""
    measured = {v.name: sample_speculative(pair, prompt, 2_000, 6, SpeculativeConfig(k=4, verifier=v),
                                           make_generator(12)).stats["tokens_per_target_pass"] for v in (BLOCK, LEVIATHAN)}
    assert measured["block"] > measured["leviathan"], measured


def test_block_control_sampler_follows_its_exact_law(pair, prompt):
    """The block sampler and laws.block share the stop rule: the no-look-ahead control's first token has its law."""
    verifier, sampling = FAULTY["block_no_lookahead"], SamplingConfig(top_k=BLOCK_TOP_K)
    law = sequence_law(cached_logits_at(pair, prompt), pair.vocab_size, 2, 1, sampling, verifier).law.numpy()
    tokens = sample_speculative(pair, prompt, 15_000, 1, SpeculativeConfig(k=2, sampling=sampling, verifier=verifier),
                                make_generator(4)).tokens
    counts = np.bincount(tokens[:, 0].numpy(), minlength=pair.vocab_size)
    assert stats.chisquare_identity(counts, law / law.sum()).pvalue > ALPHA
