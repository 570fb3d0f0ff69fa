"""Plain autoregressive sampling from the target p: the law every other sampler must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import SamplingConfig, sample, to_probs
from specdec_lab.samplers.decoder import Decoder
from specdec_lab.samplers.protocol import CHUNK, SampleResult, check_request, in_chunks


@dataclass(frozen=True)
class NaiveConfig:
    sampling: SamplingConfig = SamplingConfig()

    def describe(self) -> dict:
        return {"sampler": "naive", **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_naive(pair, prompt, n, length, self, generator)


def sample_naive(pair, prompt: torch.Tensor, n: int, length: int, config: NaiveConfig,
                 generator: torch.Generator, return_probs: bool = False, chunk: int = CHUNK) -> SampleResult:
    """Draw ``n`` independent continuations of ``length`` tokens from p after ``prompt`` (P,).

    One batched forward per new token over up to ``chunk`` chains at a time, with a KV cache shared
    from one prefill of the prompt.
    """
    check_request(prompt, n, length)
    return in_chunks(lambda size: _naive_batch(pair, prompt, size, length, config, generator, return_probs),
                     n, chunk)


def _naive_batch(pair, prompt, n, length, config, generator, return_probs) -> SampleResult:
    decoder = Decoder(pair.target, pair.vocab_size, n, pair.device)
    decoder.prefill(prompt[:-1], room=length)
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
