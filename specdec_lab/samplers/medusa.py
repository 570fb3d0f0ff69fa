"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads"), Medusa-1 style: the target stays frozen and H small heads read its final hidden state.

Head k (k = 1..H) at position t predicts the token k + 1 positions ahead, x_{t+k+1}; "head 0" is the
target's own ``lm_head`` (x_{t+1}). Each head is one residual block plus a vocabulary projection:

    head_k(h) = W_k (h + SiLU(L_k h))      h: the target's last hidden state (after its final norm)

with W_k initialised as a copy of the target's ``lm_head`` and L_k zero-initialised, so an untrained
head predicts what the target predicts for the next token.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lab.models import BUNDLED_DIR, ModelLoadError, verify_manifest
from specdec_lab.sampling import SamplingConfig, sample, to_probs
from specdec_lab.samplers.protocol import CHUNK, SampleResult, check_request, in_chunks
from specdec_lab.samplers.faulty import TREE_FAULTY
from specdec_lab.samplers.rules import Law, Mode, accept_ratio, residual_positive_part
from specdec_lab.samplers.tree import Tree, TreeDecoder, chain

MEDUSA_SUBDIR = "medusa"


@dataclass(frozen=True)
class HeadsConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 4  # Medusa's paper uses 4-5; 4 keeps the bundled tree small


class MedusaHeads(torch.nn.Module):
    """H residual heads: hidden (..., D) -> logits (..., H, V) for tokens t+2 .. t+H+1."""

    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.config = config
        D, V = config.hidden_size, config.vocab_size
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(config.num_heads))
        self.out = torch.nn.ModuleList(torch.nn.Linear(D, V, bias=False) for _ in range(config.num_heads))
        for block in self.blocks:
            torch.nn.init.zeros_(block.weight)
            torch.nn.init.zeros_(block.bias)

    @classmethod
    def from_target(cls, target: torch.nn.Module, num_heads: int) -> "MedusaHeads":
        """Heads whose projections start as copies of the target's lm_head (L_k = 0)."""
        lm_head = target.get_output_embeddings().weight.detach()  # (V, D)
        heads = cls(HeadsConfig(lm_head.shape[1], lm_head.shape[0], num_heads))
        for out in heads.out:
            out.weight.data.copy_(lm_head)
        return heads

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([out(hidden + F.silu(block(hidden)))
                            for block, out in zip(self.blocks, self.out)], dim=-2)  # (..., H, V)


def save_heads(heads: MedusaHeads, directory: Path) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in heads.state_dict().items()}
    save_file(state, str(directory / "heads.safetensors"))
    (directory / "config.json").write_text(json.dumps(asdict(heads.config), indent=2) + "\n")


def load_heads(directory: Path, device: str | torch.device = "cpu") -> MedusaHeads:
    """Load heads saved by :func:`save_heads` (no hash check; see :func:`load_medusa_heads`)."""
    from safetensors.torch import load_file

    config = HeadsConfig(**json.loads((directory / "config.json").read_text()))
    heads = MedusaHeads(config)
    heads.load_state_dict(load_file(str(directory / "heads.safetensors")))
    return heads.to(device).eval()


def load_medusa_heads(pair, directory: Path = BUNDLED_DIR) -> MedusaHeads:
    """The Medusa heads trained for the bundled target, after checking the manifest's sha256s.

    Refuses a pair whose target is not the one the heads were trained on.
    """
    manifest = verify_manifest(directory)
    info = manifest.get("medusa")
    if info is None or f"{MEDUSA_SUBDIR}/heads.safetensors" not in manifest["files"]:
        raise ModelLoadError(f"no Medusa heads in {directory / 'manifest.json'}; "
                             "train them with `make train-medusa`")
    if pair.identity.get("target_sha256") != info["target_sha256"]:
        raise ModelLoadError("these Medusa heads were trained for target "
                             f"{info['target_sha256'][:16]}…, not for {pair.identity.get('target_sha256')}")
    heads = load_heads(directory / MEDUSA_SUBDIR, pair.device)
    if heads.config.vocab_size != pair.vocab_size:
        raise ModelLoadError(f"heads have {heads.config.vocab_size} logits, the pair's vocabulary "
                             f"{pair.vocab_size}")
    return heads


# ====================================================================== the Medusa sampler
#
# One step, per chain (p = target, q_d = head d's law after the same to_probs as p):
#
#   state:   root r (the last emitted token, not yet fed); q_1..q_H from the hidden state h of the
#            last fed position (head d predicts the token d + 1 after it, i.e. depth d below r)
#   propose: node tokens of the tree: the rank-th top-k candidate of q_depth (distinct candidates),
#            or i.i.d. draws from q_depth (sampled candidates)
#   score:   one target pass over [r, nodes] with tree attention -> p at every node
#   accept:  walk down from r with the mode's rule; emit the accepted path and one more token
#            (the residual draw where the walk stopped, or a bonus from p at a leaf)
#
# Tokens per target pass = accepted path length + 1.


@dataclass(frozen=True)
class Pick:
    """One node's verdict: which child was accepted (-1: none) and the token emitted there."""

    child: torch.Tensor  # (B,) index into the node's children, -1 when all were rejected
    token: torch.Tensor  # (B,) the accepted child's token, or the replacement / bonus token


def accept_greedy(p: Law, cand: torch.Tensor, valid: torch.Tensor, q: Law, generator) -> Pick:
    """Greedy: keep the child equal to argmax p (p is one-hot at temperature 0), else emit argmax p."""
    target = p.argmax(-1)  # (B,)
    match = valid & (cand == target[:, None])  # (B, M)
    child = torch.where(match.any(-1), match.long().argmax(-1), -1)
    return Pick(child, target)


def accept_rejection_iid(p: Law, cand: torch.Tensor, valid: torch.Tensor, q: Law, generator) -> Pick:
    """SpecInfer multi-step speculative sampling; children c_1..c_m are i.i.d. draws from q.

    Try c_i with probability min(1, p_i(c_i)/q(c_i)); on rejection p_{i+1} = norm((p_i − q)+), q
    unchanged; all rejected -> draw from p_{m+1}.
    """
    return _walk_children(p, cand, valid, generator,
                          accept=lambda p_i, c: accept_ratio(p_i.gather(-1, c[:, None])[:, 0],
                                                             q.gather(-1, c[:, None])[:, 0]),
                          residual=lambda p_i, c: residual_positive_part(p_i, q))


def accept_rejection_topk(p: Law, cand: torch.Tensor, valid: torch.Tensor, q: Law, generator) -> Pick:
    """Recursive rejection with distinct deterministic candidates (point-mass q, Jeon et al. 2024):
    try c_i with probability p_i(c_i); on rejection p_{i+1} = p_i with c_i zeroed, renormalised."""
    return _walk_children(p, cand, valid, generator,
                          accept=lambda p_i, c: p_i.gather(-1, c[:, None])[:, 0],
                          residual=_remove_token)


def _remove_token(p: Law, token: torch.Tensor) -> Law:
    removed = p.scatter(-1, token[:, None], 0.0)  # (B, V)
    total = removed.sum(-1, keepdim=True)
    return torch.where(total > 0, removed / torch.where(total > 0, total, 1.0), p)


def _walk_children(p, cand, valid, generator, accept, residual) -> Pick:
    B, M = cand.shape
    child = torch.full((B,), -1, dtype=torch.long, device=p.device)
    p_i = p
    for i in range(M):
        open_ = valid[:, i] & (child < 0)  # (B,) chains still trying, with an i-th child
        c = cand[:, i].clamp(min=0)
        u = torch.rand(B, generator=generator, dtype=p.dtype, device=p.device)
        take = open_ & (u < accept(p_i, c))
        child = torch.where(take, i, child)
        rejected = open_ & ~take
        p_i = torch.where(rejected[:, None], residual(p_i, c), p_i)
    drawn = sample(p_i, generator)  # (B,) used only where every child was rejected
    token = torch.where(child >= 0, cand.gather(-1, child.clamp(min=0)[:, None])[:, 0], drawn)
    return Pick(child, token)


def typical_threshold(p: Law, epsilon: float, alpha: float) -> torch.Tensor:
    """Medusa's typical acceptance threshold min(ε, α·exp(−H(p))) per row (..., V) -> (...)."""
    logp = torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), 0.0)
    entropy = -(p * logp).sum(-1)
    return torch.minimum(torch.full_like(entropy, epsilon), alpha * torch.exp(-entropy))


def typical_accepted(p: Law, nodes: torch.Tensor, tree, epsilon: float, alpha: float) -> torch.Tensor:
    """(B, N+1) bool: node accepted by the typical rule, p[parent](token) > threshold(p[parent]),
    and so are all its ancestors (the root is always accepted)."""
    parents = torch.tensor(tree.parents[1:], device=p.device)  # (N,)
    p_parent = p[:, parents]  # (B, N, V)
    ok = p_parent.gather(-1, nodes[..., None])[..., 0] > typical_threshold(p_parent, epsilon, alpha)
    accepted = torch.ones(p.shape[0], tree.num_nodes + 1, dtype=torch.bool, device=p.device)
    for node in range(1, tree.num_nodes + 1):  # parents come first
        accepted[:, node] = ok[:, node - 1] & accepted[:, tree.parents[node]]
    return accepted


def longest_path(accepted: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor]:
    """Among root-to-leaf paths, the one with the longest accepted prefix (first on ties).

    accepted: (B, P, D+1) per path position -> (path index (B,), accepted length (B,))."""
    run = torch.cumprod(accepted.long(), dim=-1).sum(-1) - 1  # (B, P) accepted nodes below the root
    return run.argmax(-1), run.max(-1).values


def select_typical(p: Law, nodes: torch.Tensor, tree, config, generator):
    """Medusa's typical acceptance (lossy): the longest path whose every node passes
    p(x) > min(ε, α·exp(−H(p))); then one token from p at its last accepted node."""
    accepted = typical_accepted(p, nodes, tree, config.epsilon, config.alpha)  # (B, N+1)
    retrieve = tree.retrieve_indices.to(p.device)  # (P, D+1)
    on_path = accepted[:, retrieve.clamp(min=0)] & (retrieve >= 0)  # (B, P, D+1)
    best, length = longest_path(on_path, tree)
    path = retrieve[best]  # (B, D+1)
    last = path.gather(-1, length[:, None])[:, 0]
    rows = torch.arange(p.shape[0], device=p.device)
    return path, length, sample(p[rows, last], generator)


MODES = {m.name: m for m in (
    Mode("greedy", True, "topk", "accept the child equal to the target's argmax (temperature 0)",
         pick=accept_greedy),
    Mode("typical", False, "topk", "Medusa typical acceptance p(x) > min(ε, α·exp(−H(p))), longest path",
         select=select_typical),
    Mode("rejection_iid", True, "iid", "children i.i.d. from the heads' q, SpecInfer multi-step rejection",
         pick=accept_rejection_iid),
    Mode("rejection_topk", True, "topk", "distinct top-k children, recursive point-mass rejection",
         pick=accept_rejection_topk),
)}


def get_mode(name: str) -> Mode:
    """A mode by name: the table above plus the tree negative controls of
    :data:`specdec_lab.samplers.faulty.TREE_FAULTY`; the error lists the valid names."""
    table = {**MODES, **TREE_FAULTY}
    if name not in table:
        raise ValueError(f"unknown Medusa acceptance mode {name!r}; valid modes: {', '.join(table)}")
    return table[name]


@dataclass(frozen=True)
class MedusaConfig:
    tree: Tree = field(default_factory=lambda: chain(4))
    mode: str = "rejection_topk"
    sampling: SamplingConfig = SamplingConfig()
    epsilon: float = 0.09  # typical: hard threshold ε (Medusa paper; its code swaps ε and α in one layer)
    alpha: float = 0.3  # typical: entropy-scaled threshold α·exp(−H)

    def __post_init__(self) -> None:
        get_mode(self.mode)
        if not isinstance(self.tree, Tree):
            raise ValueError("tree must be a specdec_lab.samplers.tree.Tree (use Tree.from_choices)")
        if not (0 <= self.epsilon <= 1 and self.alpha >= 0):
            raise ValueError(f"need 0 <= epsilon <= 1 and alpha >= 0, got {self.epsilon}, {self.alpha}")

    @property
    def lossless(self) -> bool:
        return get_mode(self.mode).lossless

    def describe(self) -> dict:
        extra = {"epsilon": self.epsilon, "alpha": self.alpha} if self.mode == "typical" else {}
        return {"sampler": "medusa", "mode": self.mode, "lossless": self.lossless,
                "tree": [list(p) for p in self.tree.paths], **extra, **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_medusa(pair, prompt, n, length, self, generator)


_HEADS_CACHE: dict = {}


def heads_for(pair) -> MedusaHeads:
    """The bundled heads for ``pair``, loaded (and hash-checked) once per pair."""
    key = id(pair.target)
    if key not in _HEADS_CACHE:
        _HEADS_CACHE[key] = load_medusa_heads(pair)
    return _HEADS_CACHE[key]


def propose_nodes(head_logits: torch.Tensor, tree: Tree, mode: Mode, sampling: SamplingConfig,
                  generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Node tokens (B, N) and the head laws q (B, H, V) they come from.

    "topk": node = rank-th most likely token of head depth (distinct); "iid": an independent draw
    from q_depth for every node."""
    B, H, V = head_logits.shape
    if tree.depth > H:
        raise ValueError(f"the tree has depth {tree.depth} but there are only {H} Medusa heads")
    q = to_probs(head_logits, sampling)  # (B, H, V)
    depth = torch.tensor(tree.depths[1:], device=head_logits.device) - 1  # (N,)
    if mode.candidates == "iid":
        return sample(q[:, depth], generator), q  # (B, N)
    width = max(tree.max_children())
    top = torch.topk(head_logits, width, dim=-1).indices  # (B, H, width): rank order
    rank = torch.tensor(tree.ranks[1:], device=head_logits.device)
    return top[:, depth, rank], q


def walk(p: Law, nodes: torch.Tensor, q: Law, tree: Tree, mode: Mode, generator):
    """Root-to-leaf walk with a node rule -> (path (B, D+1) node ids, accepted length (B,), token (B,)).

    p: (B, N+1, V) target law at every node; nodes: (B, N); q: (B, H, V)."""
    B = p.shape[0]
    rows = torch.arange(B, device=p.device)
    children = tree.children.to(p.device)  # (N+1, M)
    all_tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=p.device), nodes], dim=1)
    path = torch.full((B, tree.depth + 1), -1, dtype=torch.long, device=p.device)
    path[:, 0] = 0
    length = torch.zeros(B, dtype=torch.long, device=p.device)
    token = torch.zeros(B, dtype=torch.long, device=p.device)
    going = torch.ones(B, dtype=torch.bool, device=p.device)
    cur = torch.zeros(B, dtype=torch.long, device=p.device)
    for d in range(tree.depth + 1):
        kids = children[cur]  # (B, M)
        valid = kids >= 0
        cand = all_tokens.gather(1, kids.clamp(min=0))
        q_next = q[:, min(d, q.shape[1] - 1)]  # law the depth-(d+1) children were drawn from
        pick = mode.pick(p[rows, cur], cand, valid, q_next, generator)
        stop = going & (pick.child < 0)
        token = torch.where(stop, pick.token, token)
        advance = going & (pick.child >= 0)
        cur = torch.where(advance, kids.gather(1, pick.child.clamp(min=0)[:, None])[:, 0], cur)
        length = length + advance.long()
        if d + 1 <= tree.depth:
            path[:, d + 1] = torch.where(advance, cur, path[:, d + 1])
        going = advance
    return path, length, token


def sample_medusa(pair, prompt: torch.Tensor, n: int, length: int, config: MedusaConfig,
                  generator: torch.Generator, chunk: int = CHUNK) -> SampleResult:
    """Draw ``n`` continuations of ``length`` tokens with Medusa heads and tree verification.

    The prompt's last token is the first root, so the first new token is already a tree candidate
    (the prompt needs >= 2 tokens: the heads read the hidden state before the root).
    """
    check_request(prompt, n, length)
    if prompt.numel() < 2:
        raise ValueError("the Medusa sampler needs a prompt of at least 2 tokens (heads read the "
                         "hidden state before the last prompt token)")
    heads = heads_for(pair)
    result = in_chunks(lambda size: _medusa_batch(pair, heads, prompt, size, length, config, generator),
                       n, chunk)
    result.stats = medusa_rates(result.stats, config.tree.depth)
    return result


@torch.no_grad()
def _medusa_batch(pair, heads, prompt, n, length, config, generator) -> SampleResult:
    mode, tree = get_mode(config.mode), config.tree
    decoder = TreeDecoder(pair.target, pair.vocab_size, n, pair.device)
    _, hidden = decoder.prefill_state(prompt[:-1].to(pair.device), room=length * (tree.num_nodes + 1))
    head_logits = heads(hidden)[None, :, : pair.vocab_size].double().expand(n, -1, -1)  # (B, H, V)
    root = prompt[-1:].to(pair.device).expand(n).clone()  # (B,)
    out = torch.zeros(n, length + tree.depth + 1, dtype=torch.long, device=pair.device)
    filled = torch.zeros(n, dtype=torch.long, device=pair.device)
    counts = {"chain_steps": 0, "emitted_tokens": 0, "accepted_nodes": 0}
    alive = torch.arange(n, device=pair.device)  # chains still short of `length`; the rest left the batch
    position = torch.arange(tree.depth + 1, device=pair.device)
    while alive.numel() > 0:
        B = alive.numel()
        rows = torch.arange(B, device=pair.device)
        nodes, q = propose_nodes(head_logits, tree, mode, config.sampling, generator)  # (B, N)
        all_tokens = torch.cat([root[:, None], nodes], dim=1)  # (B, N+1)
        logits, hidden = decoder.feed_tree(all_tokens, tree)
        p = to_probs(logits, config.sampling)  # (B, N+1, V)
        if mode.select is not None:
            path, accepted, token = mode.select(p, nodes, tree, config, generator)
        else:
            path, accepted, token = walk(p, nodes, q, tree, mode, generator)
        # emit path[1..accepted] then the final token, at slots filled .. filled + accepted
        emitted = all_tokens.gather(1, path.clamp(min=0)[:, 1:])  # (B, D)
        emitted = torch.cat([emitted, token[:, None]], dim=1)  # (B, D+1)
        emitted = torch.where(position[None] == accepted[:, None], token[:, None], emitted)
        write = position[None] <= accepted[:, None]  # (B, D+1)
        slot = (filled[alive][:, None] + position[None]).clamp(max=out.shape[1] - 1)
        out[alive[:, None].expand_as(slot)[write], slot[write]] = emitted[write]
        kept = torch.zeros(B, tree.num_nodes + 1, dtype=torch.bool, device=pair.device)
        kept.scatter_(1, path.clamp(min=0), (path < 0) | write)
        decoder.keep_path(kept)
        last = path.gather(1, accepted[:, None])[:, 0]  # deepest accepted node: the new last fed slot
        head_logits = heads(hidden[rows, last])[..., : pair.vocab_size].double()  # (B, H, V)
        root = token
        counts["chain_steps"] += B
        counts["emitted_tokens"] += int((accepted + 1).sum())
        counts["accepted_nodes"] += int(accepted.sum())
        filled[alive] += accepted + 1
        going = (filled[alive] < length).nonzero()[:, 0]  # (B',)
        if going.numel() < B:
            decoder.select(going)
            alive, root, head_logits = alive[going], root[going], head_logits[going]
    counts["target_passes"] = decoder.passes
    return SampleResult(out[:, :length].cpu(), None, counts)


def medusa_rates(counts: dict, depth: int) -> dict:
    """From a run's summed counts: mean tokens per target pass (accepted path length + 1) and the
    acceptance, accepted nodes per step / tree depth. (Rates are recomputed after merging counts.)"""
    steps = max(1, counts["chain_steps"])
    return {**counts, "tokens_per_target_pass": counts["emitted_tokens"] / steps,
            "acceptance": counts["accepted_nodes"] / (steps * depth)}
