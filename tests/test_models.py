"""Model loading: the bundled pair, its manifest, and every documented error."""

import json
import shutil

import pytest
import torch

from specdec_lab import models
from specdec_lab.models import ModelLoadError, check_same_vocabulary, load_pair, verify_manifest


@pytest.fixture
def bundle_copy(tmp_path):
    copy = tmp_path / "models"
    shutil.copytree(models.BUNDLED_DIR, copy)
    return copy


def test_bundled_pair_loads(pair):
    assert pair.vocab_size == len(pair.tokenizer)
    assert 256 <= pair.vocab_size <= 2048
    assert type(pair.target).__name__ == "LlamaForCausalLM"
    assert pair.identity["target_sha256"] != pair.identity["draft_sha256"]
    assert pair.decode(pair.encode("ROMEO:\n")) == "ROMEO:\n"


def test_manifest_hashes_and_training_quality():
    manifest = verify_manifest(models.BUNDLED_DIR)
    for name, digest in manifest["files"].items():
        assert models.sha256_file(models.BUNDLED_DIR / name) == digest
    target, draft = manifest["models"]["target"], manifest["models"]["draft"]
    assert 1_000_000 <= target["parameters"] <= 10_000_000
    assert 200_000 <= draft["parameters"] <= 500_000
    # genuinely trained: well below the unigram cross-entropy of the held-out plays
    assert target["held_out_loss_nats"] < manifest["unigram_cross_entropy_nats"] - 1.0
    assert draft["held_out_loss_nats"] < manifest["unigram_cross_entropy_nats"] - 0.5
    assert manifest["acceptance_alpha"]["T=1.0"] > 0.6


def test_unknown_name():
    with pytest.raises(ModelLoadError, match="unknown model pair 'llama-9000'.*bundled"):
        load_pair("llama-9000")


def test_needs_both_sides():
    with pytest.raises(ValueError, match="both target= and draft="):
        load_pair(target="gpt2")


def test_missing_path():
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pair(target="/no/such/model", draft="/no/such/draft")


def test_corrupted_weights_refused(bundle_copy, monkeypatch):
    weights = bundle_copy / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setitem(models.BUNDLED, "bundled", bundle_copy)
    with pytest.raises(ModelLoadError, match="corrupted model file .*target/model.safetensors"):
        load_pair("bundled")


def test_missing_file_refused(bundle_copy, monkeypatch):
    (bundle_copy / "draft" / "model.safetensors").unlink()
    monkeypatch.setitem(models.BUNDLED, "bundled", bundle_copy)
    with pytest.raises(ModelLoadError, match="missing bundled model file"):
        load_pair("bundled")


def test_pickled_weights_refused(bundle_copy):
    (bundle_copy / "draft" / "model.safetensors").rename(bundle_copy / "draft" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="no .safetensors"):
        load_pair(target=str(bundle_copy / "target"), draft=str(bundle_copy / "draft"))


def test_local_paths_load(bundle_copy):
    pair = load_pair(target=str(bundle_copy / "target"), draft=str(bundle_copy / "draft"))
    assert pair.vocab_size == len(pair.tokenizer)
    assert len(pair.identity["target_sha256"]) == 64


def test_different_vocabularies_refused(bundle_copy):
    path = bundle_copy / "draft" / "tokenizer.json"
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="vocabularies differ.*same token, different id"):
        load_pair(target=str(bundle_copy / "target"), draft=str(bundle_copy / "draft"))


def test_check_same_vocabulary_counts_missing_tokens(pair):
    class Fake:
        def get_vocab(self):
            vocab = dict(pair.tokenizer.get_vocab())
            vocab["<extra>"] = len(vocab)
            return vocab
    with pytest.raises(ModelLoadError, match="only in draft: \\['<extra>'\\]"):
        check_same_vocabulary(pair.tokenizer, Fake())


def test_logits_cut_to_vocabulary(pair):
    with torch.no_grad():
        n_logits = pair.target(torch.tensor([[1, 2]])).logits.shape[-1]
    assert n_logits >= pair.vocab_size
