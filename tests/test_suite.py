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
    # Sampled at T = 0.9, scored at T = 1: the log-prob z test gave p < 1e-51 at m = 5,000 on seeds
    # 0, 1, 2 (z ≈ 15), so at m = 2,000 z ≈ 10 and the power at α = 0.05 is 1 to many digits.
    tokens = sample_naive(pair, prompt, 2_000, 3, NaiveConfig(SamplingConfig(temperature=0.9)),
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


# ---------------------------------------------------------------- H0 by the exact law: size, measured


@pytest.fixture(scope="module")
def target_pairs(pair, prompt):
    from specdec_lab.laws import pair_law

    return pair_law(pair, prompt, SamplingConfig())


def test_scores_from_the_exact_law_equal_the_model_scores(pair, prompt, target_pairs):
    from specdec_lab.suite import draw_pairs, scores_from_law

    tokens = draw_pairs(target_pairs, 1500, np.random.default_rng(0))
    by_model = score(pair, prompt, tokens, SamplingConfig(), 100)
    by_law = scores_from_law(tokens, target_pairs, 100)
    for name in ("p_x", "cdf_below", "entropy", "varentropy"):
        assert np.allclose(getattr(by_model, name), getattr(by_law, name), atol=1e-6), name
    assert by_model.prefix_laws.keys() == by_law.prefix_laws.keys()


def test_score_equals_a_plain_forward(pair, prompt):
    """Scores read off the two-token law's tables (positions 1-2) and fed from its branched cache
    (positions 3..L) equal a plain forward of the whole text with no cache, at a setting where
    every position's law is filtered (T = 0.8, top-p 0.9)."""
    import torch

    from specdec_lab.sampling import to_probs

    sampling = SamplingConfig(temperature=0.8, top_p=0.9)
    tokens = sample_naive(pair, prompt, 600, 5, NaiveConfig(sampling), make_generator(3)).tokens.numpy()
    scores = score(pair, prompt, tokens, sampling, 5, chunk=256)  # several chunks
    ids = torch.cat([prompt[None].expand(len(tokens), -1), torch.tensor(tokens)], dim=1)
    with torch.no_grad():
        logits = pair.target(input_ids=ids).logits[:, len(prompt) - 1:-1, :pair.vocab_size]
    p = to_probs(logits.double(), sampling)  # (N, 5, V)
    p_x = p.gather(-1, torch.tensor(tokens)[..., None]).squeeze(-1).numpy()
    below = (torch.cumsum(p, -1) - p).gather(-1, torch.tensor(tokens)[..., None]).squeeze(-1).numpy()
    assert np.allclose(scores.p_x, p_x, atol=1e-5) and np.allclose(scores.cdf_below, below, atol=1e-5)
    assert {t for t, _ in scores.prefix_laws} >= {1, 2, 3}  # prefixes seen >= 5 times, after 1-3 tokens
    for (t, prefix), law in scores.prefix_laws.items():
        row = next(i for i in range(len(tokens)) if tuple(tokens[i, :t]) == prefix)
        assert np.allclose(law, p[row, t].numpy(), atol=1e-5), (t, prefix)


def test_size_meta_test_on_the_exact_law(target_pairs):
    """The whole suite (joint ADK, collisions and per-position PIT included) on R seeds of samples
    drawn straight from the exact two-token law: rejection rate <= α + binomial slack, and each
    continuous p-value Uniform(0, 1) by KS. (The README gives the same meta-test at a larger R.)"""
    from specdec_lab.suite import draw_pairs, scores_from_law

    R, m = 60, 3000
    settings = SuiteSettings(alpha=0.05, n_resamples=499, min_prefix_count=100)
    results = []
    for seed in range(R):
        rng = np.random.default_rng(100 + seed)
        tokens = draw_pairs(target_pairs, m, rng)
        results.append(run_suite("h0", tokens, scores_from_law(tokens, target_pairs, 100), settings, rng))
    rejected = np.mean([r.global_pvalue < settings.alpha for r in results])
    assert rejected <= settings.alpha + 3 * np.sqrt(settings.alpha * (1 - settings.alpha) / R)
    for test in ("ADK (first token)", "ADK (first two tokens, joint)", "collisions (first two tokens)",
                 "randomized PIT KS (all positions)", "log-prob z (all positions)"):
        assert stats.uniformity_test([r.tests[test].pvalue for r in results]).pvalue > ALPHA, test


def test_joint_bound_and_collisions_reported(target_pairs):
    from specdec_lab.suite import draw_pairs, scores_from_law

    rng = np.random.default_rng(1)
    tokens = draw_pairs(target_pairs, 20_000, rng)
    result = run_suite("h0", tokens, scores_from_law(tokens, target_pairs, SETTINGS.min_prefix_count), SETTINGS, rng)
    assert result.joint_bound is not None and result.joint_bound.upper > result.tv_bound.upper
    assert result.length == 2 and "collisions (first two tokens)" in result.tests
    assert np.isfinite(result.independence_pvalue)
    row = result.rows()[0]
    assert row["tv_upper_joint"] == result.joint_bound.upper and row["L"] == 2


def test_verdict_rests_on_the_joint_bound_when_asked(target_pairs):
    """Same samples: equivalent on the first token alone at ε = 0.05; inconclusive once the joint
    two-token bound must also be below 0.03 (it needs more samples: a larger, flatter law; at m = 20,000 the
    joint bound is ≈ 0.05)."""
    from specdec_lab.suite import draw_pairs, scores_from_law

    rng = np.random.default_rng(2)
    tokens = draw_pairs(target_pairs, 20_000, rng)
    scores = scores_from_law(tokens, target_pairs)
    first_only = run_suite("x", tokens, scores, SuiteSettings(tolerance=0.05, n_resamples=499),
                           np.random.default_rng(3))
    joint = run_suite("x", tokens, scores, SuiteSettings(tolerance=0.05, joint_tolerance=0.03, n_resamples=499),
                      np.random.default_rng(3))
    assert first_only.verdict == "equivalent", first_only.verdict_text
    assert joint.verdict == "inconclusive" and "first two tokens TV" in joint.verdict_text
    assert "99% confidence each (98% both at once)" in joint.verdict_text
    assert first_only.joint_bound.upper > 0.03


def test_replayed_streams_rejected_by_independence(target_pairs):
    """Samples that each follow p exactly, 40% of them replays of others: rejected, and the verdict
    names the collision test."""
    from specdec_lab.suite import draw_pairs, scores_from_law

    rng = np.random.default_rng(4)
    fresh = draw_pairs(target_pairs, 6000, rng)
    tokens = np.concatenate([fresh, fresh[:4000]])
    result = run_suite("replayed", tokens, scores_from_law(tokens, target_pairs, SETTINGS.min_prefix_count), SETTINGS, rng)
    assert result.verdict == "rejected"
    assert "collisions (first two tokens)" in result.rejected_by, result.verdict_text
