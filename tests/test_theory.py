"""Speedup theory: hand-checked limits, a Monte Carlo cross-check of E[tokens per pass], brute-force
optimal K, the roofline against the seed article's numbers, model presets against their shapes and
the bundled files, acceptance α = 1 − TV, and the `calibrate` command."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_lab import theory
from specdec_lab.cli import main
from specdec_lab.theory import (HARDWARE, MODELS, ModelSpec, acceptance_rate, compute_bound_batch,
                                decode_roofline, draft_cost_ratio, expected_speedup, expected_tokens_per_pass,
                                measure_acceptance, optimal_k, roofline_speedup, speedup_table)

ROOT = Path(__file__).resolve().parent.parent


class TestExpectedTokensPerPass:
    @pytest.mark.parametrize("alpha, k, expected", [
        (0.0, 0, 1.0), (0.0, 7, 1.0),          # nothing accepted: the target's own token only
        (0.5, 0, 1.0), (0.99, 0, 1.0),         # K = 0: plain decoding
        (1.0, 0, 1.0), (1.0, 4, 5.0), (1.0, 10, 11.0),  # everything accepted: K drafts + bonus
        (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, 3.3616),
    ])
    def test_hand_checked_cases(self, alpha, k, expected):
        assert expected_tokens_per_pass(alpha, k) == pytest.approx(expected, abs=1e-12)

    @pytest.mark.parametrize("k", [1, 4, 16, 100])
    def test_alpha_to_one_is_continuous(self, k):
        for gap in (1e-6, 1e-9, 1e-12):
            assert expected_tokens_per_pass(1 - gap, k) == pytest.approx(k + 1, rel=2 * k * gap + 1e-14)
            assert expected_tokens_per_pass(1 - gap, k) < k + 1

    def test_equals_geometric_sum(self):
        for alpha in np.linspace(0.01, 0.99, 25):
            for k in (1, 3, 8):
                assert expected_tokens_per_pass(alpha, k) == pytest.approx(sum(alpha ** i for i in range(k + 1)))

    def test_monte_carlo(self):
        """Independent route: simulate K i.i.d. accept/reject draws per pass, stop at the first reject."""
        rng = np.random.default_rng(0)
        for alpha, k in ((0.3, 2), (0.75, 4), (0.9, 8)):
            accepted = rng.random((100_000, k)) < alpha  # (N, K)
            n_kept = np.where(accepted.all(1), k, np.argmin(accepted, axis=1))  # first rejection index
            tokens = n_kept + 1
            se = tokens.std() / math.sqrt(len(tokens))
            assert abs(tokens.mean() - expected_tokens_per_pass(alpha, k)) < 5 * se

    @pytest.mark.parametrize("alpha, k", [(-0.1, 4), (1.1, 4), (float("nan"), 4), (0.5, -1), (0.5, 2.5)])
    def test_bad_input(self, alpha, k):
        with pytest.raises(ValueError):
            expected_tokens_per_pass(alpha, k)


class TestSpeedup:
    def test_limits(self):
        assert expected_speedup(0.7, 0, 0.3) == 1.0                         # K = 0: unchanged
        assert expected_speedup(0.0, 5, 0.1) == pytest.approx(1 / 1.5)      # α = 0: pure overhead
        assert expected_speedup(1.0, 5, 0.1) == pytest.approx(6 / 1.5)      # α = 1
        assert expected_speedup(0.8, 4, 0.0) == expected_tokens_per_pass(0.8, 4)  # free draft

    @pytest.mark.parametrize("c", [-0.1, float("inf"), float("nan")])
    def test_bad_cost(self, c):
        with pytest.raises(ValueError, match="c \\(draft/target cost ratio\\)"):
            expected_speedup(0.5, 2, c)

    def test_optimal_k_against_brute_force(self):
        for alpha in (0.2, 0.5, 0.7, 0.8, 0.9, 0.95):
            for c in (0.01, 0.05, 0.2, 0.5):
                speedups = [expected_speedup(alpha, k, c) for k in range(31)]
                best = optimal_k(alpha, c, k_max=30)
                assert speedups[best] == max(speedups)
                assert all(s < speedups[best] for s in speedups[:best])  # smallest K on ties

    def test_optimal_k_edges(self):
        assert optimal_k(0.0, 0.01) == 0        # nothing is ever accepted: do not speculate
        assert optimal_k(0.5, 1.0) == 0         # a draft as slow as the target never pays
        assert optimal_k(1.0, 0.1, k_max=12) == 12  # α = 1: the search range decides
        assert optimal_k(0.8, 0.05, k_max=0) == 0

    def test_table(self):
        table = speedup_table(0.75, 0.05, k_max=10)
        assert list(table.K) == list(range(11)) and table.best.sum() == 1
        assert table.loc[table.best, "K"].item() == optimal_k(0.75, 0.05, 10)
        assert table.speedup[0] == 1.0 and table["tokens/pass"][0] == 1.0


class TestRoofline:
    def test_seed_article_numbers(self):
        """70B in fp16 is 140 GB; on one H100 SXM5 (3.35 TB/s) that caps batch-1 decoding near 24 tokens/s."""
        spec = replace(MODELS["llama-70b"], parameters=70_000_000_000)
        r = decode_roofline(spec, "h100-sxm5")
        assert spec.weight_bytes == 140e9
        assert r.tokens_per_s == pytest.approx(3.35e12 / 140e9) and round(r.tokens_per_s) == 24
        assert r.bound == "memory" and r.compute_utilisation < 0.05  # "idling at less than 5%"

    def test_bound_switches_at_compute_bound_batch(self):
        for name in ("h100-sxm5", "a100-80gb", "l40s"):
            b = compute_bound_batch("llama-70b", name)
            assert decode_roofline("llama-70b", name, batch=b - 1).bound == "memory"
            assert decode_roofline("llama-70b", name, batch=b).bound == "compute"
            hw = HARDWARE[name]
            assert b == pytest.approx(2 * hw.flops / (2 * hw.bandwidth), abs=1)  # bytes/param × ridge / 2

    def test_memory_bound_throughput_scales_with_batch(self):
        one, eight = (decode_roofline("llama-8b", "h200", batch=b) for b in (1, 8))
        assert eight.tokens_per_s == pytest.approx(8 * one.tokens_per_s, rel=1e-3)

    def test_kv_cache_and_gpus(self):
        spec = MODELS["llama-70b"]
        r = decode_roofline(spec, "h100-sxm5", batch=4, context=1000)
        assert r.kv_bytes == 4 * 1000 * 327_680
        assert r.flops == 4 * (2 * spec.parameters + 4 * 80 * 64 * 128 * 1000)
        split = decode_roofline(spec, "h100-sxm5", batch=4, context=1000, gpus=4)
        assert split.step_time_s == pytest.approx(r.step_time_s / 4)

    def test_long_context_never_compute_bound(self):
        assert compute_bound_batch("llama-70b", "h100-sxm5", context=100_000) is None
        assert decode_roofline("llama-70b", "h100-sxm5", batch=4096, context=100_000).bound == "memory"

    def test_draft_ratio_and_roofline_speedup(self):
        c = draft_cost_ratio("llama-70b", "llama-1b", "h100-sxm5")
        assert c == pytest.approx(MODELS["llama-1b"].weight_bytes / MODELS["llama-70b"].weight_bytes)
        # memory-bound: the roofline's cycle is exactly Leviathan's K c + 1
        assert roofline_speedup(0.8, 4, "llama-70b", "llama-1b", "h100-sxm5") == \
            pytest.approx(expected_speedup(0.8, 4, c))
        # a compute-bound verification pass over K + 1 tokens costs K + 1 times more: speculation loses
        assert roofline_speedup(0.8, 4, "llama-70b", "llama-1b", "h100-sxm5", batch=512) < 1

    def test_names_are_validated(self):
        with pytest.raises(ValueError, match="valid names: .*h100-sxm5"):
            decode_roofline("llama-70b", "h100")
        with pytest.raises(ValueError, match="valid names: .*llama-70b"):
            decode_roofline("llama-3-70b", "h100-sxm5")
        with pytest.raises(ValueError, match="batch must be"):
            decode_roofline("gpt2", "l40s", batch=0)
        with pytest.raises(ValueError, match="kv_heads"):
            ModelSpec("odd", 10, layers=1, hidden_size=8, attention_heads=6, kv_heads=4, head_dim=2, vocab_size=4)


def llama_parameters(spec: ModelSpec, intermediate: int) -> int:
    """Parameter count of a Llama model from its shape (independent of the stored count)."""
    h = spec.hidden_size
    attention = h * spec.attention_heads * spec.head_dim * 2 + h * spec.kv_heads * spec.head_dim * 2
    layer = attention + 3 * h * intermediate + 2 * h
    embeddings = spec.vocab_size * h * (1 if spec.tied_embeddings else 2)
    return spec.layers * layer + embeddings + h


class TestPresets:
    @pytest.mark.parametrize("name, intermediate", [("llama-70b", 28_672), ("llama-8b", 14_336),
                                                    ("llama-1b", 8_192)])
    def test_llama_counts_match_shapes(self, name, intermediate):
        assert llama_parameters(MODELS[name], intermediate) == MODELS[name].parameters

    @pytest.mark.parametrize("name, kv", [("llama-70b", 327_680), ("llama-8b", 131_072), ("llama-1b", 32_768)])
    def test_kv_bytes_per_token(self, name, kv):
        assert MODELS[name].kv_bytes_per_token == kv

    @pytest.mark.parametrize("role", ["target", "draft"])
    def test_bundled_presets_match_files(self, role):
        from safetensors import safe_open

        spec = MODELS[f"bundled-{role}"]
        config = json.loads((ROOT / "specdec_lab/bundled" / role / "config.json").read_text())
        assert (spec.layers, spec.hidden_size, spec.attention_heads, spec.kv_heads, spec.head_dim,
                spec.vocab_size, spec.tied_embeddings) == \
            (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
             config["num_key_value_heads"], config["head_dim"], config["vocab_size"], config["tie_word_embeddings"])
        with safe_open(ROOT / "specdec_lab/bundled" / role / "model.safetensors", "pt") as f:
            stored = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        assert stored == spec.parameters
        assert llama_parameters(spec, config["intermediate_size"]) == spec.parameters


class TestAcceptance:
    def test_one_minus_tv(self):
        rng = np.random.default_rng(1)
        p, q = rng.dirichlet(np.ones(50), size=20), rng.dirichlet(np.ones(50), size=20)  # (20, 50)
        alpha = acceptance_rate(p, q)
        assert alpha.shape == (20,)
        np.testing.assert_allclose(alpha, 1 - 0.5 * np.abs(p - q).sum(1), atol=1e-12)
        assert acceptance_rate(torch.tensor(p[0]), torch.tensor(q[0])) == pytest.approx(alpha[0])
        assert acceptance_rate(p[0], p[0]) == pytest.approx(1.0)

    @pytest.mark.parametrize("p, q", [([0.5, 0.5], [0.5, 0.4]), ([1.2, -0.2], [0.5, 0.5]), ([1.0], [0.5, 0.5])])
    def test_bad_laws(self, p, q):
        with pytest.raises(ValueError):
            acceptance_rate(p, q)

    def test_bundled_pair(self, pair):
        text = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
        alpha = measure_acceptance(pair, text)
        assert 0.5 < alpha < 0.95  # distilled draft: 0.75 on held-out plays (README)
        assert measure_acceptance(replace(pair, draft=pair.target), text) == pytest.approx(1.0, abs=1e-12)


class TestCalibrateCommand:
    def test_alpha_and_c(self, tmp_path, capsys):
        figure = tmp_path / "speedup.png"
        assert main(["calibrate", "--alpha", "0.75", "--c", "0.05", "--k-max", "10", "--plot", str(figure)]) == 0
        out = capsys.readouterr().out
        assert f"best K = {optimal_k(0.75, 0.05, 10)}" in out and "2.666" in out
        assert figure.stat().st_size > 0

    def test_roofline_c(self, capsys):
        assert main(["calibrate", "--alpha", "0.8", "--model", "llama-70b", "--draft-model", "llama-1b",
                     "--hardware", "h100-sxm5"]) == 0
        out = capsys.readouterr().out
        assert "23.7 tokens/s" in out and "c = draft step / target step = 0.01752" in out
        assert "roofline speedup" in out

    def test_zero_is_an_answer(self, capsys):
        assert main(["calibrate", "--alpha", "0.1", "--c", "0.5"]) == 0
        assert "best K = 0: do not speculate" in capsys.readouterr().out

    def test_samples_file(self, pair, tmp_path, capsys):
        from specdec_lab.collect import collect
        from specdec_lab.samplers.naive import NaiveConfig
        from specdec_lab.samplers.speculative import SpeculativeConfig

        spec_file, naive_file = tmp_path / "spec.parquet", tmp_path / "naive.parquet"
        samples = collect(pair, SpeculativeConfig(k=4), ["ROMEO:\n"], n=64, length=4, seed=0, path=spec_file,
                          progress=False)
        collect(pair, NaiveConfig(), ["ROMEO:\n"], n=8, length=2, seed=0, path=naive_file, progress=False)
        assert main(["calibrate", "--samples", str(spec_file), "--c", "0.05"]) == 0
        out = capsys.readouterr().out
        alpha = samples.meta["stats"]["acceptance"]
        assert f"measured α = {alpha:.4f}" in out and f"best K = {optimal_k(alpha, 0.05, 10)}" in out
        assert main(["calibrate", "--samples", str(naive_file), "--c", "0.05"]) == 2
        assert "no measured acceptance" in capsys.readouterr().err

    @pytest.mark.parametrize("argv, message", [
        (["--c", "0.05"], "exactly one of --alpha"),
        (["--alpha", "0.5", "--alpha", "0.5", "--samples", "x.parquet", "--c", "0.1"], "exactly one of --alpha"),
        (["--alpha", "0.5"], "either --c"),
        (["--alpha", "0.5", "--c", "0.1", "--model", "llama-70b", "--draft-model", "llama-1b",
          "--hardware", "h200"], "either --c"),
        (["--alpha", "0.5", "--model", "llama-70b"], "go together"),
        (["--alpha", "1.5", "--c", "0.1"], "alpha must lie in"),
        (["--alpha", "0.5", "--model", "llama-70b", "--draft-model", "llama-1b", "--hardware", "tpu"],
         "valid names"),
    ])
    def test_bad_arguments(self, argv, message, capsys):
        assert main(["calibrate", *argv]) == 2
        assert message in capsys.readouterr().err


def test_module_table_names_are_unique():
    assert len({spec.hf_id for spec in MODELS.values() if spec.hf_id}) == sum(1 for s in MODELS.values() if s.hf_id)
    assert theory.get_model(MODELS["gpt2"]) is MODELS["gpt2"]
