"""The bundled EAGLE-3 head (specdec_lab/bundled/eagle3, `python -m specdec_lab.training.eagle3`), in the main environment.

vLLM's side (the head loads in Eagle3LlamaForCausalLM, and vLLM drafts exactly what our forward drafts:
its acceptance counters equal our greedy speculative decode's, greedy equals greedy) is in
tests/test_audit_vllm.py; here: the files match the manifest and the weights' names and shapes are the
ones vLLM's loader fills, the training unroll is the decode-time draft, and the trained head agrees
with the target far better than its untrained start.
"""

import json
from pathlib import Path

import pytest
import torch

from specdec_lab.adapters.vllm import vllm_python
from specdec_lab.training.eagle3 import (AUX_KEY, EAGLE3_SUBDIR, Eagle3Head, greedy_drafts, load_head,
                                      unroll)
from specdec_lab.models import BUNDLED_DIR, verify_manifest

from helpers import ROMEO_PASSAGE

HEAD_DIR = BUNDLED_DIR / EAGLE3_SUBDIR


def _vllm_eagle3_source() -> Path:
    """vLLM's llama_eagle3.py in the environment the audit uses (``.venv-vllm``, or ``$SPECDEC_LAB_VLLM_PYTHON``'s,
    as in CI, where it lives in a per-machine cache outside the clone)."""
    try:
        venv = vllm_python().parent.parent  # <venv>/bin/python -> <venv> (not resolved: bin/python is a symlink)
    except FileNotFoundError:
        return Path("/nonexistent")
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/model_executor/models/llama_eagle3.py"))
    return found[0] if found else Path("/nonexistent")


VLLM_EAGLE3 = _vllm_eagle3_source()

TEXT = ROMEO_PASSAGE


def vllm_layout(config: dict, target: dict) -> dict[str, tuple[int, ...]]:
    """The checkpoint names and shapes ``Eagle3LlamaForCausalLM.load_weights`` (vllm/model_executor/models/
    llama_eagle3.py, vLLM 0.32) fills for a one-layer head with shared embedding and lm_head: ``fc`` is
    ``ReplicatedLinear(target_hidden_size · len(eagle_aux_hidden_state_layer_ids) → hidden_size)``;
    layer 0's ``qkv_proj`` reads ``2 * hidden_size`` (stacked from q/k/v_proj by the WeightsMapper);
    ``hidden_norm`` beside the two Llama norms; the model's final ``norm``."""
    D, I = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or D // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    layer = {"input_layernorm.weight": (D,), "hidden_norm.weight": (D,), "post_attention_layernorm.weight": (D,),
             "self_attn.q_proj.weight": (q, 2 * D), "self_attn.k_proj.weight": (kv, 2 * D),
             "self_attn.v_proj.weight": (kv, 2 * D), "self_attn.o_proj.weight": (D, q),
             "mlp.gate_proj.weight": (I, D), "mlp.up_proj.weight": (I, D), "mlp.down_proj.weight": (D, I)}
    return {"fc.weight": (D, target["hidden_size"] * len(config[AUX_KEY])), "norm.weight": (D,),
            **{f"layers.0.{name}": shape for name, shape in layer.items()}}


@pytest.fixture(scope="module")
def head(pair):
    return load_head(HEAD_DIR, pair.target.config)


def test_files_are_vllms_layout():
    from safetensors import safe_open

    config = json.loads((HEAD_DIR / "config.json").read_text())
    target = json.loads((BUNDLED_DIR / "target" / "config.json").read_text())
    with safe_open(str(HEAD_DIR / "model.safetensors"), "pt") as f:
        saved = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    assert saved == vllm_layout(config, target)  # no embed_tokens / lm_head (shared), no d2t / t2d
    assert config["architectures"] == ["LlamaForCausalLM"]  # vLLM maps it to Eagle3LlamaForCausalLM
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == target["vocab_size"]
    assert "draft_vocab_size" not in config  # defaults to vocab_size: draft_id_to_target_id is None
    L, aux = target["num_hidden_layers"], config[AUX_KEY]
    assert aux == sorted(set(aux)) and 0 <= aux[0] and aux[-1] <= L
    assert len(set((2, L // 2, L - 3))) < 3  # why the ids are set: vLLM's default collapses at L = 4


@pytest.mark.skipif(not VLLM_EAGLE3.exists(), reason=".venv-vllm is missing")
def test_vllm_source_still_has_the_layout_assumed():
    source = VLLM_EAGLE3.read_text()
    for line in ["qkv_input_size = 2 * self.hidden_size if layer_idx == 0 else self.hidden_size",
                 "self.hidden_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)",
                 "hidden_states = torch.cat([embeds, hidden_states], dim=-1)",
                 "self.fc_input_size = target_hidden_size * self.num_aux_hidden_states",
                 "hidden_states, hidden_prenorm = self.norm(hidden_states, residual)",
                 'name = "model." + name']:
        assert line in source, line


def test_head_is_in_the_manifest_and_trained(pair, head):
    info = verify_manifest(BUNDLED_DIR)[EAGLE3_SUBDIR]  # also checks the head's sha256s
    after, before = info["held_out"], info["held_out_untrained"]
    assert after["step_1"]["acceptance_T1"] > before["step_1"]["acceptance_T1"] + 0.1, info
    assert after["step_2"]["acceptance_T1"] > before["step_2"]["acceptance_T1"] + 0.1, info
    assert sum(t.numel() for t in head.vllm_state_dict().values()) == info["parameters"]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        untrained = Eagle3Head(pair.target.config, head.aux_layers).eval()
    window = pair.encode(TEXT)[None]  # (1, T+1)
    with torch.no_grad():
        trained, start = [float(torch.minimum(logits.softmax(-1), log_p.exp()).sum(-1).mean())
                          for logits, log_p in (unroll(pair.target, h, window, 1)[0] for h in (head, untrained))]
    assert trained > start + 0.1, (trained, start)


def test_training_unroll_is_the_decode_time_draft(pair, head):
    """Oracle for the training-time-test mask: step s of ``unroll`` at the last context row, fed the drafts
    as tokens, drafts what ``greedy_drafts`` (vLLM's proposer loop, one row at a time) drafts."""
    context = pair.encode(TEXT)[:40]  # (n+1,)
    k = 4
    drafts = greedy_drafts(pair.target, head, context, k)
    window = torch.cat([context, torch.tensor(drafts)])[None]  # (1, n+1+k)
    n = len(context) - 1
    with torch.no_grad():
        steps = unroll(pair.target, head, window, k)
    assert [int(logits[0, n - 1].argmax()) for logits, _ in steps] == drafts
