"""The whole suite on real samplers: calibrated under H0 (meta test over seeds), rejects bugs."""

import numpy as np
import pytest

from helpers import ALPHA
from specdec_lab import stats
from specdec_lab.sampling import SamplingConfig, make_generator
from specdec_lab.samplers.naive import NaiveConfig, sample_naive
from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative
from specdec_lab.suite import SuiteSettings, frequent_prefixes, run_suite, score

SETTINGS = SuiteSettings(alpha=0.05, n_resamples=999, min_prefix_count=100)


def suite_over_seeds(pair, prompt, draw, seeds, m=2000, length=3):
    results = []
    for seed in seeds:
        tokens = draw(seed, m, length)
        s = score(pair, prompt, tokens, SamplingConfig(), SETTINGS.min_prefix_count)
        results.append(run_suite("x", tokens, s, SETTINGS, np.random.default_rng(seed)))
    return results


@pytest.mark.parametrize("sampler", ["naive", "speculative"])
def test_false_positive_rate_over_seeds(pair, prompt, sampler):
    """Over R seeds the suite's rejection rate on a correct sampler is at most α (+ binomial slack),
    and its continuous component p-values are Uniform(0, 1) (KS meta test)."""
    def draw(seed, m, length):
        if sampler == "naive":
            return sample_naive(pair, prompt, m, length, NaiveConfig(), make_generator(seed)).tokens.numpy()
        return sample_speculative(pair, prompt, m, length, SpeculativeConfig(k=4), make_generator(seed)).tokens.numpy()

    R = 24
    results = suite_over_seeds(pair, prompt, draw, range(1000, 1000 + R))
    rejected = np.mean([r.global_pvalue < SETTINGS.alpha for r in results])
    assert rejected <= SETTINGS.alpha + 3 * np.sqrt(SETTINGS.alpha * (1 - SETTINGS.alpha) / R)
    for test in ("randomized PIT KS (all positions)", "log-prob z (all positions)", "ADK (first token)"):
        pvalues = [r.tests[test].pvalue for r in results]
        assert stats.uniformity_test(pvalues).pvalue > ALPHA, test


def test_temperature_bug_caught_by_suite(pair, prompt):
    tokens = sample_naive(pair, prompt, 20_000, 3, NaiveConfig(SamplingConfig(temperature=0.95)),
                          make_generator(0)).tokens.numpy()
    s = score(pair, prompt, tokens, SamplingConfig(), SETTINGS.min_prefix_count)
    result = run_suite("hot", tokens, s, SETTINGS, np.random.default_rng(0))
    assert result.verdict == "rejected"
    assert result.tests["log-prob z (all positions)"].pvalue < ALPHA


def test_impossible_tokens_rejected_outright(pair, prompt):
    tokens = sample_naive(pair, prompt, 2000, 2, NaiveConfig(), make_generator(0)).tokens.numpy()
    s = score(pair, prompt, tokens, SamplingConfig(top_k=1), 100)  # judged against a top-1 law
    result = run_suite("top1", tokens, s, SETTINGS, np.random.default_rng(0))
    assert result.verdict == "rejected" and result.impossible_tokens > 0


def test_frequent_prefixes():
    tokens = np.array([[1, 2, 3], [1, 2, 4], [1, 5, 3], [7, 2, 3]])
    found = frequent_prefixes(tokens, 2)
    assert set(found) == {(1, (1,)), (2, (1, 2))}
