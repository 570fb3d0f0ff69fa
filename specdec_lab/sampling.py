"""The one function that turns logits into a sampling distribution.

Every sampler calls :func:`to_probs` for the target (p) and the draft (q) alike, so the q in
an acceptance ratio is always the law the draft was actually sampled from (see ANCHORS: vLLM
#9834, HF #47932 shipped bugs where the two sides used different filters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution.

    temperature: 0 means greedy (a point mass on the argmax); 1.0 is the model's own law.
    top_k: keep the k most likely tokens (None keeps all).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 keeps all).
    dtype: precision of the probabilities; fp64 so exact-law checks reach ~1e-12.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {self.dtype!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def describe(self) -> dict:
        """Plain-data form for metadata and reports."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "dtype": str(self.dtype).removeprefix("torch.")}


def to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Logits (..., V) -> probabilities (..., V) in ``config.dtype``, rows summing to 1.

    Order of operations (the same as HF transformers and vLLM): temperature, then top-k, then
    top-p on the tempered law. Temperature 0 returns the one-hot argmax (lowest index on ties).

    >>> p = to_probs(torch.tensor([2.0, 1.0, 0.0]), SamplingConfig(top_k=2))
    >>> [round(x, 4) for x in p.tolist()]
    [0.7311, 0.2689, 0.0]
    >>> to_probs(torch.tensor([0.0, 3.0, 1.0]), SamplingConfig(temperature=0)).tolist()
    [0.0, 1.0, 0.0]
    """
    logits = logits.to(config.dtype)
    V = logits.shape[-1]
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), V).to(config.dtype)
    if config.temperature != 1.0:  # (x / 1 == x exactly: skipping it changes nothing but the time)
        logits = logits / config.temperature
    if config.top_k is not None and config.top_k < V:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        probs = _nucleus(probs, config.top_p)
    return probs


# top-p looks for each row's nucleus among its NUCLEUS_PROBE most likely tokens first (torch.topk) and sorts the whole
# row only where the nucleus may be wider: on the bundled pair at top-p 0.9, T = 1, the nucleus holds 24 tokens at
# the median, 60 at the 90th percentile and more than 64 in 4.6% of rows; topk(64) costs a third of a full sort of 512
NUCLEUS_PROBE = 64


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely prefix whose mass reaches top_p, and every token tied with its least
    likely member; renormalise. A token is kept when the mass of the tokens sorted before it is below top_p
    (so the top token always survives); ties at the boundary are all kept, as :func:`to_probs`' top-k keeps
    every token tied with the k-th, so the set never depends on how a sort orders equal values.

    >>> p = torch.tensor([0.4, 0.2, 0.2, 0.2], dtype=torch.float64)
    >>> _nucleus(p, 0.5).tolist()  # 0.4 + 0.2 reaches 0.5; both tokens tied with the second stay
    [0.4, 0.2, 0.2, 0.2]
    >>> _nucleus(p, 0.3).tolist()
    [1.0, 0.0, 0.0, 0.0]
    """
    flat = probs.reshape(-1, probs.shape[-1])  # (R, V)
    kept = flat * (flat >= _nucleus_floor(flat, top_p))  # (R, V)
    return (kept / kept.sum(dim=-1, keepdim=True)).reshape(probs.shape)


def _nucleus_floor(flat: torch.Tensor, top_p: float, probe: int = NUCLEUS_PROBE) -> torch.Tensor:
    """The least probability in each row's nucleus (R, 1), from flat (R, V): the row's ``probe`` most likely
    tokens, and a full sort of the rows whose every probed token is kept (their nucleus may reach past it)."""
    probe = min(probe, flat.shape[-1])
    top = torch.topk(flat, probe, dim=-1).values  # (R, probe), descending
    before = torch.cumsum(top, dim=-1) - top  # mass of the more likely probed tokens
    count = (before < top_p).sum(dim=-1, keepdim=True)  # (R, 1) probed tokens kept, >= 1
    floor = top.gather(-1, count - 1)  # (R, 1)
    if probe < flat.shape[-1]:
        wide = (count.squeeze(1) == probe).nonzero().squeeze(1)  # (W,)
        if len(wide):
            floor[wide] = _nucleus_floor(flat[wide], top_p, flat.shape[-1])
    return floor


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` seeded with ``seed``: the only randomness samplers use."""
    return torch.Generator(device=device).manual_seed(int(seed))


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row from probs (..., V) -> (...) int64, using ``generator`` only.

    Inverse-CDF sampling (:func:`inverse_cdf`) with one u ~ U(0, 1) per row from ``generator``.
    """
    flat = probs.reshape(-1, probs.shape[-1])  # (R, V)
    u = torch.rand(flat.shape[0], 1, generator=generator, dtype=flat.dtype, device=flat.device)
    return inverse_cdf(flat, u).reshape(probs.shape[:-1])


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens (R, n) int64 at uniforms u (R, n) in [0, 1) for laws probs (R, V): the first token whose
    cumulative mass exceeds u·total.

    Tokens of probability 0 can never be drawn (their cumulative mass equals their predecessor's,
    and the index is capped at the last token of positive probability).

    >>> inverse_cdf(torch.tensor([[0.25, 0.0, 0.75]]), torch.tensor([[0.1, 0.3, 0.99]])).tolist()
    [[0, 2, 2]]
    """
    cdf = torch.cumsum(probs, dim=-1)  # (R, V)
    draws = torch.searchsorted(cdf, u.to(cdf.dtype) * cdf[:, -1:], right=True)  # (R, n)
    V = probs.shape[-1]
    last_positive = V - 1 - torch.flip(probs > 0, dims=[-1]).long().argmax(dim=-1)  # (R,)
    return torch.minimum(draws, last_positive[:, None])


# ------------------------------------------------------------ the full sampler chain: penalties and min-p
#
# Engines apply the same steps in different orders (each read from the engine's source at the pinned version):
ORDERS = {
    # transformers 5.24 GenerationMixin._get_logits_processor: repetition penalty among the processors, then the
    # warpers temperature, top-k, top-p, min-p ("applied after temperature scaling")
    "hf": ("penalties", "temperature", "top_k", "top_p", "min_p"),
    # vLLM 0.32 v1 Sampler.forward: penalties, temperature, the argmax-invariant processors (min-p), then top-k/top-p
    "vllm": ("penalties", "temperature", "min_p", "top_k", "top_p"),
    # llama.cpp common_params_sampling.samplers (default chain): penalties, (DRY, top-n-σ), top-k, (typical), top-p,
    # min-p, (XTC), temperature: top-p and min-p see the *untempered* law
    "llama.cpp": ("penalties", "top_k", "top_p", "min_p", "temperature"),
    # mlx-lm 0.32.2 sample_utils.make_sampler: the logits processors (penalties), then top-p, min-p, top-k on the
    # untempered log-probabilities, then categorical_sampling(logprobs * (1 / temp))
    "mlx-lm": ("penalties", "top_p", "min_p", "top_k", "temperature"),
}
# Which tokens each penalty counts: "context" = prompt and output (within the last ``penalty_last_n`` tokens where
# the engine has a window), "output" = generated tokens only.
PENALTY_SCOPES = {
    "hf": {"repetition": "context", "presence": "output", "frequency": "output"},  # HF has no presence/frequency
    "vllm": {"repetition": "context", "presence": "output", "frequency": "output"},
    "llama.cpp": {"repetition": "context", "presence": "context", "frequency": "context"},  # the last 64 tokens
    "mlx-lm": {"repetition": "context", "presence": "context", "frequency": "context"},  # the last 20 (context_size)
}
WINDOWED = ("llama.cpp", "mlx-lm")  # orders whose penalties count only the last ``penalty_last_n`` tokens


@dataclass(frozen=True)
class ChainConfig:
    """The whole per-request sampler chain: :class:`SamplingConfig` plus min-p and the three penalties, applied in
    an engine's order (:data:`ORDERS`).

    min_p: keep tokens whose probability is at least min_p × the top token's (0 keeps all).
    presence_penalty: subtracted from the logit of every token already present (OpenAI's definition).
    frequency_penalty: subtracted once per occurrence.
    repetition_penalty: a present token's logit is divided by it when positive, multiplied when not (CTRL, HF).
    order: a key of :data:`ORDERS`; which tokens each penalty counts is :data:`PENALTY_SCOPES`' entry.
    penalty_last_n: llama.cpp and mlx-lm count only the last n tokens of prompt + output (llama.cpp's
        ``repeat_last_n``, default 64; mlx-lm's ``repetition_context_size``, default 20); ignored by the other orders.
    """

    sampling: SamplingConfig = SamplingConfig()
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    order: str = "hf"
    penalty_last_n: int = 64

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}; valid: {', '.join(ORDERS)}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must lie in [0, 1), got {self.min_p!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.penalty_last_n < 0:
            raise ValueError(f"penalty_last_n must be >= 0, got {self.penalty_last_n!r}")

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def describe(self) -> dict:
        return {**self.sampling.describe(), "min_p": self.min_p, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty, "repetition_penalty": self.repetition_penalty,
                "order": self.order, "penalty_last_n": self.penalty_last_n}

    def counts(self, prompt: list[int], output: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(context counts, output counts) (V,) each, as this order's penalties see them.

        >>> c, o = ChainConfig(order="llama.cpp", penalty_last_n=2).counts([1, 2, 2], [3], 4)
        >>> c.tolist(), o.tolist()
        ([0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0])
        >>> ChainConfig(order="llama.cpp", penalty_last_n=64).counts([1, 2, 2], [3], 4)[0].tolist()  # all of 4 < 64
        [0.0, 1.0, 2.0, 1.0]
        """
        context = prompt + output
        if self.order in WINDOWED:  # the window holds the last n tokens, or all of them when fewer
            context = context[max(0, len(context) - self.penalty_last_n):] if self.penalty_last_n else []
        def count(ids):
            return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size).to(self.sampling.dtype)
        return count(context), count(output)


def apply_penalties(logits: torch.Tensor, context_counts: torch.Tensor, output_counts: torch.Tensor,
                    config: ChainConfig) -> torch.Tensor:
    """Penalised logits (..., V) from the token counts (..., V) the order's penalties see (:meth:`ChainConfig.counts`).

    The repetition penalty first (a present token's logit / r when positive, × r otherwise), then
    logit −= frequency · count + presence · [count > 0] (llama.cpp's ``llama_sampler_penalties_apply``, vLLM's
    ``apply_penalties``; which counts each penalty reads is :data:`PENALTY_SCOPES`).

    >>> cfg = ChainConfig(repetition_penalty=2.0, presence_penalty=0.5)
    >>> apply_penalties(torch.tensor([2.0, -2.0, 1.0]), torch.tensor([1.0, 1.0, 0.0]),
    ...                 torch.tensor([1.0, 0.0, 0.0]), cfg).tolist()
    [0.5, -4.0, 1.0]
    """
    if not config.penalised:
        return logits
    scope = PENALTY_SCOPES[config.order]
    counts = {"context": context_counts.to(logits.dtype), "output": output_counts.to(logits.dtype)}
    if config.repetition_penalty != 1.0:
        seen = counts[scope["repetition"]] > 0
        r = config.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - config.frequency_penalty * counts[scope["frequency"]]
    return logits - config.presence_penalty * (counts[scope["presence"]] > 0).to(logits.dtype)


def _top_k_logits(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Logits outside the k largest set to −inf (ties at the k-th value kept)."""
    if k is None or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside the nucleus of the law softmax(logits) set to −inf (:func:`_nucleus`)."""
    if top_p >= 1.0:
        return logits
    keep = _nucleus(torch.softmax(logits, dim=-1), top_p) > 0
    return logits.masked_fill(~keep, float("-inf"))


def _min_p_logits(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Logits of tokens with probability below min_p × the top probability set to −inf (llama.cpp compares
    logits with max + log(min_p), HF and vLLM probabilities with min_p · max: the same set)."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))


def chain_probs(logits: torch.Tensor, config: ChainConfig, context_counts: torch.Tensor | None = None,
                output_counts: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (..., V) → the law (..., V) of the engine's whole sampler chain (:data:`ORDERS`).

    ``context_counts`` / ``output_counts`` (..., V): token counts the penalties see (:meth:`ChainConfig.counts`;
    broadcast against the logits); needed only when the config has a penalty. Temperature 0 is the argmax of the
    penalised logits (no filter removes the top token). Without min-p and penalties, ``order="hf"`` and
    ``order="vllm"`` equal :func:`to_probs`.

    >>> cfg = ChainConfig(SamplingConfig(temperature=2.0, top_p=0.6), order="llama.cpp")
    >>> [round(x, 4) for x in chain_probs(torch.tensor([2.0, 1.0, 0.0]), cfg).tolist()]  # top-p on the T=1 law
    [1.0, 0.0, 0.0]
    >>> hf = ChainConfig(cfg.sampling, order="hf")  # top-p on the tempered law
    >>> [round(x, 4) for x in chain_probs(torch.tensor([2.0, 1.0, 0.0]), hf).tolist()]
    [0.6225, 0.3775, 0.0]
    """
    s = config.sampling
    logits = logits.to(s.dtype)
    V = logits.shape[-1]
    if config.penalised:
        if context_counts is None or output_counts is None:
            raise ValueError("a penalised chain needs context_counts and output_counts")
        logits = apply_penalties(logits, context_counts, output_counts, config)
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), V).to(s.dtype)
    for step in ORDERS[config.order][1:]:
        if step == "temperature" and s.temperature != 1.0:
            logits = logits / s.temperature
        elif step == "top_k":
            logits = _top_k_logits(logits, s.top_k)
        elif step == "top_p":
            logits = _top_p_logits(logits, s.top_p)
        elif step == "min_p":
            logits = _min_p_logits(logits, config.min_p)
    return torch.softmax(logits, dim=-1)
