"""Notebook 08, serving configs: memory fit per accelerator, the vLLM / TensorRT-LLM settings of each method."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pandas as pd

from specdec_lab import serving
from specdec_lab.experiments.scale import setup  # noqa: F401 (for the notebook)


def memory_fit_table(config, hardware_names, tensor_parallel_sizes) -> pd.DataFrame:
    """Does ``config`` fit, per GPU, on each accelerator at each tensor parallel size?"""
    rows = []
    for hw in hardware_names:
        for tp in tensor_parallel_sizes:
            variant = replace(config, tensor_parallel=int(tp),
                              draft_tensor_parallel=None if config.draft_tensor_parallel is None else 1)
            fit = serving.check_memory(variant, hw)
            rows.append({"hardware": hw, "TP": int(tp), "fits": fit.fits, "needed GB/GPU": fit.needed / 1e9,
                         "allowed GB/GPU": fit.allowed / 1e9, "sequences of max length": fit.max_sequences})
    return pd.DataFrame(rows)


def method_commands(target: str, drafts: dict, k: int = 5, tensor_parallel: int = 4) -> pd.DataFrame:
    """The current vLLM command and the TensorRT-LLM decoding type for each speculation method."""
    rows = []
    for method, draft in drafts.items():
        config = serving.ServingConfig(target, method=method, draft=draft, k=k, tensor_parallel=tensor_parallel)
        rows.append({"method": method, "what": serving.METHODS[method].what,
                     "TensorRT-LLM decoding_type": serving.trtllm_settings(config)["speculative_config"]["decoding_type"],
                     "vLLM --speculative-config": json.dumps(serving.vllm_speculative_config(config))})
    return pd.DataFrame(rows)


def legacy_command(config) -> tuple[str, list[str]]:
    """:func:`serving.vllm_legacy_command` and the warnings it raised (their messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        command = serving.vllm_legacy_command(config)
    return command, [str(w.message) for w in caught]
