"""Hugging Face transformers' verification kernel in the contract.

``transformers.generation.utils._speculative_sampling`` (transformers 5.24.0) verifies one request's
candidates: it takes the assistant's (processed) logits and the target's logits *after* the
generation's logits processors, and draws with the global torch generator. The adapter runs, per
row, what ``_assisted_decoding`` runs: HF's own warpers (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, in the order ``generate`` builds them) on each target
position, then ``_speculative_sampling`` with the draft law as logits (log q; −inf where q = 0),
inside ``torch.random.fork_rng`` seeded from the contract's generator (the caller's global stream is
left untouched). HF's assisted generation takes batch size 1, hence the loop over rows; its greedy
path is other code (``do_sample=False``), so the adapter takes no greedy rows.
"""

from __future__ import annotations

import torch

from specdec_lab.kernels.contract import KernelSpec, draft_counts


def hf_warpers(temperature: float, top_k: int, top_p: float):
    """HF's ``LogitsProcessorList`` for one row, as ``generate`` orders it: temperature, top-k, top-p."""
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def hf_kernel(target_logits, draft_probs, draft_tokens, temperature, top_k, top_p, generator):
    """The contract around ``_speculative_sampling``, one row at a time (see the module notes)."""
    from transformers.generation.utils import _speculative_sampling

    B, K1, V = target_logits.shape
    n = draft_counts(draft_tokens)
    out = torch.full((B, K1), -1, dtype=torch.long)
    seed = int(torch.randint(2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for b in range(B):
            nb = int(n[b])
            warpers = hf_warpers(float(temperature[b]), int(top_k[b]), float(top_p[b]))
            candidates = draft_tokens[b:b + 1, :nb]  # (1, n)
            logits = target_logits[b:b + 1, : nb + 1].clone()  # (1, n+1, V)
            for i in range(nb + 1):
                logits[:, i] = warpers(candidates[:, :i], logits[:, i])
            draft_logits = torch.log(draft_probs[b:b + 1, :nb])  # (1, n, V)
            tokens, _ = _speculative_sampling(candidates, draft_logits, nb, logits)
            out[b, : tokens.shape[1]] = tokens[0]
    return out


HF = KernelSpec("hf_speculative_sampling", hf_kernel, ragged=True, greedy=False,
                description="transformers 5.24.0 _speculative_sampling behind HF's own warpers, one row at a time")
