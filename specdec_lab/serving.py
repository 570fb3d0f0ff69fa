"""Serving configurations for speculative decoding: vLLM and TensorRT-LLM, with a memory-fit check.

One :class:`ServingConfig` (target, method and draft, K, tensor parallel sizes, memory utilization,
maximum length) gives

- :func:`vllm_command`: ``vllm serve`` with the ``--speculative-config`` JSON (current vLLM);
- :func:`vllm_legacy_command`: the same with the pre-2025 flags (``--speculative-model``,
  ``--num-speculative-tokens``, ...), which vLLM removed in 2025 — for old installations only;
- :func:`trtllm_settings` / :func:`trtllm_yaml` / :func:`trtllm_command`: the TensorRT-LLM
  ``speculative_config`` YAML and the ``trtllm-serve`` line;
- :func:`check_memory`: does it fit, per GPU? Weights shard + draft + KV cache at the maximum length.

The seed article's deployment — Llama-3.3-70B with Llama-3.2-1B as draft, K = 5, TP 4, draft TP 1,
8192 tokens — on four 80 GB H100s at utilization 0.9:

>>> seed = ServingConfig("meta-llama/Llama-3.3-70B-Instruct", draft="meta-llama/Llama-3.2-1B-Instruct",
...                      k=5, tensor_parallel=4, draft_tensor_parallel=1, gpu_memory_utilization=0.9,
...                      max_model_len=8192)
>>> print(vllm_command(seed))
vllm serve meta-llama/Llama-3.3-70B-Instruct --tensor-parallel-size 4 --gpu-memory-utilization 0.9 --max-model-len 8192 --speculative-config '{"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5, "draft_tensor_parallel_size": 1}'
>>> fit = check_memory(seed, "h100-sxm5")
>>> print(fit.sentence)
fits: per GPU 35.28 GB target weights (141.11 GB / TP 4) + 2.47 GB draft (TP 1) + 0.94 GB KV cache (1 sequence × 8,192 tokens) = 38.69 GB of the 72.00 GB allowed (0.9 × 80 GB); 33.31 GB spare, room for 36 sequences of 8,192 tokens.
>>> from dataclasses import replace
>>> print(check_memory(replace(seed, tensor_parallel=2), "h100-sxm5").sentence)
DOES NOT FIT: per GPU 70.55 GB target weights (141.11 GB / TP 2) + 2.47 GB draft (TP 1) + 1.61 GB KV cache (1 sequence × 8,192 tokens) = 74.64 GB > 72.00 GB allowed (0.9 × 80 GB), short by 2.64 GB; the weights alone exceed it: raise the tensor parallel size, quantize, or use larger GPUs.

What was checked, and against what (December 2026):

- vLLM ``--speculative-config`` keys (``method``, ``model``, ``num_speculative_tokens``,
  ``draft_tensor_parallel_size`` — "must be 1 or equal to the target model's tensor parallel size" —,
  ``prompt_lookup_max``, ``prompt_lookup_min``) and method names (``draft_model``, ``eagle``,
  ``eagle3``, ``medusa``, ``ngram``): vLLM's docs/features/speculative_decoding/configuration.md and
  draft_model.md, eagle.md, n_gram.md. The JSON form arrived in vllm-project/vllm#14434 (March
  2025); #15466 removed the old flags.
- TensorRT-LLM: ``trtllm-serve MODEL --tp_size --max_seq_len --kv_cache_free_gpu_memory_fraction
  --config file.yaml`` (``--config`` is the newer name of ``--extra_llm_api_options``); the YAML's
  ``speculative_config`` with ``decoding_type`` (``DraftTarget``, ``Eagle3``, ``NGram``, ``Medusa``),
  ``max_draft_len``, ``speculative_model``, ``max_matching_ngram_size``, ``num_medusa_heads``:
  TensorRT-LLM's docs/source/features/speculative-decoding.md and llmapi/llm_args.py.
  ``MedusaDecodingConfig.supports_backend`` excludes the PyTorch back end, so Medusa gets
  ``--backend tensorrt``; ``decoding_type: Eagle`` is an alias of Eagle3 that refuses EAGLE-1/2
  checkpoints on the PyTorch back end. These names were read from source, not run.
"""

from __future__ import annotations

import json
import math
import shlex
import warnings
from dataclasses import dataclass

from specdec_lab.theory import Hardware, ModelSpec, get_hardware, get_model

__all__ = ["METHODS", "ServingConfig", "MemoryFit", "LegacyFlagsWarning", "vllm_speculative_config",
           "vllm_argv", "vllm_command", "parse_vllm_command", "vllm_legacy_command", "trtllm_settings",
           "trtllm_yaml", "trtllm_command", "draft_spec", "check_memory"]


@dataclass(frozen=True)
class Method:
    """How one speculation method is spelled by each engine."""

    name: str
    needs_draft: bool  # a draft model / head checkpoint must be named
    trtllm_decoding_type: str
    what: str


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("draft_model", True, "DraftTarget", "a separate, smaller draft model (Leviathan/Chen)"),
    Method("medusa", True, "Medusa", "Medusa heads on the target's hidden state (Cai et al. 2024)"),
    Method("eagle", True, "Eagle", "an EAGLE-1/2 head (one decoder layer on the target's features)"),
    Method("eagle3", True, "Eagle3", "an EAGLE-3 head"),
    Method("ngram", False, "NGram", "prompt lookup: n-gram matches in the context, no model"),
]}


class LegacyFlagsWarning(UserWarning):
    """The pre-2025 vLLM speculative flags were asked for."""


@dataclass(frozen=True)
class ServingConfig:
    """One speculative-decoding deployment.

    target: Hugging Face id or path of the target p (a :data:`~specdec_lab.theory.MODELS` preset
        name or id lets :func:`check_memory` find its shape).
    method: one of :data:`METHODS`.
    draft: the draft model / Medusa / EAGLE head checkpoint (None for ``ngram``).
    k: speculative tokens per target pass (``num_speculative_tokens`` / ``max_draft_len``).
    tensor_parallel: GPUs the target is split over; must divide its attention heads.
    draft_tensor_parallel: None = vLLM's default (same as the target); else 1 or ``tensor_parallel``.
    gpu_memory_utilization: fraction of each GPU's memory the engine may use, in (0, 1].
    max_model_len: longest sequence (prompt + output) in tokens.
    prompt_lookup_max, prompt_lookup_min: n-gram window for ``ngram``.
    concurrent_sequences: sequences of ``max_model_len`` tokens the memory check must hold at once
        (not an engine flag; vLLM only needs room for one to start).
    """

    target: str
    method: str = "draft_model"
    draft: str | None = None
    k: int = 5  # the seed article's choice; see theory.optimal_k for yours
    tensor_parallel: int = 1
    draft_tensor_parallel: int | None = None
    gpu_memory_utilization: float = 0.9  # vLLM's default
    max_model_len: int = 8192
    prompt_lookup_max: int = 4  # vLLM's n-gram docs example
    prompt_lookup_min: int = 1  # vLLM's default
    concurrent_sequences: int = 1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown speculation method {self.method!r}; valid names: "
                             f"{', '.join(METHODS)}")
        if METHODS[self.method].needs_draft and not self.draft:
            raise ValueError(f"method {self.method!r} needs draft=<checkpoint> ({METHODS[self.method].what})")
        if not METHODS[self.method].needs_draft and self.draft:
            raise ValueError(f"method {self.method!r} uses no draft model; got draft={self.draft!r}")
        for name in ("k", "tensor_parallel", "max_model_len", "prompt_lookup_max", "prompt_lookup_min",
                     "concurrent_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.draft_tensor_parallel not in (None, 1, self.tensor_parallel):
            raise ValueError(f"draft_tensor_parallel must be 1 or equal to tensor_parallel "
                             f"({self.tensor_parallel}) — vLLM's rule — got {self.draft_tensor_parallel!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                             f"({self.prompt_lookup_max})")

    @property
    def effective_draft_tensor_parallel(self) -> int:
        return self.tensor_parallel if self.draft_tensor_parallel is None else self.draft_tensor_parallel


# ---------------------------------------------------------------- vLLM


def vllm_speculative_config(config: ServingConfig) -> dict:
    """The ``--speculative-config`` JSON object.

    >>> vllm_speculative_config(ServingConfig("gpt2", method="ngram", k=4))
    {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 4, 'prompt_lookup_min': 1}
    """
    spec = {"method": config.method}
    if config.draft:
        spec["model"] = config.draft
    spec["num_speculative_tokens"] = config.k
    if config.method == "ngram":
        spec["prompt_lookup_max"] = config.prompt_lookup_max
        spec["prompt_lookup_min"] = config.prompt_lookup_min
    elif config.draft_tensor_parallel is not None:
        spec["draft_tensor_parallel_size"] = config.draft_tensor_parallel
    return spec


def _check_known_shapes(config: ServingConfig) -> None:
    """Where the target (and draft) are known presets, check the parallel sizes against their heads."""
    for role, name, tp in (("target", config.target, config.tensor_parallel),
                           ("draft", config.draft, config.effective_draft_tensor_parallel)):
        if role == "draft" and config.method != "draft_model":
            continue
        try:
            spec = get_model(name)
        except ValueError:
            continue  # an unknown checkpoint: nothing to check against
        _check_tensor_parallel(spec, tp, role)


def _check_tensor_parallel(spec: ModelSpec, tp: int, role: str) -> None:
    if spec.attention_heads % tp:
        valid = [d for d in range(1, spec.attention_heads + 1) if spec.attention_heads % d == 0]
        raise ValueError(f"{role} tensor parallel size {tp} does not divide {spec.name}'s "
                         f"{spec.attention_heads} attention heads; valid sizes: {valid}")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ValueError(f"{role} tensor parallel size {tp} and {spec.name}'s {spec.kv_heads} KV heads: "
                         "one must divide the other (KV heads are split, or replicated when TP exceeds them)")


def vllm_argv(config: ServingConfig) -> list[str]:
    """``vllm serve`` as an argument list (no shell quoting needed)."""
    _check_known_shapes(config)
    return ["vllm", "serve", config.target,
            "--tensor-parallel-size", str(config.tensor_parallel),
            "--gpu-memory-utilization", f"{config.gpu_memory_utilization:g}",
            "--max-model-len", str(config.max_model_len),
            "--speculative-config", json.dumps(vllm_speculative_config(config))]


def vllm_command(config: ServingConfig) -> str:
    """``vllm serve ... --speculative-config '<json>'`` as one shell line (see the module example)."""
    return shlex.join(vllm_argv(config))


def parse_vllm_command(command: str) -> ServingConfig:
    """The :class:`ServingConfig` a :func:`vllm_command` line describes (its inverse).

    ``concurrent_sequences`` is not a vLLM flag, so it comes back as its default.

    >>> config = ServingConfig("gpt2", method="ngram", k=3, prompt_lookup_max=5)
    >>> parse_vllm_command(vllm_command(config)) == config
    True
    """
    argv = shlex.split(command)
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        raise ValueError(f"not a `vllm serve MODEL ...` command: {command!r}")
    flags = dict(zip(argv[3::2], argv[4::2]))
    known = {"--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len", "--speculative-config"}
    if len(argv[3:]) % 2 or set(flags) - known:
        raise ValueError(f"unexpected arguments {sorted(set(flags) - known)} in {command!r}")
    spec = json.loads(flags.get("--speculative-config", "{}"))
    return ServingConfig(
        target=argv[2], method=spec.get("method", "draft_model"), draft=spec.get("model"),
        k=spec.get("num_speculative_tokens", ServingConfig.k),
        tensor_parallel=int(flags.get("--tensor-parallel-size", 1)),
        draft_tensor_parallel=spec.get("draft_tensor_parallel_size"),
        gpu_memory_utilization=float(flags.get("--gpu-memory-utilization", ServingConfig.gpu_memory_utilization)),
        max_model_len=int(flags.get("--max-model-len", ServingConfig.max_model_len)),
        prompt_lookup_max=spec.get("prompt_lookup_max", ServingConfig.prompt_lookup_max),
        prompt_lookup_min=spec.get("prompt_lookup_min", ServingConfig.prompt_lookup_min))


LEGACY_WARNING = ("these --speculative-model / --num-speculative-tokens flags were removed from vLLM in "
                  "2025 (vllm-project/vllm#15466); current releases reject them — use vllm_command "
                  "(--speculative-config JSON) unless your vLLM predates their removal")


def vllm_legacy_command(config: ServingConfig) -> str:
    """The same deployment in the flags of pre-2025 vLLM (the seed article's form), with a warning.

    Emits :class:`LegacyFlagsWarning`; the first line of the result is a shell comment saying the
    flags are gone. EAGLE-3 has no legacy form (vLLM supported it only through the JSON).
    """
    if config.method == "eagle3":
        raise ValueError("method 'eagle3' has no legacy-flag form: vLLM supported EAGLE-3 only through "
                         "--speculative-config; use vllm_command")
    _check_known_shapes(config)
    warnings.warn(LEGACY_WARNING, LegacyFlagsWarning, stacklevel=2)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", config.target,
            "--tensor-parallel-size", str(config.tensor_parallel),
            "--gpu-memory-utilization", f"{config.gpu_memory_utilization:g}",
            "--max-model-len", str(config.max_model_len),
            "--speculative-model", "[ngram]" if config.method == "ngram" else config.draft,
            "--num-speculative-tokens", str(config.k)]
    if config.method == "ngram":
        argv += ["--ngram-prompt-lookup-max", str(config.prompt_lookup_max),
                 "--ngram-prompt-lookup-min", str(config.prompt_lookup_min)]
    elif config.draft_tensor_parallel is not None:
        argv += ["--speculative-draft-tensor-parallel-size", str(config.draft_tensor_parallel)]
    return f"# WARNING: {LEGACY_WARNING}\n" + shlex.join(argv)


# ---------------------------------------------------------------- TensorRT-LLM


def trtllm_settings(config: ServingConfig) -> dict:
    """The LLM-API YAML mapping for ``trtllm-serve --config`` (speculation settings only).

    >>> trtllm_settings(ServingConfig("gpt2", method="ngram", k=3))["speculative_config"]
    {'decoding_type': 'NGram', 'max_draft_len': 3, 'max_matching_ngram_size': 4}
    """
    spec = {"decoding_type": METHODS[config.method].trtllm_decoding_type, "max_draft_len": config.k}
    if config.draft:
        spec["speculative_model"] = config.draft
    if config.method == "ngram":
        spec["max_matching_ngram_size"] = config.prompt_lookup_max
    if config.method == "medusa":
        spec["num_medusa_heads"] = config.k
    settings = {"speculative_config": spec}
    if config.method in ("draft_model", "ngram"):
        settings["disable_overlap_scheduler"] = True  # as in TensorRT-LLM's DraftTarget and NGram examples
    return settings


def _yaml_lines(mapping: dict, indent: int = 0) -> list[str]:
    lines = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines += [" " * indent + f"{key}:", *_yaml_lines(value, indent + 2)]
        else:  # JSON scalars are valid YAML flow scalars (strings double-quoted, true/false, numbers)
            lines.append(" " * indent + f"{key}: {json.dumps(value)}")
    return lines


def trtllm_yaml(config: ServingConfig) -> str:
    """:func:`trtllm_settings` as YAML text, with comments on what is not portable.

    >>> print(trtllm_yaml(ServingConfig("meta-llama/Llama-3.1-8B-Instruct",
    ...                                 draft="meta-llama/Llama-3.2-1B-Instruct", k=4)))
    speculative_config:
      decoding_type: "DraftTarget"
      max_draft_len: 4
      speculative_model: "meta-llama/Llama-3.2-1B-Instruct"
    disable_overlap_scheduler: true
    """
    notes = {
        "medusa": "# Medusa runs only on the TensorRT engine back end (trtllm-serve --backend tensorrt).",
        "eagle": "# decoding_type Eagle is an alias of Eagle3; EAGLE-1/2 checkpoints need the TensorRT back end.",
    }
    lines = ([notes[config.method]] if config.method in notes else []) + _yaml_lines(trtllm_settings(config))
    return "\n".join(lines)


def trtllm_command(config: ServingConfig, yaml_path: str = "speculative.yaml") -> str:
    """The ``trtllm-serve`` line that reads :func:`trtllm_yaml` from ``yaml_path``.

    ``--kv_cache_free_gpu_memory_fraction`` is the share of memory left *after* the weights that
    goes to the KV cache; vLLM's utilization is a share of all memory. The same number is passed,
    which gives TensorRT-LLM a somewhat larger cache.
    """
    _check_known_shapes(config)
    argv = ["trtllm-serve", config.target]
    if config.method == "medusa":
        argv += ["--backend", "tensorrt"]
    argv += ["--tp_size", str(config.tensor_parallel), "--max_seq_len", str(config.max_model_len),
             "--kv_cache_free_gpu_memory_fraction", f"{config.gpu_memory_utilization:g}",
             "--config", yaml_path]
    return shlex.join(argv)


# ---------------------------------------------------------------- memory fit


@dataclass(frozen=True)
class MemoryFit:
    """Memory per GPU (bytes) of one deployment, on the most loaded GPU (rank 0 holds the draft)."""

    hardware: str
    gpu_memory: float
    utilization: float
    tensor_parallel: int
    draft_tensor_parallel: int
    target_weights_total: float
    target_weights: float  # this GPU's shard
    draft_weights: float  # this GPU's share of the draft / heads
    target_kv: float  # KV cache on this GPU for all sequences at full length
    draft_kv: float
    sequences: int
    max_model_len: int
    reserve: float  # activations, CUDA graphs, communication buffers: what the caller set aside

    @property
    def allowed(self) -> float:
        return self.utilization * self.gpu_memory

    @property
    def weights(self) -> float:
        return self.target_weights + self.draft_weights + self.reserve

    @property
    def kv_per_sequence(self) -> float:
        return (self.target_kv + self.draft_kv) / self.sequences

    @property
    def needed(self) -> float:
        return self.weights + self.target_kv + self.draft_kv

    @property
    def fits(self) -> bool:
        return self.needed <= self.allowed

    @property
    def spare(self) -> float:
        """Allowed minus needed; negative when it does not fit."""
        return self.allowed - self.needed

    @property
    def max_sequences(self) -> int:
        """Sequences of max_model_len tokens whose KV cache fits next to the weights (0 if none)."""
        room = self.allowed - self.weights
        return max(0, math.floor(room / self.kv_per_sequence)) if self.kv_per_sequence > 0 else 0

    @property
    def sentence(self) -> str:
        """The numbers in words: what each part takes per GPU, and whether it fits."""
        gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
        sequences = f"{self.sequences} sequence{'s' * (self.sequences != 1)} × {self.max_model_len:,} tokens"
        parts = (f"per GPU {gb(self.target_weights)} target weights ({gb(self.target_weights_total)} / TP "
                 f"{self.tensor_parallel}) + {gb(self.draft_weights)} draft (TP {self.draft_tensor_parallel}) + "
                 f"{gb(self.target_kv + self.draft_kv)} KV cache ({sequences})")
        if self.reserve:
            parts += f" + {gb(self.reserve)} reserve"
        budget = f"{gb(self.allowed)} allowed ({self.utilization:g} × {self.gpu_memory / 1e9:g} GB)"
        if self.fits:
            return (f"fits: {parts} = {gb(self.needed)} of the {budget}; {gb(self.spare)} spare, room for "
                    f"{self.max_sequences} sequences of {self.max_model_len:,} tokens.")
        if self.weights > self.allowed:
            why = "the weights alone exceed it: raise the tensor parallel size, quantize, or use larger GPUs"
        else:
            why = (f"the KV cache has room for {self.max_sequences} of {self.sequences} sequences: shorten "
                   "max_model_len, serve fewer sequences, or raise the utilization or tensor parallel size")
        return f"DOES NOT FIT: {parts} = {gb(self.needed)} > {budget}, short by {gb(-self.spare)}; {why}."


def draft_spec(config: ServingConfig, target: ModelSpec) -> ModelSpec | None:
    """Size of what the method adds to the target: a draft model, Medusa heads or an EAGLE head.

    ``draft_model`` looks the draft up by name. Heads are estimated from the target's shape:
    Medusa-1: K heads, each a residual block (hidden² + hidden) and its own LM head (hidden ×
    vocab), no KV cache; EAGLE: one decoder layer of the target plus a fusion layer (2 hidden →
    hidden for EAGLE-1/2, 3 hidden → hidden and its own LM head for EAGLE-3), one layer of KV cache.
    ``ngram`` adds nothing (None).
    """
    h, v = target.hidden_size, target.vocab_size
    shape = dict(hidden_size=h, attention_heads=target.attention_heads, kv_heads=target.kv_heads,
                 head_dim=target.head_dim, vocab_size=v, bytes_per_param=target.bytes_per_param)
    if config.method == "draft_model":
        return get_model(config.draft)
    if config.method == "medusa":
        # Medusa heads keep no KV cache; check_memory leaves it out for this method.
        return ModelSpec(f"medusa heads ×{config.k} (estimate)", round(config.k * (h * h + h + h * v)),
                         layers=1, **shape)
    if config.method in ("eagle", "eagle3"):
        fusion = 3 if config.method == "eagle3" else 2
        head = fusion * h * h + (h * v if config.method == "eagle3" else 0)
        return ModelSpec(f"{config.method} head (estimate)", round(target.layer_parameters + head), layers=1,
                         **shape)
    return None


def check_memory(config: ServingConfig, hardware: str | Hardware, target: ModelSpec | None = None,
                 draft: ModelSpec | None = None, reserve_gb: float = 0.0) -> MemoryFit:
    """Memory per GPU: target shard + draft + KV cache at ``max_model_len``, against utilization × memory.

    Parameters
    ----------
    config : the deployment.
    hardware : a :data:`~specdec_lab.theory.HARDWARE` name or :class:`~specdec_lab.theory.Hardware`.
    target, draft : shapes, when ``config.target`` / ``config.draft`` are not presets (see
        :func:`~specdec_lab.theory.get_model`); heads are estimated by :func:`draft_spec`.
    reserve_gb : per-GPU memory set aside for activations, CUDA graphs and communication buffers.
        Default 0: the check counts only weights and KV cache, so a "fits" near the limit is optimistic.

    Notes
    -----
    Target weights and KV heads are split over ``tensor_parallel`` GPUs (KV heads are replicated when
    TP exceeds them); a draft at TP 1 sits whole on one GPU, and that GPU is the one reported.
    The KV cache holds ``concurrent_sequences × max_model_len`` tokens for target and draft alike.
    Medusa heads keep no KV cache.

    Examples
    --------
    >>> fit = check_memory(ServingConfig("llama-70b", draft="llama-1b", tensor_parallel=1), "h200")
    >>> fit.fits, round(fit.needed / 1e9, 1), round(fit.allowed / 1e9, 1)
    (False, 146.5, 126.9)
    >>> check_memory(ServingConfig("llama-70b", draft="llama-1b", tensor_parallel=3), "h100-sxm5")
    Traceback (most recent call last):
    ...
    ValueError: target tensor parallel size 3 does not divide llama-70b's 64 attention heads; valid sizes: [1, 2, 4, 8, 16, 32, 64]
    """
    hw = get_hardware(hardware)
    target = target or get_model(config.target)
    _check_tensor_parallel(target, config.tensor_parallel, "target")
    extra = draft or draft_spec(config, target)
    draft_tp = config.effective_draft_tensor_parallel
    if extra is not None and config.method == "draft_model":
        _check_tensor_parallel(extra, draft_tp, "draft")
    if not reserve_gb >= 0:
        raise ValueError(f"reserve_gb must be >= 0, got {reserve_gb!r}")
    tokens = config.concurrent_sequences * config.max_model_len

    def kv_on_one_gpu(spec: ModelSpec, tp: int) -> float:
        heads_here = max(1, spec.kv_heads // tp)
        return tokens * spec.kv_bytes_per_token * heads_here / spec.kv_heads

    draft_kv = 0.0 if extra is None or config.method == "medusa" else kv_on_one_gpu(extra, draft_tp)
    return MemoryFit(
        hardware=hw.name, gpu_memory=hw.memory, utilization=config.gpu_memory_utilization,
        tensor_parallel=config.tensor_parallel, draft_tensor_parallel=draft_tp,
        target_weights_total=target.weight_bytes, target_weights=target.weight_bytes / config.tensor_parallel,
        draft_weights=0.0 if extra is None else extra.weight_bytes / draft_tp,
        target_kv=kv_on_one_gpu(target, config.tensor_parallel), draft_kv=draft_kv,
        sequences=config.concurrent_sequences, max_model_len=config.max_model_len, reserve=reserve_gb * 1e9)
