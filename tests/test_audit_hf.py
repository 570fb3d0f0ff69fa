"""Audit of Hugging Face ``generate`` (assisted generation, prompt lookup) against the exact target law.

HF runs at batch 1 (≈ 30 ms per sample here), so the sample sizes are small and their power is
stated: at m = 3,000 the first-token Pearson test (about 34 bins after tail merging) detects any
TV ≥ 0.08 with power ≥ 0.99 at α = 1e-3 (worst case, :func:`specdec_lab.stats.power_chisquare`).
The negative control (HF asked for T = 0.7, scored at T = 1) is a real model-law alternative whose
exact power is computed from its noncentrality and asserted.
"""

import json

import numpy as np
import pytest
import scipy.stats as sps
import torch

from specdec_lab import stats
from specdec_lab.adapters.hf import MODES, HFGenerateConfig, generate_kwargs, sample_hf
from specdec_lab.audit import AuditCase, audit, run_audits
from specdec_lab.cli import main
from specdec_lab.collect import load_samples
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.suite import SuiteSettings

from helpers import first_token_law

ALPHA = 1e-3
SETTINGS = SuiteSettings(alpha=ALPHA)
LOOKUP_PROMPT = "ROMEO:\nGood night, good night!\nJULIET:\nGood night, good"


def exact_power(p_asked: np.ndarray, p_scored: np.ndarray, m: int, alpha: float = ALPHA) -> float:
    """Power of the merged-bin Pearson test at m when samples follow p_asked and the null is p_scored."""
    keep, tail = stats.merge_tail(p_scored, m)
    bins_p = np.append(p_scored[keep], p_scored[tail].sum())
    bins_q = np.append(p_asked[keep], p_asked[tail].sum())
    lam = m * float(((bins_q - bins_p) ** 2 / bins_p).sum())
    df = len(bins_p) - 1
    return float(sps.ncx2.sf(sps.chi2.isf(alpha, df), df, lam))


@pytest.fixture(scope="module")
def assisted(pair, tmp_path_factory):
    """HF assisted generation at T = 1, 3,000 samples of L = 2 (the first step drafts one token)."""
    path = tmp_path_factory.mktemp("hf") / "assisted.parquet"
    sampler = HFGenerateConfig(mode="assisted", progress=False)
    return audit(pair, sampler, 3000, 2, path, prompt="ROMEO:\n", seed=11, settings=SETTINGS, progress=False), path


class TestAssisted:
    def test_not_rejected_with_stated_power(self, assisted, pair, prompt):
        result, _ = assisted
        p = first_token_law(pair, prompt, SamplingConfig())
        keep, tail = stats.merge_tail(p, result.suite.m)
        bins = int(keep.sum()) + int(tail.any())
        assert stats.power_chisquare(result.suite.m, 0.08, bins, ALPHA) >= 0.99
        assert result.suite.verdict != "rejected", result.tests()
        assert result.suite.tests["pearson (first token)"].pvalue >= ALPHA
        assert result.suite.tv_plugin < 0.08

    def test_speculation_happened(self, assisted):
        stats_ = assisted[0].samples.meta["stats"]
        assert stats_["draft_passes"] > 0
        assert stats_["target_passes"] < stats_["emitted_tokens"]  # some drafts accepted: > 1 token per pass

    def test_bounded_position_drafted_per_hf_candidates(self, assisted):
        """HF's first step drafts from the prompt, so token 1 (inside the bounded tokens 1–2) is a verified
        draft in every sample; at L = 2 token 2 never is (HF caps candidates at L − 1 − drafted so far)."""
        result, _ = assisted
        evidence, stats_ = result.drafting, result.samples.meta["stats"]
        assert evidence.position == 1 and evidence.share == 1.0 and 0.3 < evidence.acceptance < 1.0
        assert stats_["drafted@2"] <= stats_["drafted@1"] - stats_["accepted@1"]  # only after a rejection
        row = result.summary()
        assert row["bounded positions"] == "1–2 (joint)" and row["drafted share"] == "1.000 (token 1)"

    def test_metadata_records_version_and_mode(self, assisted):
        import transformers

        result, path = assisted
        described = result.samples.meta["sampler"]
        assert described["transformers_version"] == transformers.__version__
        assert described["mode"] == "assisted" and described["k"] == 4
        assert load_samples(path).meta["sampler"] == described  # the file on disk carries the same


def test_negative_control_mismatched_temperature_rejected(pair, prompt, tmp_path):
    """HF asked for T = 0.7 but scored at T = 1: the same adapter path must reject it."""
    m = 800
    asked, scored = SamplingConfig(temperature=0.7), SamplingConfig()
    power = exact_power(first_token_law(pair, prompt, asked), first_token_law(pair, prompt, scored), m)
    assert power >= 0.99  # this alternative (exact first-token TV 0.116) cannot slip through by chance
    result = audit(pair, HFGenerateConfig(mode="assisted", sampling=asked, progress=False), m, 2,
                   tmp_path / "neg.parquet", prompt="ROMEO:\n", seed=12, scored_at=scored, expected="negative control",
                   settings=SETTINGS, progress=False)
    assert result.suite.verdict == "rejected"
    assert result.summary()["correct call"]
    assert "scored at T=1" in result.summary()["settings"]


def test_prompt_lookup_not_rejected(pair, tmp_path):
    """Prompt lookup (point-mass rule) at T = 1, L = 3, a prompt whose n-grams recur."""
    m = 600
    ids = pair.encode(LOOKUP_PROMPT)
    p = first_token_law(pair, ids, SamplingConfig())
    keep, tail = stats.merge_tail(p, m)
    assert stats.power_chisquare(m, 0.15, int(keep.sum()) + int(tail.any()), ALPHA) >= 0.9
    table = run_audits(pair, [AuditCase(HFGenerateConfig(mode="prompt_lookup", progress=False),
                                        prompt=LOOKUP_PROMPT)], m, 3, tmp_path, seed=13,
                       settings=SETTINGS, progress=False)
    row = table.iloc[0]
    assert row["verdict"] != "rejected", table.attrs["results"][0].tests()
    assert row["tokens/pass"] > 1.0  # candidates were proposed and some accepted
    assert table.attrs["results"][0].drafting.share >= 0.5, row["drafted share"]  # HF's own candidate lengths
    assert row["implementation"].endswith("prompt_lookup K=4")


class TestAdapterMechanics:
    def test_unknown_mode_lists_valid_modes(self):
        with pytest.raises(ValueError, match="valid modes: " + ", ".join(MODES)):
            HFGenerateConfig(mode="medusa")

    @pytest.mark.parametrize("field, value", [("k", 0), ("schedule", "sometimes"), ("confidence_threshold", 1.0)])
    def test_bad_settings_refused(self, field, value):
        with pytest.raises(ValueError):
            HFGenerateConfig(**{field: value})

    def test_forced_settings(self, pair):
        kw = generate_kwargs(pair, HFGenerateConfig(sampling=SamplingConfig(temperature=0.7, top_p=0.9)), 5)
        assert (kw["top_k"], kw["top_p"], kw["temperature"]) == (0, 0.9, 0.7)  # no HF default top-k 50
        assert kw["min_new_tokens"] == kw["max_new_tokens"] == 5 and kw["eos_token_id"] is None
        assert kw["repetition_penalty"] == 1.0 and kw["min_p"] is None
        assert kw["assistant_model"] is pair.draft

    def test_reproducible_and_global_rng_restored(self, pair, prompt):
        config = HFGenerateConfig(progress=False)
        before = torch.random.get_rng_state()
        a = sample_hf(pair, prompt, 6, 3, config, make_generator(5)).tokens
        assert torch.equal(torch.random.get_rng_state(), before)
        b = sample_hf(pair, prompt, 6, 3, config, make_generator(5)).tokens
        assert torch.equal(a, b) and a.shape == (6, 3)
        assert pair.draft.generation_config.num_assistant_tokens is None  # our K was not left behind

    def test_greedy_assisted_equals_greedy_target(self, pair, prompt):
        config = HFGenerateConfig(sampling=SamplingConfig(temperature=0), progress=False)
        tokens = sample_hf(pair, prompt, 1, 6, config, make_generator(0)).tokens[0]
        x, laws = prompt.clone(), []
        with torch.no_grad():
            for _ in range(6):
                nxt = to_probs(pair.target(x[None]).logits[0, -1, : pair.vocab_size], SamplingConfig()).argmax()
                laws.append(int(nxt))
                x = torch.cat([x, nxt[None]])
        assert tokens.tolist() == laws


def test_cli_audit_hf(tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    code = main(["audit", "hf", "--mode", "plain", "--samples", "30", "--length", "2", "--out", str(out),
                 "--quiet"])
    printed = capsys.readouterr().out
    # 30 samples cannot reach equivalence: inconclusive exits 3, a rejection 1; the verdict is printed either way
    record = json.loads(out.with_suffix(".results.json").read_text())
    verdict = record["rows"][0]["verdict"]
    assert code == {"inconclusive": 3, "rejected": 1}[verdict] == record["exit_status"]
    assert record["rows"][0]["m"] == 30 and record["rows"][0]["bounded positions"] == "1–2 (joint)"
    assert "HF transformers" in printed and "plain" in printed and out.exists()
    assert "TV of tokens 1–2 (joint)" in printed and "no speculation" in printed
