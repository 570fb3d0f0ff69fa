"""Request seeds for engines: distinct, drawn from the collection's generator, optionally on a lattice.

An engine seeds each request's own random stream from the seed the request carries, so two requests with one seed
return one sample twice. Every adapter therefore draws its seeds here: ``count`` distinct values in [0, high), the
bound being what the engine keeps of a seed (OpenVINO: 32 bits, ONNX Runtime GenAI: 31, llama.cpp: uint32 without
0xFFFFFFFF, vLLM: 63). ``step`` > 1 puts them on a lattice of multiples of ``step``: vLLM seeds completion i of a
request with seed s as s + i, so requests of n completions need seeds whose blocks [s, s + n) never overlap.
"""

from __future__ import annotations

import torch


def distinct_seeds(generator: torch.Generator, count: int, high: int, step: int = 1) -> list[int]:
    """``count`` distinct request seeds drawn from ``generator``: multiples of ``step`` below ``high``.

    >>> len(set(distinct_seeds(torch.Generator().manual_seed(0), 1000, 2**32)))
    1000
    >>> seeds = distinct_seeds(torch.Generator().manual_seed(0), 5, 2**63 - 1, step=4)
    >>> all(s % 4 == 0 for s in seeds), len(set(seeds))
    (True, 5)
    """
    seeds: list[int] = []
    slots = min(high // step, 2**62)
    while len(seeds) < count:
        draw = torch.randint(0, slots, (count,), generator=generator, device=generator.device).tolist()
        seeds = list(dict.fromkeys(seeds + [u * step for u in draw]))[:count]
    return seeds
