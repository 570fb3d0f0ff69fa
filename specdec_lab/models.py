"""Load a target/draft pair: the bundled models by name, or any Hugging Face id or local path.

**p is the target, q is the draft.** A pair is usable only when both sides share one vocabulary
(the same token → id map); :func:`load_pair` refuses anything else with a message naming the
difference. Logits are cut to the tokenizer's vocabulary (HF models often pad their embedding
matrix), so no sampler can ever emit an id the tokenizer does not know.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec_lab.sampling import SamplingConfig, sample, to_probs  # noqa: F401  (re-exported)

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"  # inside the package: a wheel carries the models
BUNDLED = {"bundled": BUNDLED_DIR}


class ModelLoadError(ValueError):
    """A model pair could not be loaded; the message names the problem."""


@dataclass
class ModelPair:
    """Target p and draft q sharing one tokenizer and vocabulary of ``vocab_size`` ids."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    vocab_size: int
    device: torch.device
    identity: dict = field(default_factory=dict)  # names and sha256s, recorded in sample metadata
    recipe: dict = field(default_factory=dict)  # load_pair's arguments: load_pair(**recipe) loads this pair again

    def encode(self, text: str) -> torch.Tensor:
        """Prompt text -> 1-D int64 ids (no special tokens added)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("the prompt encodes to zero tokens; give at least one character")
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_manifest(directory: Path) -> dict:
    """Check every file listed in ``manifest.json`` against its sha256; return the manifest."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise ModelLoadError(f"missing manifest {manifest_path}; re-run `python -m specdec_lab.training.base`")
    manifest = json.loads(manifest_path.read_text())
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.exists():
            raise ModelLoadError(f"missing bundled model file {path}")
        actual = sha256_file(path)
        if actual != expected:
            raise ModelLoadError(f"corrupted model file {path}: sha256 {actual[:16]}… does not match "
                                 f"the manifest's {expected[:16]}…; restore it with `git checkout -- {path}`")
    return manifest


def add_pair_arguments(parser) -> None:
    """``--target``, ``--draft``, ``--device``, ``--trust-remote-code``: how every command names its pair."""
    parser.add_argument("--target", help="Hugging Face id or local path of the target (default: bundled)")
    parser.add_argument("--draft", help="Hugging Face id or local path of the draft (default: bundled)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default: cpu)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow model code from the hub (off by default)")


def pair_from_args(args) -> "ModelPair":
    """The pair that :func:`add_pair_arguments`' options name: both of --target/--draft, or neither (bundled)."""
    if (args.target is None) != (args.draft is None):
        raise SystemExit("error: give both --target and --draft, or neither (bundled models)")
    if args.target is None:
        return load_pair("bundled", device=args.device)
    return load_pair(target=args.target, draft=args.draft, device=args.device,
                     trust_remote_code=args.trust_remote_code)


def load_pair(name: str | None = None, *, target: str | None = None, draft: str | None = None,
              device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
              trust_remote_code: bool = False) -> ModelPair:
    """Load a target/draft pair.

    ``load_pair("bundled")`` loads the models committed under ``specdec_lab/bundled`` after checking their
    hashes; ``load_pair(target="gpt2", draft="distilgpt2", device="cuda")`` loads any Hugging Face id
    or local directory (safetensors weights only). The pair must share a vocabulary.
    """
    if name is not None:
        if target is not None or draft is not None:
            raise ValueError("give either a bundled name or target=/draft=, not both")
        if name not in BUNDLED:
            raise ModelLoadError(f"unknown model pair {name!r}; bundled pairs: {sorted(BUNDLED)} "
                                 "(or pass target=... and draft=... for any Hugging Face id or path)")
        directory = BUNDLED[name]
        manifest = verify_manifest(directory)
        target, draft = str(directory / "target"), str(directory / "draft")
        identity = {"pair": name, "target_sha256": manifest["files"]["target/model.safetensors"],
                    "draft_sha256": manifest["files"]["draft/model.safetensors"]}
    else:
        if target is None or draft is None:
            raise ValueError("load_pair needs a bundled name or both target= and draft=")
        identity = {"pair": f"{target} / {draft}"}
    device = torch.device(device)
    target_model, target_tok = _load_one(target, device, dtype, trust_remote_code)
    draft_model, draft_tok = _load_one(draft, device, dtype, trust_remote_code)
    vocab_size = check_same_vocabulary(target_tok, draft_tok, target, draft)
    for role, model in (("target", target_model), ("draft", draft_model)):
        n_logits = model.get_output_embeddings().weight.shape[0]
        if n_logits < vocab_size:
            raise ModelLoadError(f"the {role} model has {n_logits} output logits, fewer than its "
                                 f"tokenizer's {vocab_size} tokens")
    identity.setdefault("target_sha256", _weights_digest(target))
    identity.setdefault("draft_sha256", _weights_digest(draft))
    recipe = {"name": name} if name is not None else {"target": target, "draft": draft,
                                                         "trust_remote_code": trust_remote_code}
    return ModelPair(target_model, draft_model, target_tok, vocab_size, device, identity,
                     {**recipe, "device": str(device), "dtype": dtype})


def check_same_vocabulary(target_tok, draft_tok, target_name="target", draft_name="draft") -> int:
    """Return the shared vocabulary size, or raise naming how the two vocabularies differ."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if t_vocab != d_vocab:
        only_t = sorted(set(t_vocab) - set(d_vocab))[:5]
        only_d = sorted(set(d_vocab) - set(t_vocab))[:5]
        moved = [tok for tok in set(t_vocab) & set(d_vocab) if t_vocab[tok] != d_vocab[tok]][:5]
        raise ModelLoadError(
            f"vocabularies differ: {target_name} has {len(t_vocab)} tokens, {draft_name} has "
            f"{len(d_vocab)}; only in target: {only_t}; only in draft: {only_d}; "
            f"same token, different id: {moved}. Speculative decoding needs one shared vocabulary.")
    return len(t_vocab)


def _load_one(name_or_path: str, device, dtype, trust_remote_code):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(name_or_path)
    if local.exists() and local.is_dir():
        if not any(local.glob("*.safetensors")):
            raise ModelLoadError(f"{local} holds no .safetensors weights (pickled .bin weights are refused)")
    elif name_or_path.startswith((".", "/")) or local.suffix:
        raise ModelLoadError(f"model path {name_or_path} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, use_safetensors=True, dtype=dtype,
                                                     trust_remote_code=trust_remote_code,
                                                     attn_implementation=attention_for(device))
    except OSError as exc:
        raise ModelLoadError(f"could not load {name_or_path!r}: not a local model directory and not "
                             f"a reachable Hugging Face id with safetensors weights ({exc})") from exc
    return model.to(device).eval(), tokenizer


def attention_for(device: torch.device) -> str | None:
    """Eager attention on a CPU, the library default (sdpa) elsewhere. On 2 CPU cores eager was
    10% faster for speculative and 25% for naive sampling of the bundled pair than sdpa's flash kernel
    (interleaved A/B runs, bit-identical samples); on a GPU the fused kernels win."""
    return "eager" if torch.device(device).type == "cpu" else None


def _weights_digest(name_or_path: str) -> str:
    """sha256 over a model's safetensors files (or its hub id when the files are not local)."""
    local = Path(name_or_path)
    files = sorted(local.glob("*.safetensors")) if local.is_dir() else []
    if not files:
        return f"hub:{name_or_path}"
    h = hashlib.sha256()
    for path in files:
        h.update(sha256_file(path).encode())
    return h.hexdigest() if len(files) > 1 else sha256_file(files[0])
