"""Train an EAGLE head for the bundled target, in the layout vLLM loads: ``python -m specdec_lab.training.eagle``.

EAGLE-1 (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"): a
draft that works on the target's features. With x the tokens and h_t the target's last hidden state
at position t (after its final norm), the head at position t reads the next token's embedding and h_t,

    g_t = layer(fc([E x_{t+1} ; h_t]))        q_t = softmax(lm_head(g_t))  → law of x_{t+2}

where E and lm_head are the target's own (frozen, shared), fc is a (2D → D) linear map and layer is one
Llama decoder layer without its input norm. The next draft step feeds g_t back in place of h_{t+1}.
This is exactly vLLM's ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``:
``fc(cat(embed, hidden))``, layer 0 with ``input_layernorm`` = identity, output ``hidden + residual``
into the target's lm_head, no final norm; ``v1/spec_decode/llm_base_proposer.py`` shifts the token ids
by one against the target's hidden states and keeps the target's positions).

Training, on the corpus the bundled models were trained on (:func:`specdec_lab.training.base.fetch_corpus`,
the same windows, optimiser and schedule, :func:`specdec_lab.training.base.fit`), teacher-forced on the
target's own features: KL(p_{t+1} || q_t) (soft self-distillation, as for the Medusa heads: acceptance
rewards agreeing with the target, not with the corpus) plus EAGLE's feature regression
SmoothL1(g_t, h_{t+1}), which is what lets the second and later draft steps read g_t in place of h_{t+1}.

Writes ``specdec_lab/bundled/eagle/{config.json, model.safetensors}`` (the target's config with one layer;
the weights ``fc.weight`` and ``layers.0.*``, no embedding and no lm_head, so vLLM shares the target's)
and an ``"eagle"`` entry in ``manifest.json`` (settings, held-out step-1 acceptance before and after,
the target's sha256, time), leaving every other entry as it was.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lab.training.medusa import hidden_and_laws
from specdec_lab.training.base import script_parser, train_head

EAGLE_SUBDIR = "eagle"


@dataclass(frozen=True)
class EagleSettings:
    seed: int = 20261204
    steps: int = 300  # the head sees 1.2M tokens (training time: docs/models.md)
    lr: float = 2e-3  # the layer starts from scratch (only fc's feature half starts at identity)
    batch_size: int = 32
    context: int = 128  # the bundled models' training window
    warmup_steps: int = 40
    weight_decay: float = 0.0
    feature_weight: float = 1.0  # SmoothL1(g_t, h_{t+1}) beside the KL; EAGLE weighs the regression 10× its CE
    eval_windows: int = 128  # held-out windows of `context` tokens for the acceptance


class EagleHead(torch.nn.Module):
    """fc + one Llama decoder layer: (E x_{t+1}, h_t), both (B, T, D) → g_t (B, T, D)."""

    def __init__(self, target_config):
        from transformers import LlamaModel

        super().__init__()
        config = copy.deepcopy(target_config)
        config.num_hidden_layers = 1
        self.config = config
        D = config.hidden_size
        self.fc = torch.nn.Linear(2 * D, D, bias=False)
        with torch.no_grad():  # start as "pass h_t through": fc = [0 | I]
            self.fc.weight.zero_()
            self.fc.weight[:, D:].copy_(torch.eye(D))
        self.decoder = LlamaModel(config)
        self.decoder.embed_tokens = None  # the target's embedding is used (and shared by vLLM)
        self.decoder.layers[0].input_layernorm = torch.nn.Identity()  # EAGLE skips it
        self.decoder.norm = torch.nn.Identity()  # vLLM's EAGLE model has no final norm

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        fused = self.fc(torch.cat([embeds, hidden], dim=-1))  # (B, T, D)
        return self.decoder(inputs_embeds=fused).last_hidden_state  # (B, T, D), causal over t

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under vLLM's names (``fc.weight``, ``layers.0.*``), fp32, contiguous."""
        state = {"fc.weight": self.fc.weight}
        state.update({name: tensor for name, tensor in self.decoder.state_dict().items() if name.startswith("layers.")})
        return {name: tensor.detach().float().contiguous() for name, tensor in state.items()}


def draft_step(target, head: EagleHead, window: torch.Tensor):
    """Teacher-forced step 1 on a window (B, T+1): g (B, T, D), the target's features h (B, T+1, D) and
    log-laws log p (B, T+1, V); g_t pairs with h_{t+1} and log p_{t+1} (the law of x_{t+2})."""
    hidden, log_p = hidden_and_laws(target, window)
    with torch.no_grad():
        embeds = target.model.embed_tokens(window[:, 1:])  # (B, T, D): E x_{t+1}
    return head(embeds, hidden[:, :-1]), hidden, log_p


def eagle_loss(target, feature_weight: float):
    """KL(p_{t+1} || q_t) + feature_weight · SmoothL1(g_t, h_{t+1}), averaged over positions."""
    def loss(head: EagleHead, window: torch.Tensor) -> torch.Tensor:
        g, hidden, log_p = draft_step(target, head, window)
        log_q = F.log_softmax(target.lm_head(g).float(), dim=-1)  # (B, T, V)
        kl = F.kl_div(log_q.flatten(0, 1), log_p[:, 1:].flatten(0, 1), log_target=True, reduction="batchmean")
        return kl + feature_weight * F.smooth_l1_loss(g.float(), hidden[:, 1:].float())
    return loss


@torch.no_grad()
def step1_acceptance(target, head: EagleHead, stream: torch.Tensor, settings: EagleSettings) -> dict:
    """Mean Σ min(p_{t+1}, q_t) at T = 1 (the chance a sampled first draft is accepted) and the top-1
    agreement of q_t with p_{t+1}, teacher-forced on held-out windows."""
    T = settings.context
    starts = torch.linspace(0, len(stream) - T - 2, settings.eval_windows).long().tolist()
    windows = torch.stack([stream[s:s + T + 1] for s in starts])  # (W, T+1)
    overlap = hits = count = 0.0
    for chunk in windows.split(32):
        g, _, log_p = draft_step(target, head, chunk)
        q = target.lm_head(g).float().softmax(-1)  # (B, T, V)
        p = log_p[:, 1:].exp()
        overlap += float(torch.minimum(p, q).sum())
        hits += float((q.argmax(-1) == p.argmax(-1)).sum())
        count += q.shape[0] * q.shape[1]
    return {"acceptance_T1": round(overlap / count, 4), "top1_vs_target_argmax": round(hits / count, 4)}


def save_head(head: EagleHead, directory: Path, target_dir: Path) -> None:
    """``config.json`` (the target's own, with one layer; vLLM maps LlamaForCausalLM → EagleLlamaForCausalLM)
    and ``model.safetensors`` in vLLM's names."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(head.vllm_state_dict(), str(directory / "model.safetensors"))
    config = json.loads((target_dir / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_head(directory: Path, target_config) -> EagleHead:
    """A head written by :func:`save_head`, back in torch (every weight present, no stray names)."""
    from safetensors.torch import load_file

    head = EagleHead(target_config)
    state = load_file(str(directory / "model.safetensors"))
    head.fc.weight.data.copy_(state.pop("fc.weight"))
    missing, unexpected = head.decoder.load_state_dict(state, strict=False)
    layer_names = {n for n in head.decoder.state_dict() if n.startswith("layers.")}
    if unexpected or layer_names & set(missing):
        raise ValueError(f"{directory}: not an EAGLE head of this target (missing {sorted(layer_names & set(missing))}, "
                         f"unexpected {sorted(unexpected)})")
    return head.eval()


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=EagleSettings.steps)
    args = parser.parse_args(argv)
    settings = EagleSettings(steps=args.steps)
    train_head(args.out, args.cache, settings, subdir=EAGLE_SUBDIR, files=("config.json", "model.safetensors"),
               kind="EAGLE-1 head in vLLM's EagleLlamaForCausalLM layout (frozen target, shared embedding and lm_head)",
               build=lambda target: EagleHead(target.config),
               loss=lambda target: eagle_loss(target, settings.feature_weight), evaluate=step1_acceptance,
               save=save_head, parameters=lambda head: sum(t.numel() for t in head.vllm_state_dict().values()),
               measure="held_out_step1")


if __name__ == "__main__":
    main()
