"""mlx-lm's speculative decoding, audited on the real engine (``mlx-lm`` on MLX's CPU backend, own environment).

mlx-lm pulls its own transformers, so the engine lives in its own environment (``make mlx``: ``.venv-mlx``, or the
per-machine cache ``~/.cache/specdec-lab/venv-mlx-<hash of requirements-mlx.txt>`` that ``.ci/run`` builds) and the
main environment never imports it. A worker process of that environment (:mod:`specdec_lab.adapters.mlx_worker`,
run by file path) loads the bundled folders as they are (``mlx_lm.load``: safetensors, fp32, no conversion) and
answers with token ids and mlx-lm's own per-token flag ``from_draft``. :func:`greedy_identity` checks MLX's greedy
tokens against our target's, token for token, before anything is sampled.

Methods: ``none`` (``generate_step``: mlx-lm's plain sampler, the reference) and ``draft_model``
(``speculative_generate_step`` with the bundled draft, ``num_draft_tokens`` = k). Requests run one at a time: mlx-lm
batches requests (``BatchGenerator``) only without a draft model. Seeds: ``mx.random.seed(seed)`` before each
request, seeds distinct in [0, 2³²).

How mlx-lm verifies (``mlx_lm/generate.py``, ``speculative_generate_step``): the draft samples ``num_draft``
tokens with the request's own sampler, the target scores them in one pass and samples its own token at each
position; a draft token is kept while it *equals* the target's sample (``if tn != dtn: break``), and the first
mismatch emits the target's sample. The emitted token is therefore always the target's own draw given the accepted
prefix: lossless, with acceptance Σ p·q instead of Σ min(p, q).

Where drafts are attributed (:func:`positions_from_flags`): mlx-lm drafts from the prompt; a round proposes
``min(tokens still to emit, k)`` tokens; each accepted draft is yielded with ``from_draft`` True, then one target
token with ``from_draft`` False: a correction when the round's drafts ran out early (its position was drafted), a
bonus when all were accepted (not drafted). The flags and k place every draft exactly, at any L: with k ≥ 2 tokens 1
and 2 are drafted in every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from tqdm.auto import tqdm

from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.adapters.worker import (REPO, Engine, EngineError, add_counts, check_lengths, engine_python,
                                         greedy_check as compare_greedy, greedy_identity as compare_identity,
                                         sampling_job)
from specdec_lab.drafting import add_positions
from specdec_lab.models import BUNDLED_DIR
from specdec_lab.sampling import ChainConfig, SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request

VERSION = "0.32.2"  # mlx-lm, pinned in requirements-mlx.txt (with mlx[cpu] 0.32.4)
REQUIREMENTS = REPO / "requirements-mlx.txt"
ENV_PYTHON = "SPECDEC_LAB_MLX_PYTHON"  # another environment's python
SEED_HIGH = 2**32
REPETITION_CONTEXT = 20  # make_logits_processors' repetition_context_size default
METHODS = {
    "none": "no speculation: mlx-lm's generate_step (the reference)",
    "draft_model": "the bundled draft model (speculative_generate_step, num_draft_tokens = k)",
}


class MlxError(EngineError):
    """mlx-lm refused a setting, crashed, or answered something the audit cannot use."""


# its interpreter as OpenVINO's (specdec_lab.adapters.worker.engine_python), with $SPECDEC_LAB_MLX_PYTHON
ENGINE = Engine("mlx-lm", "mlx_worker.py", MlxError, "mlx_lm_version",
                partial(engine_python, ENV_PYTHON, "mlx", REQUIREMENTS, REPO))
mlx_python, worker, close_workers = ENGINE.python, ENGINE.worker, ENGINE.close_workers


def engine_settings(method: str, k: int = 4) -> dict:
    """The worker's engine JSON for one method on the bundled pair (the folders as they are)."""
    if method not in METHODS:
        raise ValueError(f"unknown mlx-lm method {method!r}; valid: {', '.join(METHODS)}")
    if k < 1:
        raise ValueError(f"k (num_draft_tokens) must be >= 1, got {k!r}")
    return {"target": str(BUNDLED_DIR / "target"), "draft": str(BUNDLED_DIR / "draft"), "method": method, "k": k}


def positions_from_flags(flags: list[bool], k: int) -> tuple[list[int], list[int]]:
    """(drafted, accepted) 0/1 per position of one request from mlx-lm's ``from_draft`` flags (module docstring).

    A round starting after ``s`` emitted tokens proposes ``min(L - s, k)`` drafts; its accepted drafts come flagged,
    then (unless the request is done) one unflagged target token, drafted exactly when the round accepted fewer than
    it proposed.

    >>> positions_from_flags([True, False, False], 4)  # token 2 corrects a rejected draft, token 3 too
    ([1, 1, 1], [1, 0, 0])
    >>> positions_from_flags([True, True, False, False], 2)  # token 3 is round 1's bonus; round 2 drafts token 4
    ([1, 1, 0, 1], [1, 1, 0, 0])
    >>> positions_from_flags([False, True], 1)  # k = 1: token 1 rejected, round 2 drafts token 2, accepted
    ([1, 1], [0, 1])
    """
    L, drafted, accepted, s = len(flags), [], [], 0
    while s < L:
        proposed = min(L - s, k)
        n = 0
        while s + n < L and flags[s + n]:
            n += 1
        if n > proposed:
            raise MlxError(f"mlx-lm flagged {n} draft tokens in a round of {proposed}: {flags}")
        drafted += [1] * n
        accepted += [1] * n
        s += n
        if s < L:  # the round's unflagged target token
            drafted.append(int(n < proposed))
            accepted.append(0)
            s += 1
    return drafted, accepted


@dataclass(frozen=True)
class MlxConfig:
    """Settings of one mlx-lm audit (the bundled pair in a worker of its environment).

    method: one of :data:`METHODS`; k: ``num_draft_tokens``; sampling: temperature / top-k / top-p asked of
    ``make_sampler`` (and, by default, the law scored); min_p: ``make_sampler``'s min-p (0: off);
    repetition_penalty: ``make_logits_processors``' penalty (1: off) over the last ``repetition_context`` tokens;
    job_size: requests per worker job.
    """

    method: str = "none"
    sampling: SamplingConfig = SamplingConfig()
    k: int = 4
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int = REPETITION_CONTEXT
    job_size: int = 500
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown mlx-lm method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.k < 1 or self.job_size < 1:
            raise ValueError(f"k and job_size must be >= 1, got {self.k!r}, {self.job_size!r}")
        self.chain  # validates min_p and the penalty

    @property
    def chain(self) -> ChainConfig:
        """The whole sampler chain in mlx-lm's order (:data:`specdec_lab.sampling.ORDERS`): what a row with min-p or
        a penalty is scored against."""
        return ChainConfig(self.sampling, min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                           order="mlx-lm", penalty_last_n=self.repetition_context)

    @property
    def chained(self) -> bool:
        """Whether the law needs more than :class:`SamplingConfig` (min-p, a penalty)."""
        return self.min_p > 0 or self.repetition_penalty != 1.0

    @property
    def engine(self) -> dict:
        return engine_settings(self.method, self.k)

    def describe(self) -> dict:
        described = {"sampler": "mlx_lm", "mlx_lm_version": VERSION, "method": self.method, **self.sampling.describe()}
        if self.method != "none":
            described["k"] = self.k
        extra = {}
        if self.min_p > 0:
            extra["min_p"] = self.min_p
        if self.repetition_penalty != 1.0:
            extra.update(repetition_penalty=self.repetition_penalty, repetition_context_size=self.repetition_context)
        if extra:
            described["extra"] = extra
        return described

    def job(self, prompt: torch.Tensor, seeds: list[int], length: int) -> dict:
        job = sampling_job(prompt, seeds, length, self.sampling)
        job.update(min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                   repetition_context_size=self.repetition_context)
        return job

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample(prompt, n, length, self, generator)


def sample(prompt: torch.Tensor, n: int, length: int, config: MlxConfig, generator: torch.Generator) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens (jobs of ≤ ``config.job_size`` requests).

    Stats: ``engine_seconds``; with a draft, ``drafted@t`` / ``accepted@t`` for every position
    (:func:`positions_from_flags`), ``accepted_tokens`` and ``target_passes`` (one target pass per round).
    """
    check_request(prompt, n, length)
    engine = worker(config.engine)
    seeds = distinct_seeds(generator, n, SEED_HIGH)
    rows, totals = [], {"engine_seconds": 0.0}
    bar = tqdm(total=n, desc=f"mlx-lm {config.method}", unit="samples", leave=False, disable=not config.progress)
    for start in range(0, n, config.job_size):
        reply = engine.ask(config.job(prompt, seeds[start:start + config.job_size], length), timeout=3600)
        check_lengths(reply["tokens"], length, ENGINE)
        rows += reply["tokens"]
        totals["engine_seconds"] += reply["engine_seconds"]
        if config.method != "none":
            for flags in reply["from_draft"]:
                drafted, accepted = positions_from_flags(flags, config.k)
                add_positions(totals, drafted, accepted)
                # a target token ends every round but a fully accepted last one
                rounds = len(flags) - sum(accepted) + int(flags[-1])
                add_counts(totals, {"accepted_tokens": sum(accepted), "target_passes": rounds})
        bar.update(len(reply["tokens"]))
    bar.close()
    totals["emitted_tokens"] = n * length
    return SampleResult(torch.tensor(rows, dtype=torch.long), None, totals)


def exact_acceptance(pair, prompt: torch.Tensor, sampling: SamplingConfig) -> tuple[float, float]:
    """The acceptance mlx-lm's equality rule must show at tokens 1 and 2 (k ≥ 2, L = 2), from the exact laws of the
    local pair: a draft x ~ q is kept iff the target's own draw y ~ p equals it, so token 1's acceptance is
    Σ_x p(x)q(x), and token 2's (drafted in every request, after a token 1 whose law is p either way) is
    E_{x1 ~ p} Σ_x p(x | x1) q(x | x1). Speculative sampling would accept Σ_x min(p(x), q(x))."""
    from dataclasses import replace

    from specdec_lab.laws.target import two_token_logits
    from specdec_lab.sampling import to_probs

    p = to_probs(two_token_logits(pair, prompt)[0], sampling)  # (V, 2, V): row x1; after the prompt, after x1
    q = to_probs(two_token_logits(replace(pair, target=pair.draft), prompt)[0], sampling)  # the draft's
    first = p[0, 0]  # (V,)
    return float((first * q[0, 0]).sum()), float((first * (p[:, 1] * q[:, 1]).sum(-1)).sum())


def greedy_tokens(method: str, prompt: torch.Tensor, length: int, k: int = 4) -> list[int]:
    """mlx-lm's greedy (T = 0) continuation of ``prompt`` ((P,) ids) with ``method``: ``length`` ids."""
    job = MlxConfig(method=method, sampling=SamplingConfig(temperature=0.0), k=k).job(prompt, [0], length)
    return worker(engine_settings(method, k)).ask(job)["tokens"][0]


def greedy_check(method: str, prompt: torch.Tensor, length: int, k: int = 4) -> dict:
    """Greedy tokens of ``method`` against mlx-lm's own non-speculative greedy tokens
    (:func:`specdec_lab.adapters.worker.greedy_check`)."""
    return compare_greedy(lambda m: greedy_tokens(m, prompt, length, k), method)


def greedy_identity(pair, prompts: list[str], length: int = 32) -> list[dict]:
    """MLX's greedy tokens of the bundled target (no speculation) against our target's argmax decode, token for
    token, one row per prompt: the check that mlx-lm's Llama is our target."""
    return compare_identity(pair, prompts, length, lambda ids, n: greedy_tokens("none", ids, n))
