"""Plain autoregressive sampling from the target p: the law every other sampler must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import SamplingConfig, sample, to_probs
from specdec_lab.samplers.decoder import Decoder


@dataclass(frozen=True)
class NaiveConfig:
    sampling: SamplingConfig = SamplingConfig()

    def describe(self) -> dict:
        return {"sampler": "naive", **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> "SampleResult":
        return sample_naive(pair, prompt, n, length, self, generator)


@dataclass
class SampleResult:
    """Samples of one sampler: tokens (N, L) and, where asked, the per-step laws (N, L, V)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    stats: dict | None = None


def sample_naive(pair, prompt: torch.Tensor, n: int, length: int, config: NaiveConfig,
                 generator: torch.Generator, return_probs: bool = False) -> SampleResult:
    """Draw ``n`` independent continuations of ``length`` tokens from p after ``prompt`` (P,).

    One batched forward per new token over all n chains, with a KV cache shared from one prefill.
    """
    if prompt.ndim != 1 or prompt.numel() < 1:
        raise ValueError("prompt must be a non-empty 1-D tensor of token ids")
    if n < 1 or length < 1:
        raise ValueError(f"need n >= 1 chains and length >= 1 tokens, got n={n}, length={length}")
    decoder = Decoder(pair.target, pair.vocab_size, n, pair.device)
    decoder.prefill(prompt[:-1])
    last = prompt[-1:].to(pair.device).expand(n).clone()  # (N,)
    tokens = torch.empty(n, length, dtype=torch.long, device=pair.device)
    laws = []
    for t in range(length):
        p = to_probs(decoder.feed(last[:, None])[:, -1], config.sampling)  # (N, V)
        last = sample(p, generator)
        tokens[:, t] = last
        if return_probs:
            laws.append(p)
    probs = torch.stack(laws, dim=1) if return_probs else None  # (N, L, V)
    return SampleResult(tokens.cpu(), None if probs is None else probs.cpu(),
                        {"target_passes": decoder.passes})
