"""Serving configs: the vLLM JSON parses and round-trips, the legacy flags come with their warning,
the TensorRT-LLM YAML parses, inputs are validated, and the memory check on hand-computed cases."""

import json
import shlex
from dataclasses import replace

import pytest
import yaml

from specdec_lab.serving import (METHODS, LegacyFlagsWarning, ServingConfig, check_memory, draft_spec,
                                 parse_vllm_command, trtllm_command, trtllm_settings, trtllm_yaml, vllm_argv,
                                 vllm_command, vllm_legacy_command, vllm_speculative_config)
from specdec_lab.theory import MODELS

SEED = ServingConfig("meta-llama/Llama-3.3-70B-Instruct", draft="meta-llama/Llama-3.2-1B-Instruct", k=5,
                     tensor_parallel=4, draft_tensor_parallel=1, gpu_memory_utilization=0.9, max_model_len=8192)

EVERY_METHOD = [
    SEED,
    replace(SEED, draft_tensor_parallel=None),
    ServingConfig("llama-8b", method="medusa", draft="FasterDecoding/medusa-llama-8b", k=4),
    ServingConfig("meta-llama/Llama-3.1-8B-Instruct", method="eagle", draft="yuhuili/EAGLE-LLaMA3-Instruct-8B",
                  k=2, tensor_parallel=4, draft_tensor_parallel=1),
    ServingConfig("meta-llama/Llama-3.1-8B-Instruct", method="eagle3",
                  draft="RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", k=3, tensor_parallel=2),
    ServingConfig("gpt2", method="ngram", k=5, prompt_lookup_max=4, prompt_lookup_min=2,
                  gpu_memory_utilization=1.0, max_model_len=1024),
    ServingConfig("some-org/my-model with spaces", draft="it's/quoted", k=1),  # unknown names: no shape check
]

LEGACY_FLAGS = ("--speculative-model", "--num-speculative-tokens", "--speculative-draft-tensor-parallel-size",
                "--ngram-prompt-lookup-max", "--ngram-prompt-lookup-min")


class TestVLLM:
    @pytest.mark.parametrize("config", EVERY_METHOD, ids=lambda c: c.method)
    def test_json_parses_and_round_trips(self, config):
        argv = shlex.split(vllm_command(config))
        assert argv == vllm_argv(config)
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == vllm_speculative_config(config)
        assert spec["method"] == config.method and spec["num_speculative_tokens"] == config.k
        assert spec.get("model") == config.draft
        assert parse_vllm_command(vllm_command(config)) == config
        assert not set(argv) & set(LEGACY_FLAGS)

    def test_seed_article_command(self):
        argv = vllm_argv(SEED)
        assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct"]
        flags = dict(zip(argv[3::2], argv[4::2]))
        assert flags["--tensor-parallel-size"] == "4" and flags["--max-model-len"] == "8192"
        assert float(flags["--gpu-memory-utilization"]) == 0.9
        assert json.loads(flags["--speculative-config"]) == {
            "method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5,
            "draft_tensor_parallel_size": 1}

    def test_ngram_keys(self):
        spec = vllm_speculative_config(EVERY_METHOD[5])
        assert spec == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                        "prompt_lookup_min": 2}

    def test_legacy_flags_warn(self):
        with pytest.warns(LegacyFlagsWarning, match="removed from vLLM in 2025"):
            text = vllm_legacy_command(SEED)
        comment, line = text.split("\n")
        assert comment.startswith("# WARNING:") and "--speculative-config" in comment
        argv = shlex.split(line)
        flags = dict(zip(argv[3::2], argv[4::2]))
        assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert flags["--model"] == SEED.target and flags["--speculative-model"] == SEED.draft
        assert flags["--num-speculative-tokens"] == "5" and flags["--speculative-draft-tensor-parallel-size"] == "1"
        with pytest.warns(LegacyFlagsWarning):
            ngram = shlex.split(vllm_legacy_command(EVERY_METHOD[5]).split("\n")[1])
        assert ngram[ngram.index("--speculative-model") + 1] == "[ngram]"
        assert ngram[ngram.index("--ngram-prompt-lookup-max") + 1] == "4"
        with pytest.raises(ValueError, match="no legacy-flag form"):
            vllm_legacy_command(EVERY_METHOD[4])

    def test_parse_refuses_other_commands(self):
        with pytest.raises(ValueError, match="not a `vllm serve"):
            parse_vllm_command("python -m vllm.entrypoints.openai.api_server --model x")
        with pytest.raises(ValueError, match="unexpected arguments"):
            parse_vllm_command("vllm serve x --enforce-eager 1")


class TestTensorRTLLM:
    @pytest.mark.parametrize("config", EVERY_METHOD, ids=lambda c: c.method)
    def test_yaml_parses(self, config):
        settings = trtllm_settings(config)
        assert yaml.safe_load(trtllm_yaml(config)) == settings
        spec = settings["speculative_config"]
        assert spec["decoding_type"] in {"DraftTarget", "Medusa", "Eagle", "Eagle3", "NGram"}
        assert spec["max_draft_len"] == config.k and spec.get("speculative_model") == config.draft

    def test_command(self):
        argv = shlex.split(trtllm_command(SEED, "spec.yaml"))
        assert argv[:2] == ["trtllm-serve", SEED.target] and argv[-2:] == ["--config", "spec.yaml"]
        assert argv[argv.index("--tp_size") + 1] == "4" and argv[argv.index("--max_seq_len") + 1] == "8192"
        assert "--backend" not in argv
        medusa = shlex.split(trtllm_command(EVERY_METHOD[2]))
        assert medusa[medusa.index("--backend") + 1] == "tensorrt"
        assert trtllm_settings(EVERY_METHOD[5])["speculative_config"]["max_matching_ngram_size"] == 4


class TestValidation:
    @pytest.mark.parametrize("kwargs, message", [
        ({"method": "lookahead"}, "valid names: draft_model, medusa, eagle, eagle3, ngram"),
        ({"method": "draft_model"}, "needs draft="),
        ({"method": "ngram", "draft": "x"}, "uses no draft model"),
        ({"draft": "d", "gpu_memory_utilization": 0.0}, "must lie in \\(0, 1\\]"),
        ({"draft": "d", "gpu_memory_utilization": 1.01}, "must lie in \\(0, 1\\]"),
        ({"draft": "d", "gpu_memory_utilization": -0.5}, "must lie in \\(0, 1\\]"),
        ({"draft": "d", "k": 0}, "k must be an integer >= 1"),
        ({"draft": "d", "tensor_parallel": 0}, "tensor_parallel must be"),
        ({"draft": "d", "tensor_parallel": 4, "draft_tensor_parallel": 2}, "must be 1 or equal"),
        ({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "exceeds prompt_lookup_max"),
    ])
    def test_bad_config(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            ServingConfig("t", **kwargs)

    def test_tensor_parallel_must_divide_heads(self):
        bad = replace(SEED, tensor_parallel=3, draft_tensor_parallel=None)
        for emit in (vllm_command, trtllm_command, lambda c: check_memory(c, "h100-sxm5")):
            with pytest.raises(ValueError, match="does not divide llama-70b's 64 attention heads"):
                emit(bad)
        with pytest.raises(ValueError, match="draft tensor parallel size 64 does not divide llama-1b's 32"):
            vllm_command(replace(SEED, tensor_parallel=64, draft_tensor_parallel=None))

    def test_unknown_names(self):
        with pytest.raises(ValueError, match="valid names"):
            check_memory(SEED, "b200")
        with pytest.raises(ValueError, match="unknown model"):
            check_memory(EVERY_METHOD[-1], "h100-sxm5")


GB = 1e9


class TestMemoryFit:
    def test_seed_article_case_by_hand(self):
        """70B + 1B, TP 4, draft TP 1, 8192 tokens, 4 × 80 GB at 0.9: fits, with these numbers."""
        fit = check_memory(SEED, "h100-sxm5")
        target_shard = 70_553_706_496 * 2 / 4                 # 35.28 GB
        draft = 1_235_814_400 * 2                             # 2.47 GB, whole on one GPU
        kv = 8192 * (2 * 80 * 8 * 128 * 2) / 4 + 8192 * (2 * 16 * 8 * 64 * 2)  # 0.67 + 0.27 GB
        assert fit.target_weights == target_shard and fit.draft_weights == draft
        assert fit.target_kv + fit.draft_kv == pytest.approx(kv)
        assert fit.needed == pytest.approx(target_shard + draft + kv)
        assert fit.allowed == 0.9 * 80 * GB and fit.fits
        assert fit.needed / GB == pytest.approx(38.69, abs=0.01)
        assert "fits: per GPU 35.28 GB target weights" in fit.sentence

    @pytest.mark.parametrize("tp, hardware, fits", [(1, "h100-sxm5", False), (2, "h100-sxm5", False),
                                                   (4, "h100-sxm5", True), (8, "h100-sxm5", True),
                                                   (1, "h200", False), (2, "h200", True), (8, "l40s", True),
                                                   (4, "l40s", True), (2, "l40s", False)])
    def test_known_cases(self, tp, hardware, fits):
        fit = check_memory(replace(SEED, tensor_parallel=tp, draft_tensor_parallel=1), hardware)
        assert fit.fits is fits
        assert fit.sentence.startswith("fits" if fits else "DOES NOT FIT")

    def test_small_models_fit_one_gpu(self):
        fit = check_memory(ServingConfig("llama-8b", draft="llama-1b", max_model_len=131_072), "h100-sxm5")
        assert fit.fits and fit.target_weights / GB == pytest.approx(16.06, abs=0.01)

    def test_max_sequences_is_the_boundary(self):
        base = check_memory(SEED, "h100-sxm5")
        n = base.max_sequences
        assert n > 1
        assert check_memory(replace(SEED, concurrent_sequences=n), "h100-sxm5").fits
        over = check_memory(replace(SEED, concurrent_sequences=n + 1), "h100-sxm5")
        assert not over.fits and f"room for {n} of {n + 1} sequences" in over.sentence

    def test_reserve_counts(self):
        tight = check_memory(SEED, "h100-sxm5", reserve_gb=34.0)
        assert tight.needed == pytest.approx(check_memory(SEED, "h100-sxm5").needed + 34 * GB) and not tight.fits

    def test_kv_heads_replicate_beyond_tp(self):
        """TP 16 > 8 KV heads: each GPU keeps one KV head (replicated), not half of one."""
        config = ServingConfig("llama-70b", method="ngram", tensor_parallel=16, max_model_len=1000)
        fit = check_memory(config, "h100-sxm5")
        assert fit.target_kv == 1000 * MODELS["llama-70b"].kv_bytes_per_token / 8
        assert fit.draft_weights == 0 and fit.draft_kv == 0

    def test_head_estimates(self):
        target = MODELS["llama-8b"]
        h, v = target.hidden_size, target.vocab_size
        medusa = draft_spec(ServingConfig("llama-8b", method="medusa", draft="m", k=4), target)
        assert medusa.parameters == 4 * (h * h + h + h * v)
        eagle = draft_spec(ServingConfig("llama-8b", method="eagle", draft="e"), target)
        eagle3 = draft_spec(ServingConfig("llama-8b", method="eagle3", draft="e"), target)
        assert eagle.parameters == pytest.approx(218_112_000 + 2 * h * h, rel=1e-6)  # one Llama-8B layer + fusion
        assert eagle3.parameters > eagle.parameters
        fit = check_memory(ServingConfig("llama-8b", method="medusa", draft="m", k=4), "h100-sxm5")
        assert fit.draft_kv == 0 and fit.draft_weights == medusa.weight_bytes
        assert draft_spec(ServingConfig("llama-8b", method="ngram"), target) is None


def test_every_method_has_a_verified_trtllm_name():
    assert {m.trtllm_decoding_type for m in METHODS.values()} == {"DraftTarget", "Medusa", "Eagle", "Eagle3",
                                                                  "NGram"}
