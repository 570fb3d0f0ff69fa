"""The notebooks' experiments (specdec_lab.experiments): scale knob, device, and each experiment function (cheap settings)."""

import numpy as np
import pytest
import torch

from specdec_lab import laws, plots
from specdec_lab.experiments import chi_square, negative_controls, proof_by_numbers, scale, worked_example
from specdec_lab.samplers.faulty import FAULTY, SMALL_EFFECT
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
        for field in ("samples", "equivalence_samples", "control_samples", "replicates", "replicate_samples", "power_reps", "chains",
                      "audit_samples", "kernel_vocab", "kernel_samples", "kernel_control_vocab", "kernel_control_samples"):
            assert getattr(full, field) >= getattr(ci, field), field

    def test_default_device(self):
        assert scale.default_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cached_logits_equal_uncached_and_are_reused(pair, prompt):
    plain = laws.model_logits_at(pair, prompt)
    cached = laws.cached_logits_at(pair, prompt)
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
    p = laws.first_token_law(pair, prompt)
    assert np.abs(laws.first_token_rule_law(pair, prompt, SpeculativeConfig()) - p).max() < 1e-12
    faulty = SpeculativeConfig(verifier=FAULTY["residual_from_p"])
    assert 0.5 * np.abs(laws.first_token_rule_law(pair, prompt, faulty) - p).sum() > 0.05


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
               plots.pit({"a": rng.random(50), "b": rng.random(50) ** 3}, verdicts={"a": "equivalent", "b": "rejected"}),
               plots.agreement_by_position(np.array([0.3, 0.1, 0.05]), 0.05)]
    for i, fig in enumerate(figures):
        assert plots.save(fig, tmp_path / f"{i}.png").stat().st_size > 0


def test_report_figures_read_the_verdict(tmp_path):
    import pandas as pd

    summary = pd.DataFrame({"sampler": ["naive", "faulty: bonus", "faulty: big"], "TV upper 99%": [0.015, 0.012, 0.3],
                            "expected": ["lossless", "negative control", "negative control"],
                            "verdict": ["equivalent", "rejected", "rejected"], "Holm p": [0.5, 1e-9, 0.0]})
    fig = plots.tv_bounds(summary, 0.02)
    colors = [patch.get_facecolor()[:3] for patch in fig.axes[0].patches]
    red = tuple(int(plots.VERDICT_COLORS["rejected"][i:i + 2], 16) / 255 for i in (1, 3, 5))
    assert np.allclose(colors[1], red, atol=1e-3), "a rejected control under ε must be drawn as rejected"
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert any("rejected by the tests, not the bound" in n for n in notes)
    assert fig._suptitle is not None and "coloured by" in fig._suptitle.get_text()
    p = np.array([0.5, 0.3, 0.2])
    fig = plots.first_token({"a": p}, p, tokens=["x", "y", "z"], samples=1000)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["x", "y", "z"]
    assert any("± 2 sd" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    fig = plots.pit({"flat": np.linspace(0, 1, 200), "spike": np.full(200, 0.5)})
    assert "flat = lossless" not in fig._suptitle.get_text() and "does not" in fig._suptitle.get_text()
    assert fig.axes[0].get_ylim()[1] <= 2.5 and "cut" in fig.axes[1].texts[0].get_text()
    fig = plots.pit({"flat": np.linspace(0, 1, 200)}, selection="the first row of two")
    assert "Shown: the first row of two" in " ".join(fig._suptitle.get_text().split())


class TestWorkedExample:
    def test_library_law_is_p_and_the_proof_table_adds_up(self):
        p, q = worked_example.P, worked_example.Q
        assert np.abs(worked_example.library_law(p, q) - p).max() < 1e-12
        table = worked_example.proof_table(p, q)
        assert np.allclose(table["kept = min(p, q)"] + table["ρ · r"], p)
        assert np.allclose(table["out = min(p, q) + ρ·r"], worked_example.library_law(p, q))

    def test_faulty_rule_differs_and_pieces_match_numpy(self):
        p, q = np.array([0.6, 0.1, 0.3]), np.array([0.1, 0.6, 0.3])
        assert np.abs(worked_example.library_law(p, q, "residual_from_p") - p).max() > 0.05
        pieces = worked_example.rule_pieces(p, q)
        assert np.allclose(pieces["library: accept min(1, p/q)"], np.minimum(1, p / q))
        assert np.allclose(pieces["library: residual norm((p−q)+)"], np.maximum(p - q, 0) / np.maximum(p - q, 0).sum())

    def test_zero_draft_mass_and_bad_input(self):
        p, q = np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.5, 0.5])
        assert np.abs(worked_example.library_law(p, q) - p).max() < 1e-12
        with pytest.raises(ValueError, match="sum to 1"):
            worked_example.library_law([0.5, 0.5, 0.5], q)

    def test_exact_law_of_rule_takes_a_user_function(self):
        p, q = worked_example.P, worked_example.Q

        def leviathan(p, q):
            return np.minimum(1, p / q), np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()

        def residual_q(p, q):
            return np.minimum(1, p / q), q

        def swapped(p, q):
            return np.minimum(1, q / p), np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()

        assert worked_example.exact_law_of_rule(leviathan).attrs["tv"] < 1e-12
        law = worked_example.exact_law_of_rule(residual_q)  # notebook 00, exercise 4
        assert np.allclose(law["out"], [0.28, 0.28, 0.44]) and abs(law.attrs["tv"] - 0.24) < 1e-12
        law = worked_example.exact_law_of_rule(swapped)  # exercise 5
        assert np.allclose(law["out"], [0.22, 0.18, 0.60]) and abs(law.attrs["tv"] - 0.4) < 1e-12
        by_name = worked_example.exact_law_of_rule("residual_from_p")
        assert np.allclose(by_name["out"], worked_example.library_law(p, q, "residual_from_p"))
        assert np.allclose(by_name["out"], [0.40, 0.32, 0.28]) and abs(by_name.attrs["tv"] - 0.1) < 1e-12
        assert worked_example.picture(p, q, swapped).axes
        with pytest.raises(ValueError, match="residual must be a law"):
            worked_example.exact_law_of_rule(lambda p, q: (np.ones(3), np.array([0.5, 0.5, 0.5])))
        with pytest.raises(ValueError, match="accept must lie in"):
            worked_example.exact_law_of_rule(lambda p, q: (p / q, p))

    def test_sampled_reading_says_what_a_pvalue_means(self):
        check = worked_example.sampled_check(worked_example.P, np.repeat([0, 1, 2], [5000, 3000, 2000]))
        assert "0 of 3" in worked_example.sampled_reading(check) and "not rejected" in worked_example.sampled_reading(check)
        check = worked_example.sampled_check(worked_example.P, np.repeat([0, 1, 2], [6000, 2000, 2000]))
        assert "rejected at α = 0.01" in worked_example.sampled_reading(check)

    def test_sampled_check_and_picture(self):
        rng = np.random.default_rng(0)
        draws = rng.choice(3, size=5000, p=worked_example.P)
        check = worked_example.sampled_check(worked_example.P, draws)
        assert check.attrs["m"] == 5000 and check.attrs["pearson p-value"] > 1e-4
        assert worked_example.picture(worked_example.P, worked_example.Q, draws=draws).axes


def test_block_argument_by_enumeration(pair, prompt):
    block = proof_by_numbers.block_argument(pair, prompt)
    right = block["tv"][~block["tv"]["rule"].str.startswith("✗")]
    wrong = block["tv"][block["tv"]["rule"].str.startswith("✗")]
    assert right["max |law − p|"].max() < 1e-12 and block["decomposition vs library"] < 1e-12
    assert len(wrong) == 2 and (wrong["exact TV"] > 0.05).all()
    for name, law in block["routes"].items():
        close = np.abs(law - block["p next"]).max() < 1e-12
        assert close != name.startswith("✗"), name


def test_first_token_tvs_are_at_most_the_two_token_tvs(pair, prompt):
    first = negative_controls.first_token_tvs(pair, prompt)
    assert list(first) == [f"faulty: {name}" for name in FAULTY]
    assert first["faulty: bonus_wrong_position"] < 1e-12  # its first step is correct
    parts = {part["name"].split(" ")[0]: part["tv"] for part in negative_controls.bug_anatomy(pair, prompt)}
    for name, tv in first.items():  # the bonus fault's and SMALL_EFFECT's panels show token 2
        if "bonus" not in name and name.removeprefix("faulty: ") not in SMALL_EFFECT:
            assert abs(tv - parts[name.removeprefix("faulty: ")]) < 1e-12, name
    table = negative_controls.faulty_table()
    assert (table["kind"] == "common error").sum() == 6 and (table["kind"] == "shipped bug").sum() == len(FAULTY) - 6


def test_bug_anatomy_covers_every_control(pair, prompt):
    parts = negative_controls.bug_anatomy(pair, prompt)
    assert [part["name"].split(" ")[0] for part in parts] == list(FAULTY)
    for part in parts:
        assert part["tv"] > (0.003 if part["name"].split(" ")[0] in SMALL_EFFECT else 0.02), part["name"]
        if "(token 1" in part["name"]:  # a token-2 panel (bonus, SMALL_EFFECT) carries the TV of tokens 1-2
            assert abs(0.5 * np.abs(part["kept"] + part["replaced"] - part["p"]).sum() - part["tv"]) < 1e-12
    assert plots.bug_anatomy(parts).axes
