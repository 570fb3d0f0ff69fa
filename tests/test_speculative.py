"""The speculative sampler reproduces the target law; every negative control is caught.

Distributional tests use m from the power planner: a first-token TV deviation of 0.02 (on the
test's bins) is detected with power >= 0.99 at alpha = 1e-3. Later positions are tested through
the suite (per-prefix conditional G tests with Holm, randomized PIT, log-prob z) on the same samples.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import ALPHA, DETECT_TV, POWER, first_token_law, planned_samples
from specdec_lab import stats
from specdec_lab.laws import step_law
from specdec_lab.models import ModelPair
from specdec_lab.sampling import SamplingConfig, make_generator
from specdec_lab.samplers.faulty import FAULTY, SMALL_EFFECT
from specdec_lab.samplers.naive import NaiveConfig, sample_naive
from specdec_lab.samplers.rules import POINT_MASS
from specdec_lab.samplers.speculative import SpeculativeConfig, expected_tokens_per_pass, sample_speculative
from specdec_lab.theory import expected_work_per_sample
from specdec_lab.suite import SuiteSettings, run_suite, score

LENGTH = 2  # first token, and token 2 conditional on token 1 (where K=1 bonus bugs show)
SETTINGS = SuiteSettings(alpha=ALPHA, n_resamples=2000)

CORRECT = {
    "K=1 T=1": SpeculativeConfig(k=1),
    "K=4 T=1": SpeculativeConfig(k=4),
    "K=4 T=0.7": SpeculativeConfig(k=4, sampling=SamplingConfig(temperature=0.7)),
    "K=4 top-k=20": SpeculativeConfig(k=4, sampling=SamplingConfig(top_k=20)),
    "K=4 top-p=0.9": SpeculativeConfig(k=4, sampling=SamplingConfig(top_p=0.9)),
    # K = 2: the first two tokens' law under the point-mass rule is the same at any K >= 2 (drafts 3.. never
    # reach them), at half K = 4's cost (its acceptance is ≈ 0.26: most passes end at the first draft)
    "point-mass K=2": SpeculativeConfig(k=2, verifier=POINT_MASS),
}


def faulty_config(name):
    verifier = FAULTY[name]
    needs = dict(verifier.needs or {})
    k = needs.pop("k", 4)
    return SpeculativeConfig(k=k, sampling=SamplingConfig(**needs), verifier=verifier)


def run(pair, prompt, config, m, seed):
    res = sample_speculative(pair, prompt, m, LENGTH, config, make_generator(seed))
    tokens = res.tokens.numpy()
    suite = run_suite("x", tokens, score(pair, prompt, tokens, config.sampling, SETTINGS.min_prefix_count),
                      SETTINGS, np.random.default_rng(seed))
    return res, suite


CONTROL_TV = 0.05


def planned(pair, prompt, sampling):
    return planned_samples(first_token_law(pair, prompt, sampling))


@pytest.mark.parametrize("name", CORRECT)
def test_lossless_configs_reproduce_target(pair, prompt, name):
    config = CORRECT[name]
    m = planned(pair, prompt, config.sampling)
    res, suite = run(pair, prompt, config, m, seed=list(CORRECT).index(name))  # a fixed seed per config
    assert suite.verdict != "rejected", f"{name}: {suite.verdict_text}"
    first = suite.tests["pearson (first token)"]
    assert stats.power_chisquare(m, DETECT_TV, first.n_bins, ALPHA) >= POWER
    assert (res.tokens < pair.vocab_size).all()


@pytest.mark.parametrize("name", sorted(FAULTY))
def test_negative_controls_rejected(pair, prompt, name):
    config = faulty_config(name)
    # planned for a TV of 0.05 (power 0.99 at alpha 1e-3): every control's exact first-two-token TV is
    # >= 0.05 (tests/test_exact.py, README) but those of SMALL_EFFECT, so the lossless configs' m for 0.02 is not needed
    m = planned_samples(first_token_law(pair, prompt, config.sampling), tv=CONTROL_TV)
    if name in SMALL_EFFECT:  # exact TV of tokens 1-2 ~0.004: the conditional law of token 2 carries the fault
        m = 10_000
    _, suite = run(pair, prompt, config, m, seed=7)
    assert suite.verdict == "rejected", f"{name} was not caught: {suite.verdict_text}"


@pytest.mark.parametrize("name", ["residual_from_p", "always_accept", "argmax_draft_softmax_q", "draft_noise_reused",
                                  "target_zeroed_before_recovery"])
def test_faulty_sampler_follows_its_exact_law(pair, prompt, name):
    """Cross-check of sampler and exact module: a faulty sampler's first token has the faulty law."""
    config = faulty_config(name)
    with torch.no_grad():
        t = pair.target(prompt[None]).logits[0, -1, : pair.vocab_size].double()
        d = pair.draft(prompt[None]).logits[0, -1, : pair.vocab_size].double()
    law = step_law(t, d, config.sampling, config.verifier).numpy()
    tokens = sample_speculative(pair, prompt, 15_000, 1, config, make_generator(4)).tokens
    counts = np.bincount(tokens[:, 0].numpy(), minlength=pair.vocab_size)
    law = law / law.sum()
    assert stats.chisquare_identity(counts, law).pvalue > ALPHA


@pytest.mark.parametrize("k", [1, 3, 4, 7])
def test_greedy_matches_naive_token_for_token(pair, prompt, k):
    greedy = SamplingConfig(temperature=0)
    naive = sample_naive(pair, prompt, 16, 24, NaiveConfig(greedy), make_generator(0)).tokens
    spec = sample_speculative(pair, prompt, 16, 24, SpeculativeConfig(k=k, sampling=greedy), make_generator(1))
    assert torch.equal(naive, spec.tokens)


def test_same_seed_same_samples(pair, prompt):
    config = SpeculativeConfig(k=3)
    a = sample_speculative(pair, prompt, 50, 9, config, make_generator(2)).tokens
    b = sample_speculative(pair, prompt, 50, 9, config, make_generator(2)).tokens
    assert torch.equal(a, b)


class _Transformed(torch.nn.Module):
    """A draft whose logits are a function of another model's: to force all-accept / all-reject."""

    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn, self.config = model, fn, model.config

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits = self.fn(out.logits)
        return out


def test_all_chains_reject_at_once(pair, prompt):
    """Draft = negated target under top-k: disjoint supports, every draft token rejected, law intact."""
    hostile = ModelPair(pair.target, _Transformed(pair.target, lambda x: -x), pair.tokenizer, pair.vocab_size,
                        pair.device)
    config = SpeculativeConfig(k=4, sampling=SamplingConfig(top_k=20))
    p = first_token_law(pair, prompt, config.sampling)
    res = sample_speculative(hostile, prompt, 10_000, 2, config, make_generator(3))
    assert res.stats["acceptance"] == 0 and res.stats["tokens_per_target_pass"] == 1
    counts = np.bincount(res.tokens[:, 0].numpy(), minlength=len(p))
    assert stats.chisquare_identity(counts, p).pvalue > ALPHA


def test_all_chains_accept(pair, prompt):
    same = ModelPair(pair.target, pair.target, pair.tokenizer, pair.vocab_size, pair.device)
    res = sample_speculative(same, prompt, 200, 10, SpeculativeConfig(k=4), make_generator(4))
    assert res.stats["acceptance"] > 0.999 and res.stats["tokens_per_target_pass"] > 4.99


@pytest.mark.parametrize("length,steps,drafts", [(10, 2, 8), (7, 2, 5), (3, 1, 2), (1, 1, 0)])
def test_trim_drafts_only_what_a_chain_still_needs(pair, prompt, length, steps, drafts):
    """trim=True. Draft = target, so every draft is accepted and the schedule is deterministic: a chain missing r
    tokens drafts min(K, r − 1), never more than it can keep (L = 7, K = 4: 4 drafts emit 5 tokens,
    then 1 draft emits the last 2)."""
    same = ModelPair(pair.target, pair.target, pair.tokenizer, pair.vocab_size, pair.device)
    s = sample_speculative(same, prompt, 50, length, SpeculativeConfig(k=4, trim=True), make_generator(9)).stats
    assert s["chain_steps"] == 50 * steps and s["evaluated_drafts"] == 50 * drafts
    assert s["emitted_tokens"] == 50 * length  # nothing drafted past L, nothing truncated
    assert s["draft_passes"] == sum(min(4, r - 1) for r in _remaining(length, 4))  # one pass per drafted position


def _remaining(length: int, k: int) -> list[int]:
    """Tokens still missing at each step when every draft is accepted."""
    out, r = [], length
    while r > 0:
        out.append(r)
        r -= min(k, r - 1) + 1
    return out


@pytest.mark.parametrize("k,length", [(8, 3), (5, 1), (1, 1), (4, 5)])
def test_ragged_edges_give_exactly_length_tokens(pair, prompt, k, length):
    """K larger than L, chains of one token, and a last block that must be truncated."""
    res = sample_speculative(pair, prompt, 300, length, SpeculativeConfig(k=k), make_generator(k))
    assert res.tokens.shape == (300, length)
    assert (res.tokens >= 0).all() and (res.tokens < pair.vocab_size).all()


def test_first_token_law_when_k_exceeds_length(pair, prompt):
    p = first_token_law(pair, prompt, SamplingConfig())
    res = sample_speculative(pair, prompt, 8_000, 2, SpeculativeConfig(k=8), make_generator(6))
    counts = np.bincount(res.tokens[:, 0].numpy(), minlength=len(p))
    assert stats.chisquare_identity(counts, p).pvalue > ALPHA


def test_measured_tokens_per_pass_matches_theory(pair, prompt):
    res = sample_speculative(pair, prompt, 2000, 32, SpeculativeConfig(k=4), make_generator(8))
    s = res.stats
    assert 0.3 < s["acceptance"] < 1.0
    assert s["theory_tokens_per_target_pass"] == pytest.approx(expected_tokens_per_pass(s["acceptance"], 4))
    assert s["tokens_per_target_pass"] == pytest.approx(s["theory_tokens_per_target_pass"], rel=0.05)
    assert s["draft_passes"] == 4 * s["target_passes"]  # K draft passes per target pass


def test_trimmed_work_matches_theory(pair, prompt):
    """trim=True at L = 8: target passes per sample as the recursion in theory predicts at the
    measured α, fewer than at fixed K, and the full-K steps still emit (1 − α^{K+1})/(1 − α) tokens."""
    fixed = sample_speculative(pair, prompt, 2000, 8, SpeculativeConfig(k=4), make_generator(8)).stats
    s = sample_speculative(pair, prompt, 2000, 8, SpeculativeConfig(k=4, trim=True), make_generator(8)).stats
    work = expected_work_per_sample(s["acceptance"], 4, 8)
    assert s["chain_steps"] / 2000 == pytest.approx(work["target_passes"], rel=0.05)
    assert s["evaluated_drafts"] < fixed["evaluated_drafts"] and s["emitted_tokens"] == 2000 * 8
    assert s["tokens_per_target_pass"] == pytest.approx(s["theory_tokens_per_target_pass"], rel=0.05)


def test_bad_settings(pair, prompt):
    with pytest.raises(ValueError, match="k \\(draft tokens per step\\)"):
        SpeculativeConfig(k=0)
    with pytest.raises(ValueError, match="non-empty"):
        sample_speculative(pair, prompt[:0], 4, 4, SpeculativeConfig(), make_generator(0))
    with pytest.raises(ValueError, match="unknown faulty variant 'nope'; valid names: always_accept"):
        from specdec_lab.samplers.faulty import get
        get("nope")
    assert replace(SpeculativeConfig(), k=2).k == 2
    with pytest.raises(ValueError, match="trim must be True or False"):
        SpeculativeConfig(trim="yes")


@pytest.mark.parametrize("name,trim", [("leviathan", False), ("bonus_wrong_position", False),
                                       ("leviathan", True), ("residual_from_p", True)])
def test_positions_past_k_with_k4(pair, prompt, name, trim):
    """K=4 over L=6 tokens reaches the bonus token (position 5) and the next block: the correct rule
    passes the suite there, and a bonus drawn from the wrong position is caught at K=4 too. With
    trim (the second step drafts at most 0..4 tokens, by what each chain still needs) the correct
    rule still passes and a wrong residual is still caught. 6,000 samples: make verify rejects both faults at 4,000
    with Holm p ≈ 0 (README), and a correct rule's rejection rate is α at any m."""
    verifier = FAULTY.get(name) or CORRECT["K=4 T=1"].verifier
    config = SpeculativeConfig(k=4, verifier=verifier, trim=trim)
    res = sample_speculative(pair, prompt, 6_000, 6, config, make_generator(21))
    tokens = res.tokens.numpy()
    suite = run_suite(name, tokens, score(pair, prompt, tokens, config.sampling, SETTINGS.min_prefix_count),
                      SETTINGS, np.random.default_rng(21))
    if verifier.lossless:
        assert suite.verdict != "rejected", suite.verdict_text
    else:
        assert suite.verdict == "rejected", suite.verdict_text
