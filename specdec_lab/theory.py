"""Speedup theory: the memory-wall roofline, what acceptance buys, and the best K.

Notation (Leviathan et al. 2023, Section 3): p is the target, q the draft; α is the per-token
acceptance probability, K the draft tokens per target pass, c the cost of one draft pass relative
to one target pass.

**The memory wall.** At batch 1 a decoding step reads every weight once, so a 70B model in 16 bits
(140 GB) on one H100 SXM5 (3.35 TB/s) makes at most about 24 tokens/s, while its tensor cores
would need a fraction of a millisecond for the arithmetic:

>>> seventy_b = ModelSpec("70B fp16", parameters=70_000_000_000, layers=80, hidden_size=8192,
...                       attention_heads=64, kv_heads=8, head_dim=128, vocab_size=128_256)
>>> seventy_b.weight_bytes / 1e9                      # GB of weights
140.0
>>> r = decode_roofline(seventy_b, "h100-sxm5")
>>> round(r.tokens_per_s, 1), r.bound, f"{r.compute_utilisation:.1%}"
(23.9, 'memory', '0.3%')

**What a draft buys.** With i.i.d. acceptance α a target pass yields (1 − α^{K+1})/(1 − α)
tokens on average and costs K c + 1 target-pass equivalents, so the wall-clock speedup is
(1 − α^{K+1}) / ((1 − α)(K c + 1)):

>>> round(expected_speedup(0.8, 4, 0.05), 3), optimal_k(0.8, 0.05)
(2.801, 8)

References
----------
Leviathan, Kalman, Matias (2023), "Fast Inference from Transformers via Speculative Decoding",
ICML, Section 3 (equations for E[tokens] and the walltime improvement) and Section 3.5 (optimal γ).
Williams, Waterman, Patterson (2009), "Roofline: an insightful visual performance model".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

# ---------------------------------------------------------------- model and hardware descriptions


@dataclass(frozen=True)
class ModelSpec:
    """The numbers of a decoder-only transformer that decide its memory traffic.

    parameters: total parameter count (embeddings and LM head included).
    bytes_per_param: 2 for fp16/bf16 weights, 1 for fp8/int8, 0.5 for int4; the KV cache is
        assumed to be stored at the same precision.
    layers, kv_heads, head_dim: give the KV cache, 2 × layers × kv_heads × head_dim × bytes per
        token (keys and values). attention_heads: query heads (tensor parallelism must divide it).
    tied_embeddings: whether the LM head reuses the input embedding (counts V × hidden once).
    hf_id: the Hugging Face id the numbers were read from, if any.
    """

    name: str
    parameters: int
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    bytes_per_param: float = 2.0  # 16-bit weights: how 70B-class models are served by default
    tied_embeddings: bool = False  # input embedding and LM head share one matrix
    hf_id: str | None = None

    def __post_init__(self) -> None:
        for field in ("parameters", "layers", "hidden_size", "attention_heads", "kv_heads", "head_dim",
                      "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{self.name}: {field} must be an integer >= 1, got {value!r}")
        if not self.bytes_per_param > 0:
            raise ValueError(f"{self.name}: bytes_per_param must be > 0, got {self.bytes_per_param!r}")
        if self.attention_heads % self.kv_heads:
            raise ValueError(f"{self.name}: attention_heads ({self.attention_heads}) must be a multiple "
                             f"of kv_heads ({self.kv_heads})")

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights read by one decoding step."""
        return self.parameters * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token of context: 2 (K and V) × layers × kv_heads × head_dim × bytes.

        >>> MODELS["llama-70b"].kv_bytes_per_token           # 320 KiB per token in bf16
        327680.0
        """
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def layer_parameters(self) -> float:
        """Mean parameters per decoder layer: everything but the embedding and LM head, spread over layers."""
        return (self.parameters - self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)) / self.layers

    @property
    def attention_width(self) -> int:
        """Query heads × head dimension: the width of the attention scores' dot products."""
        return self.attention_heads * self.head_dim


# Shapes read from each model's config.json; parameter counts from its safetensors index (the test
# suite recomputes every Llama count from the shape). Llama weights are bf16 as published; gpt2 and
# the bundled models are published in fp32.
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec("llama-70b", 70_553_706_496, layers=80, hidden_size=8192, attention_heads=64, kv_heads=8,
              head_dim=128, vocab_size=128_256, hf_id="meta-llama/Llama-3.3-70B-Instruct"),
    ModelSpec("llama-8b", 8_030_261_248, layers=32, hidden_size=4096, attention_heads=32, kv_heads=8,
              head_dim=128, vocab_size=128_256, hf_id="meta-llama/Llama-3.1-8B-Instruct"),
    ModelSpec("llama-1b", 1_235_814_400, layers=16, hidden_size=2048, attention_heads=32, kv_heads=8,
              head_dim=64, vocab_size=128_256, tied_embeddings=True, hf_id="meta-llama/Llama-3.2-1B-Instruct"),
    ModelSpec("gpt2", 124_439_808, layers=12, hidden_size=768, attention_heads=12, kv_heads=12,
              head_dim=64, vocab_size=50_257, bytes_per_param=4.0, tied_embeddings=True, hf_id="gpt2"),
    # specdec_lab/bundled/{target,draft}/config.json; counts as in docs/models.md.
    ModelSpec("bundled-target", 3_426_560, layers=4, hidden_size=256, attention_heads=4, kv_heads=4,
              head_dim=64, vocab_size=512, bytes_per_param=4.0),
    ModelSpec("bundled-draft", 270_816, layers=2, hidden_size=96, attention_heads=2, kv_heads=2,
              head_dim=48, vocab_size=512, bytes_per_param=4.0, tied_embeddings=True),
]}


@dataclass(frozen=True)
class Hardware:
    """One accelerator: memory bandwidth (bytes/s), dense 16-bit throughput (FLOP/s), memory (bytes)."""

    name: str
    bandwidth: float
    flops: float
    memory: float
    note: str = ""

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.flops > 0 and self.memory > 0):
            raise ValueError(f"{self.name}: bandwidth, flops and memory must all be > 0")


# Sources: NVIDIA datasheets (dense tensor-core BF16, i.e. without the 2:4 sparsity factor that the
# headline figures include). Memory is the marketed size in decimal GB, at most what CUDA reports for the part
# (conservative; the reading is in docs/method.md, "Library internals").
HARDWARE: dict[str, Hardware] = {hw.name: hw for hw in [
    # H100 SXM5: 3.35 TB/s HBM3, 989 TFLOP/s BF16 dense (1,979 with sparsity), 80 GB.
    Hardware("h100-sxm5", 3.35e12, 989e12, 80e9, "NVIDIA H100 SXM5 datasheet"),
    # H100 PCIe: 2.0 TB/s HBM2e, 756 TFLOP/s BF16 dense (1,513 with sparsity), 80 GB.
    Hardware("h100-pcie", 2.0e12, 756e12, 80e9, "NVIDIA H100 PCIe datasheet"),
    # H200 SXM: 4.8 TB/s HBM3e, 141 GB; same Hopper compute as H100 SXM5 (989 TFLOP/s dense BF16).
    Hardware("h200", 4.8e12, 989e12, 141e9, "NVIDIA H200 datasheet"),
    # A100 80GB SXM: 2,039 GB/s HBM2e, 312 TFLOP/s BF16 dense.
    Hardware("a100-80gb", 2.039e12, 312e12, 80e9, "NVIDIA A100 datasheet (80GB SXM)"),
    # L40S: 864 GB/s GDDR6, 362 TFLOP/s BF16 dense (733 with sparsity), 48 GB.
    Hardware("l40s", 864e9, 362e12, 48e9, "NVIDIA L40S datasheet"),
    # Deliberately rough: dual-channel DDR5 / LPDDR5 laptops reach ~50-100 GB/s; a few cores with
    # AVX2/AVX-512 FMA reach ~0.5-2 TFLOP/s in fp32. Orders of magnitude, not a measurement.
    Hardware("laptop-cpu", 75e9, 1e12, 16e9, "rough: laptop CPU, 50-100 GB/s, ~1 TFLOP/s"),
]}


def get_model(model: str | ModelSpec) -> ModelSpec:
    """A :class:`ModelSpec` from a preset name or Hugging Face id (or the spec itself).

    >>> get_model("meta-llama/Llama-3.2-1B-Instruct").name
    'llama-1b'
    >>> get_model("llama-405b")
    Traceback (most recent call last):
    ...
    ValueError: unknown model 'llama-405b'; valid names: bundled-draft, bundled-target, gpt2, llama-1b, llama-70b, llama-8b (or their Hugging Face ids, or pass a ModelSpec)
    """
    if isinstance(model, ModelSpec):
        return model
    by_id = {spec.hf_id: spec for spec in MODELS.values() if spec.hf_id}
    if model in MODELS:
        return MODELS[model]
    if model in by_id:
        return by_id[model]
    raise ValueError(f"unknown model {model!r}; valid names: {', '.join(sorted(MODELS))} "
                     "(or their Hugging Face ids, or pass a ModelSpec)")


def get_hardware(hardware: str | Hardware) -> Hardware:
    """A :class:`Hardware` from its name (or the object itself); the error lists valid names."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; valid names: {', '.join(sorted(HARDWARE))} "
                         "(or pass a Hardware)")
    return HARDWARE[hardware]


# ---------------------------------------------------------------- roofline


@dataclass(frozen=True)
class Roofline:
    """One forward step of ``batch`` sequences, ``tokens`` new tokens each, over ``context`` cached ones."""

    model: str
    hardware: str
    batch: int
    context: int
    tokens: int
    gpus: int
    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_time_s: float
    compute_time_s: float

    @property
    def bytes_moved(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def step_time_s(self) -> float:
        """The roofline bound: max(bytes / bandwidth, FLOPs / throughput)."""
        return max(self.memory_time_s, self.compute_time_s)

    @property
    def bound(self) -> str:
        """Which resource binds: 'memory' or 'compute'."""
        return "memory" if self.memory_time_s >= self.compute_time_s else "compute"

    @property
    def tokens_per_s(self) -> float:
        """Upper bound on generated tokens per second (all sequences together) for plain decoding."""
        return self.batch * self.tokens / self.step_time_s

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved; the hardware's ridge point is its FLOP/s over its bytes/s."""
        return self.flops / self.bytes_moved

    @property
    def compute_utilisation(self) -> float:
        """Fraction of peak FLOP/s used at the roofline bound."""
        return self.compute_time_s / self.step_time_s


def decode_roofline(model: str | ModelSpec, hardware: str | Hardware, batch: int = 1, context: int = 0,
                    tokens: int = 1, gpus: int = 1) -> Roofline:
    """Roofline bound for one decoding step.

    Parameters
    ----------
    model, hardware : preset names (see ``MODELS``, ``HARDWARE``) or the dataclasses.
    batch : sequences decoded together.
    context : tokens already in each sequence's KV cache (read once per step).
    tokens : new tokens per sequence in this step: 1 for plain decoding, K + 1 for a speculative
        verification pass.
    gpus : devices sharing the work with ideal tensor parallelism (bandwidth and FLOP/s add up).

    Returns
    -------
    Roofline
        bytes moved = weights + batch × context × KV bytes per token; FLOPs = 2 × parameters per
        token plus attention, 4 × layers × heads × head_dim × context per token; time =
        max(bytes / bandwidth, FLOPs / FLOP/s).

    Notes
    -----
    A bound, not a prediction: kernels reach 70-90% of peak bandwidth, and launch overheads dominate
    for tiny models (the bundled pair on a CPU is far from its roofline).

    Examples
    --------
    >>> r = decode_roofline("llama-70b", "h100-sxm5")
    >>> round(r.weight_bytes / 1e9, 1), round(r.tokens_per_s, 1), r.bound
    (141.1, 23.7, 'memory')
    >>> decode_roofline("llama-70b", "h100-sxm5", batch=512).bound
    'compute'
    """
    spec, hw = get_model(model), get_hardware(hardware)
    for name, value, low in (("batch", batch, 1), ("context", context, 0), ("tokens", tokens, 1),
                             ("gpus", gpus, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    kv_bytes = batch * context * spec.kv_bytes_per_token
    flops = batch * tokens * (2.0 * spec.parameters + 4.0 * spec.layers * spec.attention_width * context)
    return Roofline(spec.name, hw.name, batch, context, tokens, gpus, spec.weight_bytes, kv_bytes, flops,
                    memory_time_s=(spec.weight_bytes + kv_bytes) / (gpus * hw.bandwidth),
                    compute_time_s=flops / (gpus * hw.flops))


def compute_bound_batch(model: str | ModelSpec, hardware: str | Hardware, context: int = 0) -> int | None:
    """Smallest batch at which decoding stops being memory-bound; None if it never does.

    Solves B (2P + 4 L d T) / F ≥ (P b + B T kv) / BW for B. With long contexts the KV cache grows
    with the batch as fast as the arithmetic, and decoding can stay memory-bound at any batch.

    >>> compute_bound_batch("llama-70b", "h100-sxm5")      # ≈ bytes/param × ridge point / 2
    296
    >>> compute_bound_batch("llama-70b", "h100-sxm5", context=32_768) is None
    True
    """
    spec, hw = get_model(model), get_hardware(hardware)
    per_sequence = (2.0 * spec.parameters + 4.0 * spec.layers * spec.attention_width * context) / hw.flops \
        - context * spec.kv_bytes_per_token / hw.bandwidth
    if per_sequence <= 0:
        return None
    return math.ceil(spec.weight_bytes / hw.bandwidth / per_sequence)


# ---------------------------------------------------------------- speedup (Leviathan et al.)


def _check_alpha_k(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k (draft tokens per target pass) must be an integer >= 0, got {k!r}")


def _check_c(c: float) -> None:
    if not (c >= 0.0 and math.isfinite(c)):
        raise ValueError(f"c (draft/target cost ratio) must be a finite number >= 0, got {c!r}")


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 − α^{K+1}) / (1 − α): mean tokens per target pass for i.i.d. acceptance α.

    K = 0 (no drafting) and α = 0 give 1 token; α = 1 gives K + 1. Computed as
    expm1((K+1) log α) / expm1(log α), which stays accurate as α → 1.

    >>> round(expected_tokens_per_pass(0.8, 4), 4)
    3.3616
    >>> expected_tokens_per_pass(1.0, 4)
    5.0
    >>> expected_tokens_per_pass(0.0, 4)
    1.0
    """
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    if alpha == 0.0 or k == 0:
        return 1.0
    log_alpha = math.log1p(alpha - 1.0)
    return math.expm1((k + 1) * log_alpha) / math.expm1(log_alpha)


def expected_work_per_sample(alpha: float, k: int, length: int) -> dict:
    """Expected work of one chain that stops at exactly ``length`` tokens, drafting min(K, r − 1)
    tokens when r are still missing (``samplers.speculative.draft_lengths``), i.i.d. acceptance α.

    A step drafting k tokens costs one target pass over k + 1 positions and k draft passes, and
    emits j + 1 tokens with probability α^j (1 − α) for j < k and α^k for j = k; the expectations
    follow by recursion on r. Returns target passes, target positions and draft passes per sample.
    As L grows, target passes / L tends to 1 / expected_tokens_per_pass(α, K).

    >>> w = expected_work_per_sample(0.0, 4, 8)  # nothing accepted: 8 steps of k = 4,4,4,4,3,2,1,0
    >>> w["target_passes"], w["target_positions"], w["draft_passes"]
    (8.0, 30.0, 22.0)
    >>> w = expected_work_per_sample(1.0, 4, 8)  # all accepted: k = 4 emits 5, then k = 2 emits 3
    >>> w["target_passes"], w["target_positions"], w["draft_passes"]
    (2.0, 8.0, 6.0)
    """
    _check_alpha_k(alpha, k)
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    work = np.zeros((length + 1, 3))  # work[r] = (target passes, target positions, draft passes) for r missing
    for r in range(1, length + 1):
        k_r = min(k, r - 1)
        emit = np.array([alpha**j * (1 - alpha) for j in range(k_r)] + [alpha**k_r])  # P(j + 1 tokens)
        after = sum(emit[j] * work[r - j - 1] for j in range(k_r + 1))
        work[r] = np.array([1.0, k_r + 1.0, float(k_r)]) + after
    return dict(zip(("target_passes", "target_positions", "draft_passes"), map(float, work[length])))


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Wall-clock speedup (1 − α^{K+1}) / ((1 − α)(K c + 1)) over plain decoding.

    Assumes a verification pass over K + 1 tokens costs what a one-token target pass costs (true
    while decoding is memory-bound; see :func:`roofline_speedup` otherwise).

    >>> round(expected_speedup(0.8, 4, 0.05), 3)
    2.801
    >>> expected_speedup(0.8, 0, 0.05)      # K = 0: no speculation, no change
    1.0
    """
    _check_c(c)
    return expected_tokens_per_pass(alpha, k) / (k * c + 1.0)


def optimal_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The K in 0..k_max with the largest :func:`expected_speedup`; 0 means "do not speculate".

    Ties go to the smaller K. When α = 1 and c < 1 the speedup grows without bound in K, so the
    answer is ``k_max``: the search range is part of the question.

    >>> optimal_k(0.8, 0.05), optimal_k(0.6, 0.3), optimal_k(0.1, 0.5)
    (8, 1, 0)
    """
    if not isinstance(k_max, (int, np.integer)) or k_max < 0:
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    speedups = [expected_speedup(alpha, k, c) for k in range(k_max + 1)]
    return int(np.argmax(speedups))  # first maximum: the smallest K on ties


def speedup_table(alpha: float, c: float, k_max: int = 10) -> pd.DataFrame:
    """K = 0..k_max: expected tokens per target pass and wall-clock speedup, best K marked.

    >>> t = speedup_table(0.75, 0.05, k_max=8)
    >>> t.loc[t.best, ["K", "tokens/pass", "speedup"]].round(3).to_dict("records")
    [{'K': 7, 'tokens/pass': 3.6, 'speedup': 2.666}]
    """
    best = optimal_k(alpha, c, k_max)
    rows = [{"K": k, "tokens/pass": expected_tokens_per_pass(alpha, k), "speedup": expected_speedup(alpha, k, c),
             "best": k == best} for k in range(k_max + 1)]
    return pd.DataFrame(rows)


def draft_cost_ratio(target: str | ModelSpec, draft: str | ModelSpec, hardware: str | Hardware,
                     batch: int = 1, context: int = 0) -> float:
    """c = roofline time of one draft step / one target step, same batch and context.

    In the memory-bound regime this is about the ratio of the models' weight bytes:

    >>> round(draft_cost_ratio("llama-70b", "llama-1b", "h100-sxm5"), 4)
    0.0175
    """
    return (decode_roofline(draft, hardware, batch, context).step_time_s
            / decode_roofline(target, hardware, batch, context).step_time_s)


def roofline_speedup(alpha: float, k: int, target: str | ModelSpec, draft: str | ModelSpec,
                     hardware: str | Hardware, batch: int = 1, context: int = 0) -> float:
    """Speedup when the verification pass is priced by the roofline too.

    One speculative cycle costs K draft steps plus one target step over K + 1 tokens per
    sequence; plain decoding costs one target step per token. In the memory-bound regime this
    equals :func:`expected_speedup` with c from :func:`draft_cost_ratio`; once the K + 1-token
    pass becomes compute-bound (large batches, or a CPU) speculation buys less, and can lose.

    >>> round(roofline_speedup(0.8, 4, "llama-70b", "llama-1b", "h100-sxm5"), 2)
    3.14
    >>> roofline_speedup(0.8, 4, "llama-70b", "llama-1b", "h100-sxm5", batch=256) < 1
    True
    """
    _check_alpha_k(alpha, k)
    plain = decode_roofline(target, hardware, batch, context).step_time_s
    cycle = k * decode_roofline(draft, hardware, batch, context).step_time_s \
        + decode_roofline(target, hardware, batch, context, tokens=k + 1).step_time_s
    return expected_tokens_per_pass(alpha, k) * plain / cycle


# ---------------------------------------------------------------- acceptance from distributions


def acceptance_rate(p, q):
    """α = Σ_x min(p(x), q(x)) = 1 − TV(p, q): the chance a draft token x ~ q is accepted.

    p (target) and q (draft) are probability vectors over the last axis (numpy or torch); returns a
    float for 1-D input, else an array over the leading axes.

    >>> acceptance_rate([0.5, 0.5], [0.9, 0.1])      # TV = 0.4
    0.6
    >>> acceptance_rate([1.0, 0.0], [0.0, 1.0])      # disjoint supports: never accepted
    0.0
    """
    p = p.detach().cpu().double().numpy() if isinstance(p, torch.Tensor) else np.asarray(p, dtype=float)
    q = q.detach().cpu().double().numpy() if isinstance(q, torch.Tensor) else np.asarray(q, dtype=float)
    if p.shape != q.shape or p.ndim == 0:
        raise ValueError(f"p and q must be probability vectors of one shape, got {p.shape} and {q.shape}")
    for name, law in (("p", p), ("q", q)):
        if (law < 0).any() or not np.allclose(law.sum(-1), 1.0, atol=1e-6):
            raise ValueError(f"{name} must be non-negative and sum to 1 over the last axis")
    alpha = np.minimum(p, q).sum(-1)
    return float(alpha) if alpha.ndim == 0 else alpha


@torch.no_grad()
def measure_acceptance(pair, texts: list[str] | str, sampling=None) -> float:
    """Mean α = Σ min(p, q) over every position of ``texts``, target and draft fed the same tokens.

    ``pair`` is a :class:`~specdec_lab.models.ModelPair`; both laws go through
    :func:`~specdec_lab.sampling.to_probs` with the same ``sampling`` settings (default T = 1).
    Each text must encode to at least one token; the law after its last token is included.
    """
    from specdec_lab.sampling import SamplingConfig, to_probs

    sampling = sampling or SamplingConfig()
    texts = [texts] if isinstance(texts, str) else list(texts)
    alphas = []
    for text in texts:
        ids = pair.encode(text).to(pair.device)[None]  # (1, T)
        p = to_probs(pair.target(ids).logits[0, :, :pair.vocab_size], sampling)  # (T, V)
        q = to_probs(pair.draft(ids).logits[0, :, :pair.vocab_size], sampling)  # (T, V)
        alphas.append(torch.minimum(p, q).sum(-1))
    return float(torch.cat(alphas).mean())
