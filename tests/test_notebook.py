"""The notebooks' experiments (specdec_lab.experiments): scale knob, device, and each experiment function (cheap settings)."""

import numpy as np
import pytest
import torch

from specdec_lab import exact, plots
from specdec_lab.experiments import chi_square, negative_controls, proof_by_numbers, scale
from specdec_lab.samplers.faulty import FAULTY
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.suite import SuiteSettings


class TestScale:
    def test_default_is_ci(self, monkeypatch):
        monkeypatch.delenv(scale.SCALE_ENV, raising=False)
        assert scale.scale().name == "ci"

    def test_environment_chooses(self, monkeypatch):
        monkeypatch.setenv(scale.SCALE_ENV, "full")
        assert scale.scale() is scale.SCALES["full"]

    def test_unknown_scale_lists_valid_names(self, monkeypatch):
        monkeypatch.setenv(scale.SCALE_ENV, "huge")
        with pytest.raises(ValueError, match="valid scales: ci, full"):
            scale.scale()

    def test_full_is_larger_everywhere(self):
        ci, full = scale.SCALES["ci"], scale.SCALES["full"]
        for field in ("samples", "control_samples", "replicates", "replicate_samples", "power_reps", "chains",
                      "audit_samples", "kernel_vocab", "kernel_samples", "kernel_control_vocab", "kernel_control_samples"):
            assert getattr(full, field) >= getattr(ci, field), field

    def test_default_device(self):
        assert scale.default_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cached_logits_equal_uncached_and_are_reused(pair, prompt):
    plain = exact.model_logits_at(pair, prompt)
    cached = exact.cached_logits_at(pair, prompt)
    empty = torch.zeros(1, 0, dtype=torch.long)
    for a, b in zip(cached(empty), plain(empty)):
        assert torch.equal(a, b)
    assert cached(empty)[0] is cached(empty)[0]  # the second call is served from the memo


def test_exact_rule_table_separates_lossless_from_faulty(pair, prompt):
    runs = [("leviathan", SpeculativeConfig(k=2), True),
            ("always_accept", SpeculativeConfig(k=2, verifier=FAULTY["always_accept"]), False),
            ("not speculative", object(), True)]
    table = proof_by_numbers.exact_rule_table(pair, prompt, runs, length=2)
    assert list(table["rule"]) == ["leviathan", "always_accept"]
    assert table["exact TV"].iloc[0] < 1e-12 < 0.1 < table["exact TV"].iloc[1]


def test_first_token_rule_law_is_p_for_a_lossless_rule(pair, prompt):
    p = exact.first_token_law(pair, prompt)
    assert np.abs(exact.first_token_rule_law(pair, prompt, SpeculativeConfig()) - p).max() < 1e-12
    faulty = SpeculativeConfig(verifier=FAULTY["residual_from_p"])
    assert 0.5 * np.abs(exact.first_token_rule_law(pair, prompt, faulty) - p).sum() > 0.05


def test_same_seed_paths_differ_per_seed(pair, prompt):
    paths = proof_by_numbers.same_seed_paths(pair, prompt, 200, 4, seed=3)
    assert paths.naive.shape == paths.speculative.shape == (200, 4)
    assert paths.identical_chains < 0.5
    assert paths.agreement_by_position.shape == (4,)


def test_greedy_effects(pair, prompt):
    batch = proof_by_numbers.greedy_batch_effect(pair, prompt, 6, batch_sizes=(1, 4))
    assert batch["chains equal to batch-1 chain"].iloc[0] == 1.0
    assert (batch["max |logit difference|"] >= 0).all() and (batch["smallest top-2 logit gap"] >= 0).all()
    precision = proof_by_numbers.greedy_precision_effect(pair, prompt, 6, dtypes=("float32", "float32"))
    assert (precision["positions agreeing"] == 1.0).all()
    with pytest.raises(ValueError, match="valid dtypes"):
        proof_by_numbers.greedy_precision_effect(pair, prompt, 2, dtypes=("float32", "int8"))


def test_check_sampler_and_tables(pair, tmp_path):
    check = chi_square.check_sampler(pair, "speculative", SpeculativeConfig(k=2), True, "ROMEO:\n", 1500, 2,
                                   seed=1, settings=SuiteSettings(min_prefix_count=100, n_resamples=200),
                                   folder=tmp_path)
    assert check.tokens.shape == (1500, 2) and check.first_counts.sum() == 1500
    assert check.suite.verdict != "rejected"
    assert list(tmp_path.glob("*.parquet"))
    table = chi_square.conditional_table(pair, check)
    assert len(table) == len(check.scores.prefix_laws) > 0 and (table["position"] == 2).all()
    assert (table["visits"] >= 100).all()
    assert set(chi_square.suite_table(check)["test"]) == set(check.suite.tests)
    assert chi_square.summary([check])["sampler"].tolist() == ["speculative"]
    path = chi_square.tv_bound_path(check.tokens[:, 0], check.scores.first_law, [100, 1500])
    assert path["TV upper"].iloc[1] < path["TV upper"].iloc[0]


def test_power_curve_matches_noncentral_prediction():
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 41)
    p /= p.sum()
    q = 0.9 * p + 0.1 * np.roll(p, 3)
    curve = negative_controls.power_curve("planted", p, q, [200, 1000, 3000], reps=300, rng=rng)
    assert (np.abs(curve["simulated"] - curve["noncentral χ²"]) <= 4 * curve["se"] + 0.03).all()
    assert (curve["planner (worst case)"] <= curve["noncentral χ²"] + 1e-9).all()  # worst case is a lower bound
    assert curve["simulated"].iloc[-1] > curve["simulated"].iloc[0]


def test_replicate_pvalues_small_for_a_bug(pair, prompt):
    bad = negative_controls.replicate_pvalues(pair, SpeculativeConfig(k=1, verifier=FAULTY["always_accept"]), prompt,
                                     replicates=4, m=400, seed=0)
    assert bad.shape == (4,) and (bad < 1e-3).all()


def test_plots_return_figures(tmp_path):
    rng = np.random.default_rng(0)
    p = np.full(8, 1 / 8)
    figures = [plots.observed_vs_expected(rng.multinomial(100, p), p),
               plots.step_decomposition(p, p, p / 2, p / 2),
               plots.pvalue_histograms({"a": rng.random(20)}),
               plots.pit({"a": rng.random(50)})]
    for i, fig in enumerate(figures):
        assert plots.save(fig, tmp_path / f"{i}.png").stat().st_size > 0
