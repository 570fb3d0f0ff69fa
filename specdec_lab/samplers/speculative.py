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

With ``trim=True`` a chain missing r tokens drafts only k = min(K, r − 1): nothing is drafted that
truncation would throw away. Chains are kept sorted by k, so each draft pass runs over a prefix of
the batch and the target pass is one forward per distinct k (``Decoder.feed(widths=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import SamplingConfig, inverse_cdf, sample
from specdec_lab.samplers.block import verify_block
from specdec_lab.samplers.decoder import Decoder
from specdec_lab.samplers.protocol import CHUNK, SampleResult, check_request, in_chunks, speculative_rates
from specdec_lab.samplers.rules import LEVIATHAN, Verifier
from specdec_lab.theory import expected_tokens_per_pass  # noqa: F401  (re-exported for callers)


@dataclass(frozen=True)
class SpeculativeConfig:
    k: int = 4  # draft tokens per target pass; 4 is the common serving default
    sampling: SamplingConfig = SamplingConfig()  # applied identically to target and draft
    verifier: Verifier = LEVIATHAN
    # trim: a chain missing r tokens drafts min(K, r − 1), as HF assisted generation does. The same
    # law for a lossless rule and ~20% less work at L = 8 (see draft_lengths); off by default because a
    # faulty rule's law then depends on L (at L = 1 every rule samples p), and exact.py describes fixed K.
    trim: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (draft tokens per step) must be an integer >= 1, got {self.k!r}")
        if not isinstance(self.trim, bool):
            raise ValueError(f"trim must be True or False, got {self.trim!r}")

    def describe(self) -> dict:
        return {"sampler": "speculative", "k": self.k, "trim": self.trim, "verifier": self.verifier.name,
                "lossless": self.verifier.lossless, **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_speculative(pair, prompt, n, length, self, generator)


def propose(draft: Decoder, first: torch.Tensor, keep_first: torch.Tensor | None, k: torch.Tensor,
            config: SpeculativeConfig, generator: torch.Generator):
    """Draft k[b] tokens for chain b (k non-increasing). first: (B, T0) tokens opening the step.

    Returns tokens (B, k_max), q_ratio (B, k_max, V) and the uniforms each token was drawn with (B, k_max), zero past
    each chain's k[b]. Draft pass i runs only over the chains that still need a token (a prefix of the batch)."""
    verifier, B, k_max = config.verifier, len(k), int(k[0])
    tokens = torch.zeros(B, k_max, dtype=torch.long, device=k.device)
    q_ratio = torch.zeros(B, k_max, draft.vocab_size, dtype=config.sampling.dtype, device=k.device)
    uniforms = torch.zeros(B, k_max, dtype=config.sampling.dtype, device=k.device)
    if k_max == 0:
        return tokens, q_ratio, uniforms
    logits = draft.feed(first, keep_first, widths=torch.where(k > 0, first.shape[1], 0))[:, -1]  # (B, V)
    for i in range(k_max):
        b = int((k > i).sum())  # chains drafting token i + 1
        laws = verifier.draft_law(logits[:b], config.sampling)
        u = torch.rand(b, 1, generator=generator, dtype=laws.q_sample.dtype, device=k.device)  # as sample() draws
        tokens[:b, i] = inverse_cdf(laws.q_sample, u)[:, 0]
        uniforms[:b, i] = u[:, 0]
        q_ratio[:b, i] = laws.q_ratio
        if i < k_max - 1:
            logits = draft.feed(tokens[:, i : i + 1], widths=(k > i + 1).long())[:, -1]
    return tokens, q_ratio, uniforms


def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor, verifier: Verifier,
           generator: torch.Generator, draft_u: torch.Tensor):
    """Accept/reject the first k[b] drafts of chain b. p: (B, K+1, V), q: (B, K, V), drafts: (B, K),
    k: (B,) in [0, K], draft_u: (B, K) the uniforms the drafts were drawn with -> (n (B,) accepted drafts,
    y (B,) the token after them)."""
    B, K, V = q.shape
    drafted = torch.arange(K, device=p.device)[None] < k[:, None]  # (B, K)
    p_x = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K)
    q_x = torch.where(drafted, q.gather(-1, drafts[..., None]).squeeze(-1), 1.0)  # (B, K)
    u = verifier.noise.uniforms(draft_u, generator)  # (B, K); a correct rule draws them afresh
    accepted = drafted & (u < verifier.accept_prob(p_x, q_x))  # (B, K)
    n = torch.cumprod(accepted.long(), dim=1).sum(dim=1)  # (B,) accepted before the first rejection
    rows = torch.arange(B, device=p.device)
    bonus = p[rows, torch.clamp(k + verifier.bonus_offset, min=0)]  # (B, V)
    if K == 0:  # no chain drafted: a plain sample from p
        residual = bonus
    else:
        stop = torch.clamp(torch.minimum(n, k - 1), min=0)
        residual = verifier.residual(p[rows, stop], q[rows, stop])  # (B, V)
    law = torch.where((n == k)[:, None], bonus, residual)
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


def draft_lengths(count: torch.Tensor, length: int, config: SpeculativeConfig) -> torch.Tensor:
    """Drafts per chain this step (B,): K; with ``config.trim`` fewer when the chain needs fewer
    tokens — a step emits at most k + 1, so min(K, remaining − 1) never overshoots L. Any k fixed
    before the step's draws keeps a lossless step lossless; a chain one token short gets k = 0, a
    plain sample from p."""
    if not config.trim:
        return torch.full_like(count, config.k)
    return torch.clamp(length - count - 1, max=config.k)


def _speculative_batch(pair, prompt, n, length, config, generator) -> SampleResult:
    K, device = config.k, pair.device
    target = Decoder(pair.target, pair.vocab_size, n, device)
    draft = Decoder(pair.draft, pair.vocab_size, n, device)
    room = length * (K + 1)  # each step feeds at most K + 1 slots to either model, at most L steps
    target.prefill(prompt[:-1], room=room)
    draft.prefill(prompt[:-1], room=room)
    out = torch.zeros(n, length + K + 1, dtype=torch.long, device=device)  # last column: discard slot
    count = torch.zeros(n, dtype=torch.long, device=device)  # tokens emitted per chain
    rows = torch.arange(n, device=device)  # batch slot -> chain, sorted by k; finished chains are dropped
    k = draft_lengths(count, length, config)  # (B,) drafts this step, non-increasing
    last = prompt[-1:].to(device).expand(n).clone()  # (B,) latest token, not yet in either cache
    pending = torch.zeros(n, dtype=torch.long, device=device)  # d_k the draft has not seen
    has_pending = torch.zeros(n, dtype=torch.bool, device=device)
    totals = dict.fromkeys(("accepted_drafts", "evaluated_drafts", "emitted_tokens", "chain_steps",
                            "full_steps", "full_emitted_tokens"), 0)
    while len(rows):
        B, k_max = len(rows), int(k[0])
        if bool(has_pending.any()):
            first = torch.stack([pending, last], dim=1)  # (B, 2)
            keep = torch.stack([has_pending, torch.ones_like(has_pending)], dim=1)
        else:
            first, keep = last[:, None], None
        drafts, q, draft_u = propose(draft, first, keep, k, config, generator)  # (B, k_max), (B, k_max, V), (B, k_max)
        p_logits = target.feed(torch.cat([last[:, None], drafts], dim=1), widths=k + 1)  # (B, k_max+1, V)
        p = config.verifier.target_law(p_logits, config.sampling)
        judge = verify_block if config.verifier.block else verify
        n_acc, y = judge(p, q, drafts, k, config.verifier, generator, draft_u)  # (B,), (B,)

        slot = torch.arange(k_max, device=device)[None]  # (1, k_max)
        rejected = slot >= n_acc[:, None]  # (B, k_max) drafts after the first rejection (or never drafted)
        target.discard(rejected)  # target was fed last, d_1..d_k
        draft.discard(rejected[:, : k_max - 1])  # draft was fed d_1..d_{k-1} after the opening block
        has_pending = (n_acc == k) & (k > 0)
        if k_max > 0:  # (with k_max = 0 every chain is one token short and finishes now)
            pending = drafts.gather(1, torch.clamp(k - 1, min=0)[:, None]).squeeze(1)
        last = y

        emitted = torch.cat([~rejected, torch.ones(B, 1, dtype=torch.bool, device=device)], dim=1)  # (B, k_max+1)
        block = torch.cat([drafts, y[:, None]], dim=1)  # accepted drafts, then y
        write = count[rows, None] + torch.cumsum(emitted, dim=1) - 1  # (B, k_max+1) output columns
        out[rows] = out[rows].scatter(1, torch.where(emitted, write, out.shape[1] - 1), block)
        count[rows] += n_acc + 1

        full = k == K
        totals["chain_steps"] += B
        totals["accepted_drafts"] += int(n_acc.sum())
        totals["evaluated_drafts"] += int(torch.minimum(n_acc + 1, k).sum())
        totals["emitted_tokens"] += int((n_acc + 1).sum())
        totals["full_steps"] += int(full.sum())
        totals["full_emitted_tokens"] += int((n_acc + 1)[full].sum())

        # next step: drop finished chains; when trimming, sort the rest by k (descending) so equal k are contiguous
        order = (count[rows] < length).nonzero().squeeze(1)  # (B',)
        k = draft_lengths(count[rows[order]], length, config)
        if config.trim:
            k, by_k = k.sort(descending=True, stable=True)
            order = order[by_k]
        if len(order) < B or not bool((order == torch.arange(B, device=device)).all()):
            rows, last, pending, has_pending = rows[order], last[order], pending[order], has_pending[order]
            if len(rows):
                target.select(order)
                draft.select(order)
    counts = {"k": K, **totals, "target_passes": target.passes, "draft_passes": draft.passes}
    return SampleResult(out[:, :length].cpu(), None, speculative_rates(counts))
