"""Train an EAGLE-3 head for the bundled target, in the layout vLLM loads: ``python -m specdec_lab.training.eagle3``.

EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"): the draft reads a fusion of *several* target layers instead of the last one, and
is trained on its own fed-back states ("training-time test") instead of by feature regression. With
x the tokens, a_t = [h^{(i)}_t for i in aux_layers] the target's residual stream after layers i
(concatenated, (3D)), the first draft step at position t reads the next token's embedding and
f_t = fc(a_t), a (3D → D) linear map:

    u   = [rms_in(E x_{t+1}) ; rms_hidden(f_t)]                      (2D: the layer's attention input)
    r   = f_t + o_proj(attn(q, k, v from u))                        (attention over the draft's own cache)
    g_t = r + mlp(rms_post(r))                                      (pre-norm output, fed back)
    q_t = softmax(lm_head(rms_final(g_t)))                          → law of x_{t+2}

and the draft step s ≥ 2 at position t + s − 1 reads (E x̂_{t+s}, g of step s − 1) in place of
(E x_{t+1}, f_t): the fed-back state goes through ``hidden_norm`` directly, never through fc. E and
lm_head are the target's own (frozen; vLLM shares them when the checkpoint has neither).

Alignment with vLLM 0.32 (``.venv-vllm/lib/python3.11/site-packages/vllm/``):

- ``model_executor/models/llama_eagle3.py``: ``Eagle3LlamaForCausalLM.combine_hidden_states`` = ``fc``
  (no ``norm_before_fc``, no ``fc_norm``); ``LlamaDecoderLayer.forward`` with ``layer_idx == 0``:
  ``input_layernorm(embeds)``, ``hidden_norm(hidden)`` with the residual taken *before* that norm
  (``_norm_after_residual``), ``cat([embeds, hidden])`` into a ``qkv_proj`` of input width 2D, then the
  fused add-norm ``post_attention_layernorm`` and the MLP; ``LlamaModel.forward`` returns
  ``norm(hidden, residual)`` (for the logits) and the pre-norm sum (fed back). ``draft_vocab_size``
  defaults to ``vocab_size``, so the full vocabulary is used and no ``d2t``/``t2d`` maps are needed
  (``draft_id_to_target_id`` is None). ``load_weights`` prefixes every name but ``lm_head`` with
  ``model.`` and stacks ``q/k/v_proj`` and ``gate/up_proj``; a checkpoint without ``embed_tokens`` or
  ``lm_head`` gets the target's (``v1/spec_decode/llm_base_proposer.py``, ``_maybe_share_embeddings``,
  ``_maybe_share_lm_head``).
- ``model_executor/models/llama.py`` ``LlamaModel.forward`` with ``interfaces.py``
  ``_maybe_add_hidden_state``: aux layer id 0 is the embedding, id i ≥ 1 the residual stream
  (``hidden + residual``) *after* decoder layer i − 1, before any final norm; the ids come from the
  head's ``config.json`` key ``eagle_aux_hidden_state_layer_ids`` (``v1/worker/gpu_model_runner.py``,
  ``_get_eagle3_aux_layers_from_config``), sorted. vLLM's default (2, L // 2, L − 3) is (2, 2, 1) on
  our L = 4 target, two distinct layers, which crashes (docs/audit-vllm.md); we set (1, 2, 4):
  low, middle, and the last layer's output (the feature EAGLE-1 reads, before the final norm).
- ``v1/spec_decode/llm_base_proposer.py`` ``propose``: the first pass runs at the target's positions with
  the token ids shifted by one (row t: x_{t+1}, f_t); later steps feed back the pre-norm output
  (``last_hidden_states, hidden_states = self.model(...)``) with position + 1, attending to the
  cache of the first pass and of their own earlier steps.

Training (:func:`specdec_lab.training.base.fit`: the bundled models' corpus, windows, optimiser and schedule)
is soft self-distillation against the frozen target at T = 1, KL(p_{t+s} || q^{(s)}_t), averaged over
``ttt_steps`` unrolled draft steps. Step s ≥ 2 is EAGLE-3's training-time test: the head is run on
its own fed-back state g, its queries attending to the first pass causally and to their own row of
each later step (the mask vLLM's cache realises at decode time), the tokens teacher-forced from the
corpus. It is cheap here (one head pass per step, the target pass is shared) and needed: without it
nothing trains g to stand in for f, and vLLM feeds g back at every draft after the first. No
feature regression (EAGLE-3 drops it; f is learned, so there is no fixed feature to regress to).

Writes ``specdec_lab/bundled/eagle3/{config.json, model.safetensors}`` (the target's config with one layer
and ``eagle_aux_hidden_state_layer_ids``; weights ``fc.weight``, ``layers.0.*``, ``norm.weight``, no
embedding and no lm_head) and an ``"eagle3"`` entry in ``manifest.json`` (settings, held-out
acceptance per draft step before and after training, the target's sha256, time), leaving every
other entry as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lab.training.medusa import next_token_laws
from specdec_lab.training.base import script_parser, train_head

EAGLE3_SUBDIR = "eagle3"
AUX_KEY = "eagle_aux_hidden_state_layer_ids"  # vLLM reads it from the head's config.json


@dataclass(frozen=True)
class Eagle3Settings:
    seed: int = 20261205
    steps: int = 300  # as the EAGLE-1 head: 1.2M tokens
    lr: float = 2e-3  # as the EAGLE-1 head: the layer starts from scratch
    batch_size: int = 32
    context: int = 128  # the bundled models' training window
    warmup_steps: int = 40
    weight_decay: float = 0.0
    aux_layers: tuple[int, ...] = (1, 2, 4)  # low, middle, last; vLLM's default (2, 2, 1) crashes at L = 4
    ttt_steps: int = 2  # unrolled draft steps in the loss; 2 teaches the fed-back path
    eval_steps: int = 4  # draft steps measured on held-out text (K = 4 in the audits)
    eval_windows: int = 128  # held-out windows of `context` tokens


class Eagle3Attention(torch.nn.Module):
    """Llama attention whose q/k/v read the (2D) concatenation of the first EAGLE-3 layer."""

    def __init__(self, config):
        super().__init__()
        D, self.heads, self.kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or D // self.heads
        self.q_proj = torch.nn.Linear(2 * D, self.heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(2 * D, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(2 * D, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(self.heads * self.head_dim, D, bias=False)

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (B, h, n, d) and k, v (B, h, n, d) with RoPE at the rows' positions; u is (B, n, 2D)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        B, n, _ = u.shape
        split = lambda x, heads: x.view(B, n, heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(u), self.heads), split(self.k_proj(u), self.kv_heads), split(self.v_proj(u), self.kv_heads)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        repeat = self.heads // self.kv_heads
        return q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)

    def attend(self, q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Row t of q (B, h, n, d) attends to rows ≤ t of the first step's keys and to row t of every later
        step's keys (``cache`` = [(k, v) of step 1, ..., of this step]); returns (B, n, D)."""
        B, h, n, d = q.shape
        k1, v1 = cache[0][0][:, :, :n], cache[0][1][:, :, :n]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = [(q @ k1.transpose(-1, -2)).masked_fill(~causal, float("-inf"))]  # (B, h, n, n)
        scores += [(q * k[:, :, :n]).sum(-1, keepdim=True) for k, _ in cache[1:]]  # (B, h, n, 1) each
        weights = (torch.cat(scores, -1) * d ** -0.5).softmax(-1)
        out = weights[..., :n] @ v1
        for i, (_, v) in enumerate(cache[1:]):
            out = out + weights[..., n + i:n + i + 1] * v[:, :, :n]
        return self.o_proj(out.transpose(1, 2).reshape(B, n, h * d))


class Eagle3Layer(torch.nn.Module):
    """vLLM's first EAGLE-3 decoder layer (``llama_eagle3.LlamaDecoderLayer``, ``layer_idx == 0``)."""

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        D, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(D, eps)  # on the token embedding
        self.hidden_norm = LlamaRMSNorm(D, eps)  # on the feature f (or the fed-back g)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(D, eps)
        self.mlp = LlamaMLP(config)


class Eagle3Head(torch.nn.Module):
    """fc + one EAGLE-3 layer + final norm, under vLLM's parameter names (``fc``, ``layers.0``, ``norm``)."""

    def __init__(self, target_config, aux_layers: tuple[int, ...]):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        if len(set(aux_layers)) != len(aux_layers) or list(aux_layers) != sorted(aux_layers):
            raise ValueError(f"aux_layers must be distinct and sorted (vLLM sorts them), got {aux_layers}")
        if not 0 <= min(aux_layers) <= max(aux_layers) <= target_config.num_hidden_layers:
            raise ValueError(f"aux_layers must lie in [0, {target_config.num_hidden_layers}], got {aux_layers}")
        D = target_config.hidden_size
        self.aux_layers = tuple(aux_layers)
        self.fc = torch.nn.Linear(len(aux_layers) * D, D, bias=False)
        self.layers = torch.nn.ModuleList([Eagle3Layer(target_config)])
        self.norm = LlamaRMSNorm(D, target_config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(target_config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, target_config.initializer_range)
            self.fc.weight.zero_()  # start as "read the deepest aux layer" (EAGLE-1's feature): [0 | 0 | I]
            self.fc.weight[:, -D:].copy_(torch.eye(D))

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """f = fc(a): (B, n, 3D) → (B, n, D), vLLM's ``combine_hidden_states``."""
        return self.fc(aux)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]]):
        """One draft step over n rows: embeds E x (B, n, D), hidden f or g (B, n, D), positions (n,).
        ``cache``: (k, v) of the earlier steps (empty at step 1). Returns the normed output (B, n, D) for
        the lm_head, the pre-norm output g (B, n, D) fed to the next step, and the cache with this step."""
        layer = self.layers[0]
        residual = hidden
        u = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], -1)  # (B, n, 2D)
        cos, sin = self.rotary(u, positions[None])
        q, k, v = layer.self_attn.project(u, cos, sin)
        cache = [*cache, (k, v)]
        residual = residual + layer.self_attn.attend(q, cache)
        g = residual + layer.mlp(layer.post_attention_layernorm(residual))  # (B, n, D), pre-norm
        return self.norm(g), g, cache

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under vLLM's names (``fc.weight``, ``layers.0.*``, ``norm.weight``), fp32, contiguous."""
        return {name: tensor.detach().float().contiguous() for name, tensor in self.state_dict().items()
                if not name.startswith("rotary.")}


def aux_and_laws(target, window: torch.Tensor, aux_layers: tuple[int, ...]):
    """The target's aux hidden states a (B, T, len(aux_layers)·D), as vLLM captures them (id 0: the
    embedding; id i: the residual stream after layer i − 1, before the final norm), and its next-token
    log-laws (B, T, V); no gradient."""
    captured: dict[int, torch.Tensor] = {}
    hooks = [target.model.layers[i - 1].register_forward_hook(
        lambda module, args, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in aux_layers if i > 0]
    try:
        with torch.no_grad():
            hidden = target.model(input_ids=window).last_hidden_state  # (B, T, D), after the final norm
            if 0 in aux_layers:
                captured[0] = target.model.embed_tokens(window)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[i] for i in aux_layers], -1), next_token_laws(target, hidden)


def unroll(target, head: Eagle3Head, window: torch.Tensor, steps: int):
    """Teacher-forced draft steps 1..``steps`` on a window (B, T+1). Step s, row t (t ≤ T − s), at position
    t + s − 1, reads x_{t+s} and f_t (s = 1) or g of step s − 1 row t, and drafts the law of x_{t+s+1}.
    Returns, per step, (draft logits (B, T−s+1, V), target log-laws p_{t+s} (B, T−s+1, V))."""
    B, T1 = window.shape
    T = T1 - 1
    aux, log_p = aux_and_laws(target, window, head.aux_layers)  # (B, T+1, 3D), (B, T+1, V)
    with torch.no_grad():
        embeds = target.model.embed_tokens(window)  # (B, T+1, D)
    hidden, cache, out = head.combine(aux[:, :-1]), [], []  # f_0 .. f_{T-1}
    for s in range(1, steps + 1):
        n = T - s + 1
        positions = torch.arange(n, device=window.device) + s - 1
        normed, hidden, cache = head(embeds[:, s:s + n], hidden[:, :n], positions, cache)
        out.append((target.lm_head(normed), log_p[:, s:s + n]))
    return out


def eagle3_loss(target, steps: int):
    """Mean over draft steps s of KL(p_{t+s} || q^{(s)}_t), averaged over rows."""
    def loss(head: Eagle3Head, window: torch.Tensor) -> torch.Tensor:
        total = 0.0
        for logits, log_p in unroll(target, head, window, steps):
            log_q = F.log_softmax(logits.float(), dim=-1)
            total = total + F.kl_div(log_q.flatten(0, 1), log_p.flatten(0, 1), log_target=True, reduction="batchmean")
        return total / steps
    return loss


@torch.no_grad()
def greedy_drafts(target, head: Eagle3Head, context: torch.Tensor, k: int) -> list[int]:
    """The k greedy drafts after ``context`` (n + 1 ids, the last one not yet run through the target), as
    vLLM's proposer makes them: a first pass over rows 0..n−1 (x_{t+1}, f_t), then k − 1 steps of the last
    row on its fed-back g and its own previous draft, one position further each time."""
    ids = context[None]  # (1, n+1)
    n = ids.shape[1] - 1
    aux, _ = aux_and_laws(target, ids[:, :-1], head.aux_layers)  # (1, n, 3D)
    hidden, cache, tokens, drafts = head.combine(aux), [], ids[:, 1:].clone(), []
    for s in range(1, k + 1):
        # rows t < n − 1 of steps ≥ 2 only see themselves and the first pass; the last row is the draft
        normed, hidden, cache = head(target.model.embed_tokens(tokens), hidden,
                                     torch.arange(n, device=ids.device) + s - 1, cache)
        drafts.append(int(target.lm_head(normed[0, -1]).argmax()))
        tokens[0, -1] = drafts[-1]
    return drafts


@torch.no_grad()
def acceptance_by_step(target, head: Eagle3Head, stream: torch.Tensor, settings: Eagle3Settings) -> dict:
    """Per draft step s: mean Σ min(p_{t+s}, q^{(s)}_t) at T = 1 and the top-1 agreement of q^{(s)} with
    the target, teacher-forced on held-out windows (later steps read corpus tokens, not drafts)."""
    T = settings.context
    starts = torch.linspace(0, len(stream) - T - 2, settings.eval_windows).long().tolist()
    windows = torch.stack([stream[s:s + T + 1] for s in starts])  # (W, T+1)
    overlap = torch.zeros(settings.eval_steps, dtype=torch.float64)
    hits, count = torch.zeros_like(overlap), torch.zeros_like(overlap)
    for chunk in windows.split(32):
        for s, (logits, log_p) in enumerate(unroll(target, head, chunk, settings.eval_steps)):
            q, p = logits.float().softmax(-1), log_p.exp()
            overlap[s] += torch.minimum(p, q).sum()
            hits[s] += (q.argmax(-1) == p.argmax(-1)).sum()
            count[s] += q.shape[0] * q.shape[1]
    return {f"step_{s + 1}": {"acceptance_T1": round(float(overlap[s] / count[s]), 4),
                              "top1_vs_target_argmax": round(float(hits[s] / count[s]), 4)}
            for s in range(settings.eval_steps)}


def save_head(head: Eagle3Head, directory: Path, target_dir: Path) -> None:
    """``config.json`` (the target's own, one layer, the aux layer ids; vLLM maps LlamaForCausalLM →
    Eagle3LlamaForCausalLM for ``method: eagle3``) and ``model.safetensors`` in vLLM's names."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(head.vllm_state_dict(), str(directory / "model.safetensors"))
    config = json.loads((target_dir / "config.json").read_text())
    config.update({"num_hidden_layers": 1, AUX_KEY: list(head.aux_layers)})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_head(directory: Path, target_config) -> Eagle3Head:
    """A head written by :func:`save_head`, back in torch (every weight present, no stray names)."""
    from safetensors.torch import load_file

    aux_layers = tuple(json.loads((directory / "config.json").read_text())[AUX_KEY])
    head = Eagle3Head(target_config, aux_layers)
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"{directory}: not an EAGLE-3 head of this target (missing {missing}, unexpected {unexpected})")
    return head.eval()


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Eagle3Settings.steps)
    args = parser.parse_args(argv)
    settings = Eagle3Settings(steps=args.steps)
    train_head(args.out, args.cache, settings, subdir=EAGLE3_SUBDIR, files=("config.json", "model.safetensors"),
               kind="EAGLE-3 head in vLLM's Eagle3LlamaForCausalLM layout (frozen target, shared embedding and "
                    f"lm_head, aux layers {list(settings.aux_layers)})",
               build=lambda target: Eagle3Head(target.config, settings.aux_layers),
               loss=lambda target: eagle3_loss(target, settings.ttt_steps), evaluate=acceptance_by_step,
               save=save_head, parameters=lambda head: sum(t.numel() for t in head.vllm_state_dict().values()),
               measure="held_out")


if __name__ == "__main__":
    main()
