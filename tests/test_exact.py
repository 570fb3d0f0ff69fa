"""The proof by numbers: the exact output law of each rule, on real and adversarial p, q."""

import pytest
import torch

from specdec_lab.laws import markov_logits_at, model_logits_at, sequence_law, step_law, tv
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.samplers.faulty import FAULTY, SMALL_EFFECT
from specdec_lab.samplers.naive import NaiveConfig, sample_naive
from specdec_lab.samplers.rules import LEVIATHAN, LOSSLESS, POINT_MASS

CONFIGS = [SamplingConfig(), SamplingConfig(temperature=0.7), SamplingConfig(top_k=20),
           SamplingConfig(top_p=0.9), SamplingConfig(temperature=1.3, top_k=50, top_p=0.95)]


@pytest.fixture(scope="module")
def real_logits(pair):
    """Target and draft logits at 768 real prefixes: 64 sampled continuations x 12 positions."""
    prompts = ["ROMEO:\n", "KING.\nWhat", "First Citizen:\nBefore we proceed", "O"]
    target, draft = [], []
    for i, text in enumerate(prompts):
        ids = pair.encode(text)
        cont = sample_naive(pair, ids, 16, 12, NaiveConfig(), make_generator(i)).tokens
        seqs = torch.cat([ids.expand(16, -1), cont], dim=1)
        with torch.no_grad():
            t = pair.target(seqs).logits[:, -12:, : pair.vocab_size]
            d = pair.draft(seqs).logits[:, -12:, : pair.vocab_size]
        target.append(t.reshape(-1, pair.vocab_size).double())
        draft.append(d.reshape(-1, pair.vocab_size).double())
    return torch.cat(target), torch.cat(draft)  # (768, V) each


@pytest.mark.parametrize("verifier", LOSSLESS.values(), ids=LOSSLESS.keys())
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: str(c.describe()))
def test_lossless_rules_reproduce_p_on_real_distributions(real_logits, verifier, config):
    target_logits, draft_logits = real_logits
    law = step_law(target_logits, draft_logits, config, verifier)  # (768, V)
    p = to_probs(target_logits, config)
    assert (law - p).abs().max() < 1e-12
    # the check has teeth: the draft really differs from the target at these prefixes
    assert tv(to_probs(draft_logits, config), p).mean() > 0.05


def _log(p):
    return torch.log(torch.tensor(p, dtype=torch.float64))


ADVERSARIAL = {
    "disjoint supports": ([0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]),
    "q equals p": ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
    "q one-hot": ([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 0]),
    "p one-hot": ([0, 1, 0, 0], [0.25, 0.25, 0.25, 0.25]),
    "q peaked where p is flat": ([0.25, 0.25, 0.25, 0.25], [0.97, 0.01, 0.01, 0.01]),
    "q misses p's mode": ([0.9, 0.05, 0.05, 0], [0, 0.3, 0.3, 0.4]),
    "tiny probabilities": ([1 - 3e-12, 1e-12, 1e-12, 1e-12], [1e-12, 1e-12, 1e-12, 1 - 3e-12]),
}


@pytest.mark.parametrize("verifier", LOSSLESS.values(), ids=LOSSLESS.keys())
@pytest.mark.parametrize("case", ADVERSARIAL, ids=ADVERSARIAL)
def test_lossless_rules_on_adversarial_cases(verifier, case):
    p, q = ADVERSARIAL[case]
    law = step_law(_log(p), _log(q), SamplingConfig(), verifier)
    assert (law - torch.tensor(p, dtype=torch.float64)).abs().max() < 1e-12


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("verifier", LOSSLESS.values(), ids=LOSSLESS.keys())
def test_first_three_tokens_small_vocabulary(k, verifier):
    g = torch.Generator().manual_seed(k)
    V = 7
    target = torch.log_softmax(3 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    draft = torch.log_softmax(3 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    law = sequence_law(markov_logits_at(target, draft), V, k, 3, SamplingConfig(), verifier)
    assert law.max_abs_error < 1e-12
    assert abs(float(law.law.sum()) - 1) < 1e-12


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: str(c.describe()))
def test_first_two_tokens_real_models(pair, prompt, k, config):
    law = sequence_law(model_logits_at(pair, prompt), pair.vocab_size, k, 2, config, LEVIATHAN)
    assert law.max_abs_error < 1e-12
    assert law.law.shape == (pair.vocab_size, pair.vocab_size)


@pytest.fixture(scope="module")
def faulty_tvs(pair, prompt):
    """Exact TV from p of the first two tokens for every negative control, in its own settings."""
    out = {}
    for name, verifier in FAULTY.items():
        needs = dict(verifier.needs or {})
        k = needs.pop("k", 4)
        law = sequence_law(model_logits_at(pair, prompt), pair.vocab_size, k, 2, SamplingConfig(**needs), verifier)
        out[name] = law.tv
    return out


@pytest.mark.parametrize("name", sorted(FAULTY))
def test_every_faulty_rule_has_a_real_exact_effect(faulty_tvs, name):
    floor = 0.003 if name in SMALL_EFFECT else 0.04  # SMALL_EFFECT: run at the larger control size (test_speculative)
    assert faulty_tvs[name] > floor, f"{name}: exact TV {faulty_tvs[name]:.2e} too small to be a control"


def test_faulty_rules_differ_in_the_adversarial_case():
    p, q = ADVERSARIAL["q misses p's mode"]
    for name in ("always_accept", "residual_from_p", "residual_from_q", "swapped_ratio", "argmax_draft_softmax_q"):
        law = step_law(_log(p), _log(q), SamplingConfig(), FAULTY[name])
        assert tv(law, torch.tensor(p, dtype=torch.float64)) > 0.05, name


def test_point_mass_is_the_greedy_draft_rule():
    """With a one-hot q the rule keeps the draft with probability p(x) and resamples p without x."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    from specdec_lab.laws import step_parts
    kept, replaced = step_parts(torch.log(p), torch.log(torch.tensor([0.2, 0.7, 0.1], dtype=torch.float64)),
                                SamplingConfig(), POINT_MASS)
    torch.testing.assert_close(kept, torch.tensor([0.0, 0.3, 0.0], dtype=torch.float64))
    without = torch.tensor([0.5, 0.0, 0.2], dtype=torch.float64) / 0.7
    torch.testing.assert_close(replaced, 0.7 * without)
