"""Notebook 04, Medusa trees: exact tree laws on real contexts, typical acceptance's TV grid, Medusa runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from specdec_lab import laws, plots
from specdec_lab.experiments.chi_square import check_sampler, summary  # noqa: F401 (for the notebook)
from specdec_lab.experiments.proof_by_numbers import PROMPTS, SETTINGS  # noqa: F401 (for the notebook)
from specdec_lab.experiments.scale import default_device, setup  # noqa: F401 (for the notebook)
from specdec_lab.plots import token_strings  # noqa: F401 (for the notebook)
from specdec_lab.sampling import make_generator, to_probs
from specdec_lab.samplers.naive import NaiveConfig, sample_naive


def medusa_contexts(pair, prompts: list[str], chains: int, positions: int, seed: int = 0) -> list[torch.Tensor]:
    """Real contexts for exact Medusa checks: each prompt followed by the first j tokens (j = 1..positions)
    of ``chains`` continuations the target wrote (so every context has the 2 tokens Medusa needs)."""
    contexts = []
    for i, text in enumerate(prompts):
        ids = pair.encode(text)
        cont = sample_naive(pair, ids, chains, positions, NaiveConfig(), make_generator(seed + i, pair.device)).tokens
        contexts += [torch.cat([ids, row[:j]]) for row in cont for j in range(1, positions + 1)]
    return contexts


def tree_labels(pair, heads, prompt_ids: torch.Tensor, tree) -> list[str]:
    """Node labels for :func:`specdec_lab.plots.tree`: the root token and each node's top-k candidate."""
    nodes, _, _ = laws.medusa_tree_at(pair, heads, prompt_ids, tree)
    return [plots.token_label(pair.decode(prompt_ids[-1:].tolist()))] + [plots.token_label(pair.decode([t]))
                                                                       for t in nodes.tolist()]


def medusa_exact_table(pair, heads, contexts, tree, settings: dict) -> pd.DataFrame:
    """Exact first-token law of one lossless tree step against p, at every context and setting.

    ``rejection_topk``: the root's distinct top-k candidates, recursive point-mass rejection;
    ``rejection_iid``: as many i.i.d. draws from head 1's q as the root has children (SpecInfer).
    """
    root_children = tree.children[0][tree.children[0] >= 0]
    errors = {(mode, label): 0.0 for mode in ("rejection_topk", "rejection_iid") for label in settings}
    acceptance = {label: [] for label in settings}
    for context in contexts:
        nodes, logits, head_logits = laws.medusa_tree_at(pair, heads, context, tree)
        for label, config in settings.items():
            p = to_probs(logits[0], config)
            q = to_probs(head_logits[0], config)
            topk = laws.tree_first_token_law(p, nodes[root_children - 1], None, "rejection_topk")
            iid = laws.tree_first_token_law(p, None, q, "rejection_iid", len(root_children))
            errors["rejection_topk", label] = max(errors["rejection_topk", label], float((topk - p).abs().max()))
            errors["rejection_iid", label] = max(errors["rejection_iid", label], float((iid - p).abs().max()))
            acceptance[label].append(float(torch.minimum(p, q).sum()))
    return pd.DataFrame([{"mode": mode, "settings": label, "contexts": len(contexts), "max |law - p|": err,
                          "mean Σ min(p, q_head1)": float(np.mean(acceptance[label]))}
                         for (mode, label), err in errors.items()])


def typical_tv_grid(pair, heads, contexts, tree, epsilons, alphas, temperatures) -> pd.DataFrame:
    """Mean over contexts of the exact TV between Medusa typical acceptance's first-token law and p,
    on a grid of ε, α and temperature (:func:`specdec_lab.laws.tv_typical`)."""
    rows = []
    for context in contexts:
        nodes, logits, _ = laws.medusa_tree_at(pair, heads, context, tree)
        rows += laws.tv_typical(logits, nodes, tree, epsilons, alphas, temperatures)
    return pd.DataFrame(rows).groupby(["temperature", "epsilon", "alpha"], as_index=False)["tv"].mean()


def medusa_runs(pair, prompt_ids: torch.Tensor, configs: dict, n: int, length: int, seed: int = 0) -> pd.DataFrame:
    """Sample each Medusa configuration: mean accepted tree depth and tokens per target pass."""
    from specdec_lab.samplers.medusa import sample_medusa

    rows = []
    for i, (name, config) in enumerate(configs.items()):
        s = sample_medusa(pair, prompt_ids, n, length, config, make_generator(seed + i, pair.device)).stats
        rows.append({"run": name, "mode": config.mode, "lossless": config.lossless, "tree": config.tree.describe(),
                     "temperature": config.sampling.temperature,
                     "accepted per pass": s["accepted_nodes"] / max(1, s["chain_steps"]),
                     "tokens per target pass": s["emitted_tokens"] / max(1, s["chain_steps"])})
    return pd.DataFrame(rows)
