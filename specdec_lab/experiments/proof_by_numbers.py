"""Notebook 02, the proof by numbers: exact laws of every rule on real p and q, same-seed paths, greedy effects."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from specdec_lab import laws, stats
from specdec_lab.laws import cached_logits_at, first_token_law, first_token_logits  # noqa: F401 (for the notebook)
from specdec_lab.experiments.scale import default_device, setup  # noqa: F401 (for the notebook)
from specdec_lab.plots import token_strings  # noqa: F401 (for the notebook)
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.samplers.naive import NaiveConfig, sample_naive
from specdec_lab.samplers.speculative import SpeculativeConfig, sample_speculative


PROMPTS = ["ROMEO:\n", "KING.\nWhat", "First Citizen:\nBefore we proceed", "O"]  # real contexts


SETTINGS = {  # sampling settings the exact-law check covers
    "T=1": SamplingConfig(),
    "T=0.7": SamplingConfig(temperature=0.7),
    "top-k=20": SamplingConfig(top_k=20),
    "top-p=0.9": SamplingConfig(top_p=0.9),
    "T=1.3 top-k=50 top-p=0.95": SamplingConfig(temperature=1.3, top_k=50, top_p=0.95),
}


def real_logits(pair, prompts: list[str], chains: int, positions: int = 12, seed: int = 0):
    """Target and draft logits at real prefixes: ``chains`` sampled continuations of each prompt,
    read at each of ``positions`` new tokens. Returns two float64 tensors (len(prompts)·chains·positions, V)."""
    target, draft = [], []
    for i, text in enumerate(prompts):
        ids = pair.encode(text)
        cont = sample_naive(pair, ids, chains, positions, NaiveConfig(), make_generator(seed + i, pair.device)).tokens
        seqs = torch.cat([ids.expand(chains, -1), cont], dim=1).to(pair.device)  # (chains, P + positions)
        with torch.no_grad():
            for model, out in ((pair.target, target), (pair.draft, draft)):
                logits = model(input_ids=seqs).logits[:, -positions:, : pair.vocab_size]
                out.append(logits.reshape(-1, pair.vocab_size).double().cpu())
    return torch.cat(target), torch.cat(draft)


def law_errors(target_logits: torch.Tensor, draft_logits: torch.Tensor, settings: dict, verifiers) -> pd.DataFrame:
    """For each rule and sampling setting: max |law − p| of one step over all prefixes (n, V),
    with the mean TV(q, p) and mean acceptance Σ min(p, q) there (how different the draft is)."""
    rows = []
    for verifier in verifiers:
        for label, config in settings.items():
            p = to_probs(target_logits, config)
            law = laws.step_law(target_logits, draft_logits, config, verifier)  # (n, V)
            q = verifier.draft_law(draft_logits, config).q_sample
            rows.append({"rule": verifier.name, "settings": label, "prefixes": len(p),
                         "max |law - p|": float((law - p).abs().max()),
                         "mean TV(q, p)": float(laws.tv(q, p).mean()),
                         "mean acceptance": float(torch.minimum(p, q).sum(-1).mean())})
    return pd.DataFrame(rows)


def exact_rule_table(pair, prompt_ids: torch.Tensor, runs: list[tuple[str, object, bool]],
                     length: int = 2) -> pd.DataFrame:
    """Exact TV and max |law − p| over the first ``length`` tokens for every speculative run.

    ``runs`` are ``(name, SpeculativeConfig, lossless)`` as from
    :func:`specdec_lab.verify.samplers_to_run`; other samplers are skipped.
    """
    logits_at = cached_logits_at(pair, prompt_ids)
    rows = []
    for name, sampler, lossless in runs:
        if not isinstance(sampler, SpeculativeConfig):
            continue  # incl. overlapping streams: its fault is dependence between draws, which no one-draw law shows
        law = laws.sequence_law(logits_at, pair.vocab_size, sampler.k, length, sampler.sampling,
                                 sampler.verifier)
        rows.append({"rule": name, "lossless": lossless, "k": sampler.k, **sampler.sampling.describe(),
                     "exact TV": law.tv, "max |law - p|": law.max_abs_error,
                     "bug": sampler.verifier.description if not lossless else ""})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class SeedPaths:
    """Naive and speculative chains drawn with the same seed, and how often they coincide."""

    naive: np.ndarray  # (N, L)
    speculative: np.ndarray  # (N, L)
    identical_chains: float  # fraction of chains equal token for token
    agreement_by_position: np.ndarray  # (L,) fraction equal at each position


def same_seed_paths(pair, prompt_ids: torch.Tensor, n: int, length: int, seed: int,
                    config: SpeculativeConfig = SpeculativeConfig()) -> SeedPaths:
    """Draw ``n`` chains from p directly and by speculative sampling, both from ``make_generator(seed)``."""
    naive = sample_naive(pair, prompt_ids, n, length, NaiveConfig(config.sampling),
                         make_generator(seed, pair.device)).tokens.numpy()
    spec = sample_speculative(pair, prompt_ids, n, length, config, make_generator(seed, pair.device)).tokens.numpy()
    equal = naive == spec
    return SeedPaths(naive, spec, float(equal.all(axis=1).mean()), equal.mean(axis=0))


def paths_table(pair, paths: SeedPaths, rows: int = 5) -> pd.DataFrame:
    """The first ``rows`` chains of both samplers, decoded, side by side."""
    return pd.DataFrame({"naive": [pair.decode(t) for t in paths.naive[:rows].tolist()],
                         "speculative": [pair.decode(t) for t in paths.speculative[:rows].tolist()],
                         "identical": (paths.naive[:rows] == paths.speculative[:rows]).all(axis=1)})


def paths_tests(paths: SeedPaths, p: np.ndarray, seed: int = 0) -> pd.DataFrame:
    """Both samplers' first tokens tested against the exact p: different samples, one law."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, tokens in (("naive", paths.naive), ("speculative", paths.speculative)):
        counts = np.bincount(tokens[:, 0], minlength=len(p))
        res = stats.chisquare_identity(counts, p, rng=rng)
        rows.append({"sampler": name, "m": int(counts.sum()), "Pearson X²": res.statistic, "df": res.df,
                     "p-value": res.pvalue, "tail p-value": res.tail_pvalue, "TV plug-in": stats.tv_plugin(counts, p)})
    return pd.DataFrame(rows)


def greedy_speculative_vs_naive(pair, prompt_ids: torch.Tensor, length: int, k: int = 4) -> pd.DataFrame:
    """Greedy (temperature 0) speculative decoding against greedy plain decoding, token for token."""
    greedy = SamplingConfig(temperature=0.0)
    naive = sample_naive(pair, prompt_ids, 1, length, NaiveConfig(greedy), make_generator(0, pair.device)).tokens[0]
    spec = sample_speculative(pair, prompt_ids, 1, length, SpeculativeConfig(k=k, sampling=greedy),
                              make_generator(1, pair.device))
    return pd.DataFrame([{"k": k, "length": length, "identical": bool((naive == spec.tokens[0]).all()),
                          "acceptance": spec.stats["acceptance"],
                          "tokens per target pass": spec.stats["tokens_per_target_pass"],
                          "text": pair.decode(naive.tolist())}])


def greedy_batch_effect(pair, prompt_ids: torch.Tensor, length: int, batch_sizes=(1, 8, 64, 256)) -> pd.DataFrame:
    """Greedy decoding of one prompt, alone and copied across bigger batches.

    For each batch size B: do all B greedy chains equal the batch-1 chain; the largest difference
    between the batch-B and batch-1 logits along that chain (teacher-forced, one forward); and the
    smallest gap between the top two logits on the chain (a flip needs a gap below the noise).
    """
    greedy = NaiveConfig(SamplingConfig(temperature=0.0))
    reference = sample_naive(pair, prompt_ids, 1, length, greedy, make_generator(0, pair.device)).tokens[0]
    sequence = torch.cat([prompt_ids, reference]).to(pair.device)  # (P + L,)
    P = prompt_ids.numel()

    @torch.no_grad()
    def logits_in_batch(B: int) -> torch.Tensor:
        out = pair.target(input_ids=sequence.expand(B, -1)).logits[:, P - 1:-1, : pair.vocab_size]
        return out.double().cpu()  # (B, L, V)

    alone = logits_in_batch(1)[0]  # (L, V)
    top2 = torch.topk(alone, 2, dim=-1).values
    gap = float((top2[:, 0] - top2[:, 1]).min())
    rows = []
    for B in batch_sizes:
        tokens = sample_naive(pair, prompt_ids, B, length, greedy, make_generator(0, pair.device)).tokens
        rows.append({"batch size": B, "chains equal to batch-1 chain": float((tokens == reference).all(dim=1).float().mean()),
                     "max |logit difference|": float((logits_in_batch(B) - alone).abs().max()),
                     "smallest top-2 logit gap": gap})
    return pd.DataFrame(rows)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def greedy_precision_effect(pair, prompt_ids: torch.Tensor, length: int,
                            dtypes=("float32", "bfloat16")) -> pd.DataFrame:
    """Greedy decoding of one prompt with the target's weights and activations in each dtype.

    The first dtype is the reference. For each: the first position (1-based) where its greedy
    chain leaves the reference chain (None if never) and the share of positions that agree.
    """
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; valid dtypes: {', '.join(DTYPES)}")
    greedy = NaiveConfig(SamplingConfig(temperature=0.0))
    chains = []
    for name in dtypes:
        cast = replace(pair, target=copy.deepcopy(pair.target).to(DTYPES[name]))
        chains.append((name, sample_naive(cast, prompt_ids, 1, length, greedy, make_generator(0, pair.device)).tokens[0]))
    reference = chains[0][1]
    rows = []
    for name, chain in chains:
        differs = (chain != reference).nonzero()
        rows.append({"dtype": name,
                     "first differing position": int(differs[0, 0]) + 1 if len(differs) else None,
                     "positions agreeing": float((chain == reference).float().mean()),
                     "text": pair.decode(chain.tolist())})
    return pd.DataFrame(rows)


def block_argument(pair, prompt_ids: torch.Tensor, config: SamplingConfig = SamplingConfig()) -> dict:
    """The K-token block, checked by enumeration on a real pair: the law of token 2 given token 1 by each
    route through a block, and the exact TV over two tokens of the right rule and of two wrong ones.

    After token 1 = t (the most likely first token under p), token 2 is emitted by one of three routes:

    * **second draft** (K = 2, t was the accepted first draft): one verification step at prefix t with the
      draft's second proposal, drawn from q(· | t); its law is kept + replaced at prefix t, i.e. p(· | t);
    * **bonus** (K = 1, t accepted, the block exhausted): a draw from p at position K + 1, p(· | t);
    * **new block** (t was a replacement after a rejection; every later draft is dropped): a new block's first
      verification step at prefix t, again p(· | t).

    Wrong routes: **drafts after a rejection kept** (the second draft was proposed after the *rejected* token x
    and verified against p(· | x)); its law given t is Σ_x w(x) p(· | x) with w ∝ (q − p)+ over x, whatever t
    is; **bonus from position K** (the logits one position early): p(· | prompt) instead of p(· | t).
    The exact joint TVs come from :func:`specdec_lab.laws.sequence_law` (the library's enumeration of the block,
    K = 1 and K = 2) and, for the kept-drafts fault, from the same decomposition computed here.
    """
    from specdec_lab.samplers.faulty import FAULTY
    from specdec_lab.samplers.rules import LEVIATHAN

    logits_at = cached_logits_at(pair, prompt_ids)
    V = pair.vocab_size
    t_logits, d_logits = logits_at(torch.zeros(1, 0, dtype=torch.long))  # (1, V) each
    p1 = to_probs(t_logits[0], config)
    kept1, replaced1 = laws.step_parts(t_logits[0], d_logits[0], config, LEVIATHAN)  # (V,)
    t2_logits, d2_logits = logits_at(torch.arange(V)[:, None])  # (V, V): the laws after each first token
    p2 = to_probs(t2_logits, config)  # (V, V) p(· | x)
    step2 = laws.step_law(t2_logits, d2_logits, config, LEVIATHAN)  # (V, V) one verification step at prefix x
    q1 = to_probs(d_logits[0], config)
    w = torch.clamp(q1 - p1, min=0.0)
    kept_drafts_law = (w[:, None] * p2).sum(0) / w.sum()  # token 2 after a rejection when x's drafts are kept
    joint_right = kept1[:, None] * step2 + replaced1[:, None] * step2
    joint_target = p1[:, None] * p2
    joint_kept = kept1[:, None] * step2 + replaced1[:, None] * kept_drafts_law[None, :]
    t = int(torch.argmax(p1))
    routes = {"second draft (K = 2, token 1 accepted)": step2[t].numpy(),
              "bonus from p at K + 1 (K = 1)": p2[t].numpy(),
              "new block after a rejection": step2[t].numpy(),
              "✗ drafts after a rejection kept": kept_drafts_law.numpy(),
              "✗ bonus from p at position K": p1.numpy()}
    k1 = laws.sequence_law(logits_at, V, 1, 2, config, LEVIATHAN)
    k2 = laws.sequence_law(logits_at, V, 2, 2, config, LEVIATHAN)
    bonus = laws.sequence_law(logits_at, V, 1, 2, config, FAULTY["bonus_wrong_position"])
    tv = pd.DataFrame([
        {"rule": "Leviathan, K = 1 (bonus at token 2)", "exact TV": k1.tv, "max |law − p|": k1.max_abs_error},
        {"rule": "Leviathan, K = 2 (second draft at token 2)", "exact TV": k2.tv, "max |law − p|": k2.max_abs_error},
        {"rule": "this decomposition, K = 2", "exact TV": float(0.5 * (joint_right - joint_target).abs().sum()),
         "max |law − p|": float((joint_right - joint_target).abs().max())},
        {"rule": "✗ drafts after a rejection kept, K = 2", "exact TV": float(0.5 * (joint_kept - joint_target).abs().sum()),
         "max |law − p|": float((joint_kept - joint_target).abs().max())},
        {"rule": "✗ bonus from position K, K = 1", "exact TV": bonus.tv, "max |law − p|": bonus.max_abs_error},
    ])
    return {"first token": pair.decode([t]), "p next": p2[t].numpy(), "routes": routes, "tv": tv,
            "decomposition vs library": float((joint_right - k2.law).abs().max())}


# ---------------------------------------------------------------- block verification (Sun et al. 2025)

# The 3-token toy of the numpy enumerator above it in notebook 02: p(x | previous token) and q(x | previous token) over
# tokens 0, 1, 2; row 3 is the start (before any token).
TOY_P = np.array([[.5, .3, .2], [.1, .6, .3], [.4, .1, .5], [.2, .5, .3]])
TOY_Q = np.array([[.2, .2, .6], [.3, .3, .4], [.6, .2, .2], [.5, .2, .3]])


def toy_logits_at(P: np.ndarray = TOY_P, Q: np.ndarray = TOY_Q):
    """``logits_at`` (:mod:`specdec_lab.laws`) of the toy chains: the law after a prefix depends on its last token,
    the start row (the last row) when the prefix is empty."""
    target, draft = torch.log(torch.tensor(P)), torch.log(torch.tensor(Q))
    start = len(P) - 1

    def logits_at(prefixes: torch.Tensor):
        state = prefixes[:, -1] if prefixes.shape[1] else torch.full((len(prefixes),), start, dtype=torch.long)
        return target[state], draft[state]

    return logits_at


def toy_blocks(verifier=None, k: int = 2) -> pd.DataFrame:
    """Every K = 2 block the toy's draft can propose after the start: its probability, and the chance that the token-wise
    rule and block verification keep both drafts and keep the first (from :func:`specdec_lab.laws.block_outcomes`)."""
    from specdec_lab.samplers.rules import BLOCK

    verifier = verifier or BLOCK
    tree = laws.block_tree(toy_logits_at(), torch.zeros(0, dtype=torch.long), k, SamplingConfig(), verifier,
                           bonus=False)
    out = laws.block_outcomes(tree, verifier)
    leaves, first = tree.tokens[k], tree.parent[k]
    q1 = tree.q_sample[0][0, leaves[:, 0]]
    q2 = tree.q_sample[1][first, leaves[:, 1]]
    a1 = torch.clamp(tree.p[0][0, leaves[:, 0]] / q1, max=1.0)
    a2 = torch.clamp(tree.p[1][first, leaves[:, 1]] / q2, max=1.0)
    kept_two = out.kept[k] / (q1 * q2)  # P(τ = 2 | block)
    return pd.DataFrame({"drafts": [tuple(row) for row in leaves.tolist()], "q(block)": (q1 * q2).numpy(),
                         "token-wise keeps both": (a1 * a2).numpy(), "block keeps both": kept_two.numpy()})


def toy_law_tv(verifier=None, k: int = 2, length: int = 3) -> float:
    """Exact TV between the toy's law of the first ``length`` tokens under ``verifier`` (block verification by default)
    and the chain rule of p."""
    from specdec_lab.samplers.rules import BLOCK

    return laws.sequence_law(toy_logits_at(), 3, k, length, SamplingConfig(), verifier or BLOCK).tv


def block_tokens_per_pass(pair, prompt_ids: torch.Tensor, settings: dict, samples: int, seed: int = 0) -> pd.DataFrame:
    """Tokens per target pass of block verification against the token-wise rule on the real pair, per sampling setting:
    exact for one K = 2 block after the prompt (:func:`specdec_lab.laws.tokens_per_pass`) and measured over ``samples``
    chains of K + 2 tokens at K = 2 and K = 4 (both rules on the same seed)."""
    from specdec_lab.samplers.rules import BLOCK, LEVIATHAN

    logits_at = cached_logits_at(pair, prompt_ids)
    rows = []
    for label, config in settings.items():
        tree = laws.block_tree(logits_at, torch.zeros(0, dtype=torch.long), 2, config, BLOCK, bonus=False)
        exact = laws.tokens_per_pass(tree, BLOCK)
        row = {"settings": label, "exact K=2 block": exact["block"], "exact K=2 token-wise": exact["tokenwise"]}
        for k in (2, 4):
            for rule, verifier in (("block", BLOCK), ("token-wise", LEVIATHAN)):
                spec = SpeculativeConfig(k=k, sampling=config, verifier=verifier)
                stats_ = sample_speculative(pair, prompt_ids, samples, k + 2, spec, make_generator(seed, pair.device)).stats
                row[f"measured K={k} {rule}"] = stats_["tokens_per_target_pass"]
        rows.append(row)
    return pd.DataFrame(rows)


def block_with_stop(stop):
    """Block verification (:data:`specdec_lab.samplers.rules.BLOCK`) with another stop rule ``stop(w, r) -> h``: the
    notebook's break-it-yourself handle (the correct rule is :func:`specdec_lab.samplers.rules.lookahead_stop`)."""
    from specdec_lab.samplers.rules import BLOCK

    return replace(BLOCK, name="block (edited stop rule)", block=stop)
