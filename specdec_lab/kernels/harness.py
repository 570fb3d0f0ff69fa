"""Run a kernel on a batch of scenarios many times, stream the counts, and judge them.

**Streaming.** Draws for one row scenario are i.i.d. repeats of the same (logits, draft law)
input, so a call replicates each scenario row ``replicas`` times (scenario-major: rows
``s·R … s·R + R − 1`` are scenario s), draws fresh drafts x_j ~ q_j for every replica, calls the
kernel, and adds the emitted tokens to per-(row, position) counts with one ``bincount``. Memory is
the batch's inputs (copied into reused buffers before each call, since kernels may write in place)
plus the (S, K+1, V) counts; never samples × V.

**Judgement** (:func:`judge`), every test against the closed-form law of :mod:`specdec_lab.kernels.law`:

- *law* — per row and position j, the tokens emitted at j by the draws that reached j, against p_j:
  :func:`specdec_lab.stats.chisquare_identity` (Pearson, tail merged, with its tail test; the two
  combined by Bonferroni), plus the certified bound :func:`specdec_lab.stats.tv_upper_bound`;
  a token of probability 0 is a certain rejection;
- *acceptance* — per row and draft position j, the draws that went on to j + 1 among those that reached
  j, against Binomial(reached, β_j) (exact two-sided binomial test);
- *independence* — rows of one call must be independent: for every pair of scenario rows (replica r of
  one against replica r of the other, and neighbouring replicas of one row), the randomized PITs
  u = F_p(x⁻) + V·p(x) of their position-0 tokens, i.i.d. Uniform(0, 1) under H0, have
  Σ 12 (u − ½)(u′ − ½) / √N ≈ N(0, 1);
- *contract* — outputs of the wrong form (:func:`~specdec_lab.kernels.contract.contract_violations`).

All p-values go through :func:`specdec_lab.stats.holm`; a row fails when one of its tests is rejected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec_lab.kernels.contract import KernelSpec, contract_violations
from specdec_lab.kernels.law import RowLaw, kernel_draft_law, row_law
from specdec_lab.kernels.scenarios import Batch
from specdec_lab.sampling import inverse_cdf, make_generator

BUFFER_BYTES = 256 * 2**20  # inputs of one call: replicas are chosen to stay near this


@dataclass(frozen=True)
class AuditSettings:
    """How much to sample and how strictly to judge."""

    samples: int = 2_000  # draws per scenario row (position 0; later positions get the draws that reach them)
    seed: int = 0  # seeds the kernel's generator, the drafts and the PIT randomization
    replicas: int | None = None  # copies of each scenario row per call; None: fit BUFFER_BYTES (max 64)
    alpha: float = 1e-3  # family-wise error over all tests of one audit (Holm)
    confidence: float = 0.99  # of the TV upper bounds reported
    tolerance: float = 0.05  # ε: the kernel is certified when every law test's TV bound is <= ε (and none rejects)


def replicas_for(batch: Batch, settings: AuditSettings) -> int:
    """Copies of each row per call: the settings' value, else as many as fit the buffer budget (≤ 64)."""
    if settings.replicas is not None:
        return settings.replicas
    per_copy = len(batch.rows) * (2 * batch.k + 1) * batch.vocab_size * 4  # float32 logits and draft laws
    return int(max(1, min(64, settings.samples, BUFFER_BYTES // per_copy)))


@dataclass
class Tallies:
    """What a run of the kernel leaves: counts and timings (filled by :func:`collect`)."""

    counts: np.ndarray  # (S, K+1, V) int64: tokens emitted per scenario row and position
    pit_cross: np.ndarray  # (S, S) Σ over calls and replicas r of z_{s,r} z_{s',r}, z = √12 (u − ½)
    pit_within: np.ndarray  # (S,) Σ of z_{s,2i} z_{s,2i+1}
    pairs_cross: int = 0  # terms in each pit_cross entry
    pairs_within: int = 0  # terms in each pit_within entry
    violations: dict = field(default_factory=dict)  # scenario row -> first contract violation seen
    kernel_seconds: float = 0.0
    harness_seconds: float = 0.0
    calls: int = 0
    rows_per_call: int = 0


@dataclass(frozen=True)
class Prepared:
    """A batch's inputs at the call's size, and what the harness needs to draw and score."""

    laws: tuple[RowLaw, ...]
    index: torch.Tensor  # (B,) scenario row of each batch row
    target_logits: torch.Tensor  # (B, K+1, V) float32 master copy
    draft_probs: torch.Tensor  # (B, K, V) float32 master copy
    q_flat: torch.Tensor  # (S*K, V) float64 draft laws the drafts are drawn from
    drafted: torch.Tensor  # (B, K) bool: positions with a draft
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    cdf0: np.ndarray  # (S, V+1) cumulative p_0 with a leading 0, for the PIT


def prepare(batch: Batch, replicas: int) -> Prepared:
    S, K, V = len(batch.rows), batch.k, batch.vocab_size
    index = torch.arange(S).repeat_interleave(replicas)
    laws = tuple(row_law(row) for row in batch.rows)
    q = torch.from_numpy(np.stack([kernel_draft_law(row) for row in batch.rows]))  # (S, K, V)
    p0 = np.stack([law.p[0] for law in laws])  # (S, V)
    drafted = torch.arange(K)[None] < batch.n_drafts[index][:, None]
    return Prepared(laws, index, batch.target_logits[index], q.float()[index], q.reshape(S * K, V), drafted,
                    batch.temperature[index], batch.top_k[index], batch.top_p[index],
                    np.concatenate([np.zeros((S, 1)), np.cumsum(p0, axis=1)], axis=1))


def draw_drafts(prep: Prepared, replicas: int, generator: torch.Generator) -> torch.Tensor:
    """(B, K) int64 drafts: replica r of row s draws x_j ~ q_{s,j} afresh; -1 beyond the row's drafts."""
    SK = prep.q_flat.shape[0]
    S = SK // prep.drafted.shape[1]
    u = torch.rand(SK, replicas, generator=generator, dtype=torch.float64)
    x = inverse_cdf(prep.q_flat, u).reshape(S, -1, replicas).permute(0, 2, 1).reshape(S * replicas, -1)
    return torch.where(prep.drafted, x, -1)


def pit(prep: Prepared, first: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Randomized PIT of each row's position-0 token under its scenario's p_0: (B,) in (0, 1)."""
    rows = prep.index.numpy()
    below, upto = prep.cdf0[rows, first], prep.cdf0[rows, first + 1]
    return below + rng.random(len(rows)) * (upto - below)


def collect(spec: KernelSpec, batch: Batch, settings: AuditSettings, progress=None) -> Tallies:
    """Call the kernel until every scenario row has ``settings.samples`` draws; stream the counts."""
    started = time.perf_counter()
    R = replicas_for(batch, settings)
    S, K, V = len(batch.rows), batch.k, batch.vocab_size
    prep = prepare(batch, R)
    kernel_gen, draft_gen = make_generator(settings.seed), make_generator(settings.seed + 1)
    rng = np.random.default_rng(settings.seed)
    tallies = Tallies(np.zeros((S, K + 1, V), dtype=np.int64), np.zeros((S, S)), np.zeros(S), rows_per_call=S * R)
    buffers = [t.clone() for t in (prep.target_logits, prep.draft_probs, prep.temperature, prep.top_k, prep.top_p)]
    masters = (prep.target_logits, prep.draft_probs, prep.temperature, prep.top_k, prep.top_p)
    calls = -(-settings.samples // R)
    kernel_seconds = 0.0
    for call in range(calls):
        for buffer, master in zip(buffers, masters):
            buffer.copy_(master)
        drafts = draw_drafts(prep, R, draft_gen)  # (B, K)
        t0 = time.perf_counter()
        logits, q, temperature, top_k, top_p = buffers
        try:
            tokens = spec(logits, q, drafts.clone(), temperature, top_k, top_p, kernel_gen)
        except Exception as exc:  # a kernel that crashes on the batch fails the audit; the report says how
            tallies.violations[-1] = f"the kernel raised {type(exc).__name__}: {str(exc)[:300]}"
            break
        finally:
            kernel_seconds += time.perf_counter() - t0
        tally_call(tallies, prep, tokens, drafts, R, V, rng)
        tallies.calls = call + 1
        if progress is not None:
            progress(1)
    tallies.kernel_seconds = kernel_seconds
    tallies.harness_seconds = time.perf_counter() - started - kernel_seconds
    return tallies


def tally_call(tallies: Tallies, prep: Prepared, tokens: torch.Tensor, drafts: torch.Tensor, R: int, V: int,
               rng: np.random.Generator) -> None:
    """Add one call's output to the tallies (counts, PIT products, contract violations)."""
    S, K1 = tallies.counts.shape[:2]
    for row, problem in contract_violations(tokens, drafts, V):
        s = int(prep.index[row]) if row >= 0 else -1
        tallies.violations.setdefault(s, problem)
    if tallies.violations.get(-1):
        return
    tokens = tokens.cpu()
    valid = tokens >= 0  # (B, K+1)
    valid &= tokens < V
    cell = (prep.index[:, None] * K1 + torch.arange(K1)[None]) * V + tokens.clamp(0, V - 1)  # (B, K+1)
    tallies.counts += torch.bincount(cell[valid], minlength=S * K1 * V).reshape(S, K1, V).numpy()
    first = tokens[:, 0].clamp(0, V - 1).numpy()
    z = (np.sqrt(12.0) * (pit(prep, first, rng) - 0.5)).reshape(S, R)  # (S, R)
    tallies.pit_cross += z @ z.T
    tallies.pairs_cross += R
    half = R // 2
    tallies.pit_within += (z[:, 0:2 * half:2] * z[:, 1:2 * half:2]).sum(axis=1)
    tallies.pairs_within += half
