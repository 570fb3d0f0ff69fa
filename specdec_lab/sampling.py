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


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely prefix whose mass reaches top_p; renormalise."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)  # (..., V)
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of strictly more likely tokens
    keep_sorted = mass_before < top_p  # the top token always survives
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


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
