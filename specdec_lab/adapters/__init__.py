"""Adapters that wrap implementations we did not write, so the same harness audits them.

Each adapter is a *sampler* in the sense of :func:`specdec_lab.collect.collect`: an object with
``describe() -> dict`` (recorded in the sample file's metadata) and
``draw(pair, prompt_ids, n, length, generator) -> SampleResult``, plus a ``sampling`` attribute
(the :class:`~specdec_lab.sampling.SamplingConfig` it asks the implementation for), which is the
target law p the audit scores it against unless told otherwise.

- :mod:`~specdec_lab.adapters.hf` — Hugging Face ``model.generate`` (assisted generation with a
  draft model, prompt-lookup decoding, plain sampling), batch 1 as upstream requires.
- :mod:`~specdec_lab.adapters.endpoint` — any OpenAI-compatible ``/v1/completions`` server.
- :mod:`~specdec_lab.adapters.llamacpp` — a real llama.cpp server on loopback serving the bundled target
  (``llama-cpp-python[server]``, or llama.cpp's own ``llama-server`` with the draft model), for the tests, CI and
  notebooks; :mod:`~specdec_lab.adapters.llamacpp_build` converts to GGUF and builds llama.cpp;
  :mod:`~specdec_lab.adapters.llamacpp_speculative` runs its ``llama-speculative`` example as a sampler.
- :mod:`~specdec_lab.adapters.vllm` (offline; :mod:`~specdec_lab.adapters.vllm_serve`: ``vllm serve``),
  :mod:`~specdec_lab.adapters.openvino`, :mod:`~specdec_lab.adapters.ortgenai` — engines in environments of their
  own, driven through worker processes (:class:`specdec_lab.adapters.worker.Engine`;
  the worker scripts share :mod:`~specdec_lab.adapters.worker_loop`, standard library only).
- shared: :mod:`~specdec_lab.adapters.seeds` (distinct request seeds), :mod:`~specdec_lab.adapters.loopback`
  (servers we start on loopback).

:func:`specdec_lab.audit.audit` runs collect → score → suite → table over any of them.
"""

from specdec_lab.adapters.endpoint import (LLAMA_CPP_NEUTRAL, LLAMA_SERVER_NEUTRAL, EndpointClient,  # noqa: F401
                                           EndpointConfig)
from specdec_lab.adapters.hf import HFGenerateConfig  # noqa: F401
