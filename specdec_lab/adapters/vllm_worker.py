"""vLLM's offline engine as a worker process: runs inside ``.venv-vllm``, imports only vLLM and the stdlib.

Started by :mod:`specdec_lab.adapters.vllm` as ``.venv-vllm/bin/python -P vllm_worker.py ENGINE_JSON``
(by file path, so it never imports ``specdec_lab`` and its pins; ``-P`` keeps this folder, whose
``vllm.py`` is the adapter, off ``sys.path``). ``ENGINE_JSON`` holds the keyword
arguments of ``vllm.LLM`` (model, speculative_config, seed, dtype, ...); ``--tools`` in its place starts
a worker without an engine. The worker builds its engine, then answers jobs in the JSON-lines loop of
:mod:`~specdec_lab.adapters.worker_loop` (one line per job on stdin, one per reply; vLLM's own prints and logs go to
stderr).

Job: ``{"prompt_ids": [...], "seeds": [...], "n_per_request": n, "length": L, "temperature": T,
"top_p": P, "top_k": K}``: one request per seed, each with ``n`` completions of exactly L tokens
(``min_tokens = max_tokens = L``, ``ignore_eos``), all submitted at once (``LLM.generate`` batches
them, which keeps the engine saturated). Reply: ``{"tokens": [[...] × n per seed, in seed order],
"metrics": {vLLM's spec-decode counters over this job}}``, or ``{"error": "..."}``. Any worker also
answers tool jobs ``{"tool": "parse" | "expand_check" | "sampler_check", ...}`` (see ``TOOLS``), so
they reuse a process that has already paid for importing vLLM.

Seeds: vLLM gives the i-th of the n completions of a request with seed s the seed s + i
(``vllm/v1/engine/parallel_sampling.py``, ``ParentRequest._get_child_sampling_params``), and each
seeded request its own ``torch.Generator`` (``gpu_model_runner.py``: ``generator.manual_seed``).
The caller therefore sends seeds on a lattice of step n, so the blocks [s, s + n) never overlap.
"""

import os
import runpy
import sys
import time
from pathlib import Path

# the shared request loop, loaded by path: this folder is not on sys.path here (worker_loop's docstring)
serve = runpy.run_path(str(Path(__file__).with_name("worker_loop.py")))["serve"]

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "draft_steps",
                 "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}


def spec_counters(llm) -> dict:
    """vLLM's own spec-decode counters (cumulative), by our names; zeros without speculation.
    ``accepted_first``: accepted draft tokens at the first draft position of a step (the per-position
    counter ``vllm:spec_decode_num_accepted_tokens_per_pos``, position 0)."""
    totals = dict.fromkeys([*SPEC_COUNTERS.values(), "accepted_first"], 0)
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS and hasattr(metric, "value"):
            totals[SPEC_COUNTERS[metric.name]] += int(metric.value)
        if metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos" and getattr(metric, "values", None):
            totals["accepted_first"] += int(metric.values[0])
    return totals


def run_job(llm, job: dict) -> dict:
    from vllm import SamplingParams

    n, length = job["n_per_request"], job["length"]
    requests, params = [], []
    for seed in job["seeds"]:
        requests.append({"prompt_token_ids": job["prompt_ids"]})
        params.append(SamplingParams(n=n, seed=seed, max_tokens=length, min_tokens=length, ignore_eos=True,
                                     temperature=job["temperature"], top_p=job["top_p"], top_k=job["top_k"] or 0,
                                     detokenize=False))
    before = spec_counters(llm)
    started = time.monotonic()
    outputs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.monotonic() - started
    after = spec_counters(llm)
    tokens = []
    for output in outputs:  # LLM.generate returns outputs in request order
        completions = sorted(output.outputs, key=lambda c: c.index)
        if len(completions) != n:
            return {"error": f"request {output.request_id} returned {len(completions)} completions, asked {n}"}
        tokens += [list(c.token_ids) for c in completions]
    metrics = {key: after[key] - before[key] for key in after}
    metrics.update(requests=len(requests), engine_seconds=seconds)
    return {"tokens": tokens, "metrics": metrics}


def parse_command(argv: list) -> dict:
    """Parse one command line with vLLM's own CLI parser: ``vllm serve ...`` through the ``serve``
    subcommand's parser, then ``EngineArgs.from_cli_args``; ``python -m vllm.entrypoints.openai.api_server
    ...`` (the older entry point) through the same argument set. Returns the parsed engine
    settings, or vLLM's own error message."""
    import argparse
    import contextlib
    import io

    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:2] == ["vllm", "serve"]:
        parser = FlexibleArgumentParser(prog="vllm")
        ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
        args_in = argv[1:]
    elif argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]:
        parser = make_arg_parser(FlexibleArgumentParser(prog="api_server"))
        args_in = argv[3:]
    else:
        return {"error": f"not a vLLM command: {argv[:3]}"}
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(args_in)
    except SystemExit:
        return {"error": errors.getvalue().strip().splitlines()[-1] if errors.getvalue() else "parser exited"}
    model = getattr(args, "model_tag", None) or args.model
    engine = EngineArgs.from_cli_args(argparse.Namespace(**{**vars(args), "model": model}))
    return {"model": engine.model, "tensor_parallel_size": engine.tensor_parallel_size,
            "gpu_memory_utilization": engine.gpu_memory_utilization, "max_model_len": engine.max_model_len,
            "speculative_config": engine.speculative_config}


def cpu_kernels():
    """Register the C++ kernels the CPU engine uses in place of vLLM's Triton kernels (as the engine does)."""
    import vllm._custom_ops  # noqa: F401  (loads torch.ops._C)
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()


def expand_check() -> dict:
    """Minimal reproduction of the finding: ``expand_batch_to_tokens`` (rejection_sampler.py) with the CPU
    kernel, on per-request temperatures [1.0, 0.7] with 2 draft tokens each."""
    import torch

    cpu_kernels()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    got = expand_batch_to_tokens(torch.tensor([1.0, 0.7]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    return {"expected": [1.0, 1.0, 0.7, 0.7], "got": [float(v) for v in got]}


def sampler_check(job: dict) -> dict:
    """vLLM's rejection sampler (``RejectionSampler.forward``'s two steps: ``apply_sampling_constraints``,
    then ``rejection_sample``) on exact laws: B requests, each with K drafts from q (``draft_probs`` given,
    vLLM's probabilistic drafting) or the argmax of q (``draft_probs`` None, its default greedy drafting),
    every position with the same target logits. Returns per-position counts of the emitted tokens."""
    import torch

    cpu_kernels()
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    B, K = job["requests"], job["k"]
    logits, logq = torch.tensor(job["target_logits"]), torch.tensor(job["draft_logprobs"])  # (V,), (V,)
    V = logits.numel()
    generator = torch.Generator().manual_seed(2 * job["seed"] + 1)  # drafts and bonus tokens
    torch.manual_seed(2 * job["seed"])  # vLLM's own draws (unseeded requests use the global generator)
    if job["greedy_draft"]:
        draft, draft_probs = torch.full((B * K,), int(logq.argmax()), dtype=torch.int32), None
    else:
        q = logq.exp()
        draft = torch.multinomial(q, B * K, replacement=True, generator=generator).to(torch.int32)
        draft_probs = q.expand(B * K, V).contiguous()
    meta = SamplingMetadata(
        temperature=torch.full((B,), job["temperature"]), all_greedy=False, all_random=True, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B), presence_penalties=torch.zeros(B), repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    cu = torch.arange(1, B + 1, dtype=torch.int32) * K
    target = logits.expand(B * K, V).contiguous().clone()
    if job["constraints"]:
        target = rs.apply_sampling_constraints(target, cu, meta)
    bonus = torch.multinomial(torch.softmax(logits / job["temperature"], -1), B, replacement=True,
                              generator=generator)[:, None]
    out = rs.rejection_sample(draft, [K] * B, K, cu, draft_probs, target, bonus, meta)  # (B, K + 1)
    counts = [torch.bincount(out[:, j][out[:, j] >= 0].long(), minlength=V).tolist() for j in range(K + 1)]
    return {"counts": counts}


KERNEL_INPUTS: dict = {}  # the last batch of target logits and draft laws sent by file (reused across calls)


def fixed_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expand_kernel`` done in torch, in place and in the output's own dtype: the CPU override
    (``cpu_triton_utils._expand_kernel_impl``) runs the C++ kernel on int64 copies of ``output`` and
    ``input_val`` and never copies back, so float temperatures and top-p come out uninitialised."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output.copy_(torch.repeat_interleave(values, counts).to(output.dtype)[: output.numel()])


def use_expand(patched: bool) -> None:
    """Route the rejection sampler's ``expand_kernel`` to :func:`fixed_expand` or back to vLLM's CPU override."""
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler as rs

    rs.expand_kernel._impl = fixed_expand if patched else cpu_triton_utils._expand_kernel_impl


def spec_metadata(n: list, draft_tokens, device):
    """vLLM's ``SpecDecodeMetadata`` for requests with n_b drafts each; logits rows are packed per request
    as its n_b draft positions, then its bonus position (as the model runner lays them out)."""
    import numpy as np
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    flat = [int(t) for b, nb in enumerate(n) for t in draft_tokens[b][:nb]]
    starts = np.concatenate([[0], np.cumsum([nb + 1 for nb in n])[:-1]])
    target_rows = [int(s + j) for s, nb in zip(starts, n) for j in range(nb)]
    bonus_rows = [int(s + nb) for s, nb in zip(starts, n)]
    i32 = dict(dtype=torch.int32, device=device)
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor(flat, **i32), num_draft_tokens=list(n),
        cu_num_draft_tokens=torch.tensor(np.cumsum(n), **i32),
        cu_num_sampled_tokens=torch.tensor(np.cumsum([nb + 1 for nb in n]), **i32),
        target_logits_indices=torch.tensor(target_rows, **i32), bonus_logits_indices=torch.tensor(bonus_rows, **i32),
        logits_indices=torch.arange(sum(n) + len(n), **i32))


def rejection_kernel(job: dict) -> dict:
    """vLLM's ``RejectionSampler.forward`` (bonus tokens from its ``Sampler``) on one batch in the kernel
    contract of ``specdec_lab.kernels.contract``. Job: ``inputs`` (a torch file of ``target_logits``
    (B, K+1, V) and ``draft_probs`` (B, K, V), or None to reuse the last), ``draft_tokens`` (B lists,
    -1 padded), per-row ``temperature``, ``top_k`` (0 = off), ``top_p``, ``seed`` (vLLM's global torch
    generator; requests unseeded), ``patch_expand`` (:func:`fixed_expand`; CPU only) and ``device`` ("cpu", or
    "cuda" for vLLM's Triton path). Reply: ``tokens`` (B, K+1), -1 padded."""
    import torch

    device = job.get("device", "cpu")
    if device == "cpu":  # the CPU build's kernels; on CUDA vLLM runs its Triton (and FlashInfer) paths
        cpu_kernels()
        use_expand(job["patch_expand"])
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    if job["inputs"]:
        KERNEL_INPUTS.update(torch.load(job["inputs"]))
    logits = KERNEL_INPUTS["target_logits"].to(device)  # (B, K+1, V)
    q = KERNEL_INPUTS["draft_probs"].to(device)  # (B, K, V)
    B, K1, V = logits.shape
    drafts = job["draft_tokens"]
    n = [sum(1 for t in row if t >= 0) for row in drafts]
    temperature = torch.tensor(job["temperature"], dtype=torch.float32, device=device)
    top_k = torch.tensor([k if 0 < k < V else V for k in job["top_k"]], dtype=torch.int32, device=device)
    top_p = torch.tensor(job["top_p"], dtype=torch.float32, device=device)
    greedy = temperature == 0
    meta = SamplingMetadata(
        temperature=temperature, all_greedy=bool(greedy.all()), all_random=bool((~greedy).all()),
        top_p=None if bool((top_p == 1).all()) else top_p, top_k=None if bool((top_k == V).all()) else top_k,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B, device=device), presence_penalties=torch.zeros(B, device=device),
        repetition_penalties=torch.ones(B, device=device), output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    packed = torch.cat([logits[b, : n[b] + 1] for b in range(B)])  # (sum n + B, V)
    draft_probs = torch.cat([q[b, : n[b]] for b in range(B)]).contiguous()  # (sum n, V)
    torch.manual_seed(job["seed"])  # seeds CUDA's generators too
    out = RejectionSampler(Sampler())(spec_metadata(n, drafts, packed.device), draft_probs, packed, meta)
    tokens = out.sampled_token_ids.long().cpu()  # (B, max n + 1)
    full = torch.full((B, K1), -1, dtype=torch.long)
    full[:, : tokens.shape[1]] = tokens
    return {"tokens": full.tolist()}


TOOLS = {"parse": lambda job: {"parsed": [parse_command(argv) for argv in job["commands"]]},
         "expand_check": lambda job: expand_check(),
         "sampler_check": sampler_check,
         "rejection_kernel": rejection_kernel}


def start_engine(engine: dict):
    """``vllm.LLM(**engine)``; raises vLLM's own refusal, or a changed method.

    vLLM 0.32 rewrites the asked method from the draft's path: any method but eagle/eagle3/dflash/dspark
    becomes ``eagle3`` when the path contains "eagle3" and ``eagle`` when it contains "eagle-", parent
    folders included (``vllm/config/speculative.py``, "Automatically detect the method"). A row would
    then be labelled with a method vLLM did not run, so that is refused here, from vLLM's own resolved config."""
    patch = engine.pop("specdec_lab_patch", None)
    if patch is not None:  # an opt-in fix of ours (specdec_lab/patches), loaded by path: stdlib, torch, vLLM only
        import importlib.util

        spec = importlib.util.spec_from_file_location("specdec_lab_patch", patch)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"specdec-lab patch applied: {module.apply()}", file=sys.stderr)
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    spec = engine.get("speculative_config") or {}
    if spec.get("method") is not None:
        ran = EngineArgs(**engine).create_engine_config().speculative_config.method
        if ran != spec["method"]:
            raise ValueError(f"vLLM changed the speculative method {spec['method']!r} to {ran!r}: it detects the "
                             f"method from substrings of the draft's path {spec.get('model')!r} "
                             "(vllm/config/speculative.py); use a path without 'eagle3' / 'eagle-'")
    return LLM(**engine)


def version() -> dict:
    import vllm

    return {"vllm_version": vllm.__version__}


if __name__ == "__main__":
    # stdin closed: leave without vLLM's engine shutdown, which can hang in a worker
    os._exit(serve(start_engine, run_job, version, TOOLS))
