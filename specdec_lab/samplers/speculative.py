"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), batched over chains.

p = target, q = draft. One step, per chain:

    draft:  d_1..d_K with d_i ~ q_i = q(· | x, d_<i)          (K draft passes, ragged batch)
    target: p_1..p_{K+1} = p(· | x, d_<i)                       (one pass over K+1 positions)
    accept: keep d_i while U_i < min(1, p_i(d_i)/q_i(d_i)); n = number kept
    finish: n < K -> y ~ norm((p_{n+1} - q_{n+1})+);  n = K -> bonus y ~ p_{K+1}
    emit d_1..d_n, y                                             (n + 1 tokens per target pass)

Chains accept different n, so caches go ragged: rejected drafts stay in the cache as masked slots
(:class:`~specdec_lab.samplers.decoder.Decoder`). When a chain accepted all K drafts, the draft model
never saw d_K; it is fed at the start of the next step together with y. A chain leaves the batch
(its cache rows dropped) once it has at least L tokens; the last block is truncated so each chain
returns exactly L.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import SamplingConfig, sample
from specdec_lab.samplers.decoder import Decoder
from specdec_lab.samplers.naive import CHUNK, SampleResult, check_request, in_chunks, speculative_rates
from specdec_lab.samplers.rules import LEVIATHAN, Verifier
from specdec_lab.theory import expected_tokens_per_pass  # noqa: F401  (re-exported for callers)


@dataclass(frozen=True)
class SpeculativeConfig:
    k: int = 4  # draft tokens per target pass; 4 is the common serving default
    sampling: SamplingConfig = SamplingConfig()  # applied identically to target and draft
    verifier: Verifier = LEVIATHAN

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (draft tokens per step) must be an integer >= 1, got {self.k!r}")

    def describe(self) -> dict:
        return {"sampler": "speculative", "k": self.k, "verifier": self.verifier.name,
                "lossless": self.verifier.lossless, **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_speculative(pair, prompt, n, length, self, generator)


def propose(draft: Decoder, first: torch.Tensor, keep_first: torch.Tensor | None, k: int,
            config: SpeculativeConfig, generator: torch.Generator):
    """Run K draft passes. first: (B, T0) tokens opening the step -> tokens (B, K), q_ratio (B, K, V)."""
    verifier, tokens, q_ratio = config.verifier, [], []
    logits = draft.feed(first, keep_first)[:, -1]  # (B, V)
    for i in range(k):
        laws = verifier.draft_law(logits, config.sampling)
        d = sample(laws.q_sample, generator)  # (B,)
        tokens.append(d)
        q_ratio.append(laws.q_ratio)
        if i < k - 1:
            logits = draft.feed(d[:, None])[:, -1]
    return torch.stack(tokens, dim=1), torch.stack(q_ratio, dim=1)  # (B, K), (B, K, V)


def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, verifier: Verifier,
           generator: torch.Generator):
    """Accept/reject drafts. p: (B, K+1, V), q: (B, K, V), drafts: (B, K) -> (n (B,), y (B,))."""
    B, K, V = q.shape
    p_x = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
    q_x = q.gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
    u = torch.rand(B, K, generator=generator, dtype=p.dtype, device=p.device)
    accepted = u < verifier.accept_prob(p_x, q_x)  # (B, K)
    n = torch.cumprod(accepted.long(), dim=1).sum(dim=1)  # (B,) accepted before the first rejection
    rows = torch.arange(B, device=p.device)
    stop = torch.clamp(n, max=K - 1)
    residual = verifier.residual(p[rows, stop], q[rows, stop])  # (B, V)
    bonus = p[rows, torch.full_like(n, K + verifier.bonus_offset)]  # (B, V)
    law = torch.where((n == K)[:, None], bonus, residual)
    y = sample(law, generator)
    if not bool((y < V).all()) or not bool((law.gather(-1, y[:, None]) > 0).all()):
        raise AssertionError("a recovered token fell outside the support of its law")
    return n, y


def sample_speculative(pair, prompt: torch.Tensor, n: int, length: int, config: SpeculativeConfig,
                       generator: torch.Generator, chunk: int = CHUNK) -> SampleResult:
    """Draw ``n`` continuations of ``length`` tokens after ``prompt`` (P,) by speculative sampling.

    Returns tokens (N, L) and stats: acceptance (per evaluated draft token), tokens per target pass
    (before truncation), target and draft passes, and the theoretical tokens per pass at that
    acceptance, (1 − α^{K+1})/(1 − α).
    """
    check_request(prompt, n, length)
    return in_chunks(lambda size: _speculative_batch(pair, prompt, size, length, config, generator), n, chunk)


def _speculative_batch(pair, prompt, n, length, config, generator) -> SampleResult:
    K, device = config.k, pair.device
    target = Decoder(pair.target, pair.vocab_size, n, device)
    draft = Decoder(pair.draft, pair.vocab_size, n, device)
    target.prefill(prompt[:-1])
    draft.prefill(prompt[:-1])
    out = torch.zeros(n, length + K + 1, dtype=torch.long, device=device)  # last column: discard slot
    count = torch.zeros(n, dtype=torch.long, device=device)  # tokens emitted per chain
    rows = torch.arange(n, device=device)  # batch slot -> chain; finished chains are dropped
    last = prompt[-1:].to(device).expand(n).clone()  # (B,) latest token, not yet in either cache
    pending = torch.zeros(n, dtype=torch.long, device=device)  # d_K the draft has not seen
    has_pending = torch.zeros(n, dtype=torch.bool, device=device)
    steps = accepted_total = evaluated_total = emitted_total = 0
    while len(rows):
        B = len(rows)
        if bool(has_pending.any()):
            first = torch.stack([pending, last], dim=1)  # (B, 2)
            keep = torch.stack([has_pending, torch.ones_like(has_pending)], dim=1)
        else:
            first, keep = last[:, None], None
        drafts, q = propose(draft, first, keep, K, config, generator)  # (B, K), (B, K, V)
        p_logits = target.feed(torch.cat([last[:, None], drafts], dim=1))  # (B, K+1, V)
        p = config.verifier.target_law(p_logits, config.sampling)
        n_acc, y = verify(p, q, drafts, config.verifier, generator)  # (B,), (B,)

        slot = torch.arange(K, device=device)[None]  # (1, K)
        rejected = slot >= n_acc[:, None]  # (B, K) drafts after the first rejection
        target.discard(rejected)  # target was fed last, d_1..d_K
        draft.discard(rejected[:, : K - 1])  # draft was fed d_1..d_{K-1} after the opening block
        has_pending, pending, last = n_acc == K, drafts[:, K - 1], y

        emitted = torch.cat([~rejected, torch.ones(B, 1, dtype=torch.bool, device=device)], dim=1)  # (B, K+1)
        block = torch.cat([drafts, y[:, None]], dim=1)  # accepted drafts, then y
        write = count[rows, None] + torch.cumsum(emitted, dim=1) - 1  # (B, K+1) output columns
        out[rows] = out[rows].scatter(1, torch.where(emitted, write, out.shape[1] - 1), block)
        count[rows] += n_acc + 1

        steps += B
        accepted_total += int(n_acc.sum())
        evaluated_total += int(torch.clamp(n_acc + 1, max=K).sum())
        emitted_total += int((n_acc + 1).sum())
        alive = count[rows] < length
        if not bool(alive.all()):
            keep_rows = alive.nonzero().squeeze(1)
            rows, last, pending, has_pending = rows[keep_rows], last[keep_rows], pending[keep_rows], has_pending[keep_rows]
            if len(rows):
                target.select(keep_rows)
                draft.select(keep_rows)
    counts = {"k": K, "accepted_drafts": accepted_total, "evaluated_drafts": evaluated_total,
              "emitted_tokens": emitted_total, "chain_steps": steps, "target_passes": target.passes,
              "draft_passes": draft.passes}
    return SampleResult(out[:, :length].cpu(), None, speculative_rates(counts))
