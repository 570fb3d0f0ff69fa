"""``specdec-lab audit hf|endpoint|vllm|openvino|ortgenai|mlx|mistralrs|llama-speculative``: arguments, the run, the
table.

Exit status (:func:`specdec_lab.verdicts.exit_status`): 0 when the row is certified (a lossless row equivalent, a
negative control rejected), 1 when it is rejected or the engine failed (a wrong call), 3 when it is inconclusive,
2 for usage and input errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import pandas as pd

from specdec_lab import results, verdicts
from specdec_lab.audit import (DEFAULT_PROMPT, LOOKUP_PROMPT, NEGATIVE_CONTROL_SAMPLES, audit, audit_llama_speculative,
                               plan_audit_samples)
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

CPU_ENGINES = ("openvino", "ortgenai", "mlx", "mistralrs")  # engines in their own environments, a worker per setting
EXIT_STATUS = """exit status (every audit command):
  0  certified: a lossless row equivalent (TV bound <= ε, drafting shown), a negative control rejected
  1  rejected (a lossless row), or the engine failed: a finding
  3  inconclusive: not rejected, bound above ε (more samples needed), or drafting not exercised
  2  usage or input error"""


# ---------------------------------------------------------------- command line: specdec-lab audit


def add_audit_parser(sub) -> None:
    """Add ``specdec-lab audit hf|endpoint`` to the CLI's subparsers."""
    from specdec_lab.adapters.hf import MODES, SCHEDULES

    audit_parser = sub.add_parser("audit", help="audit an implementation we did not write (HF generate, a server)",
                                  epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = audit_parser.add_subparsers(dest="kind", required=True)
    hf = kinds.add_parser("hf", help="Hugging Face generate: assisted generation, prompt lookup or plain")
    hf.add_argument("--mode", default="assisted", choices=list(MODES))
    hf.add_argument("--k", type=int, default=4, help="num_assistant_tokens / prompt_lookup_num_tokens")
    hf.add_argument("--schedule", default="constant", choices=list(SCHEDULES))
    hf.add_argument("--confidence-threshold", type=float, default=0.4,
                    help="HF's assistant_confidence_threshold (its default 0.4)")
    _pair_and_common_args(hf, samples=3000, length=6)  # L = K + 2: every draft position, the bonus, the next block
    hf.set_defaults(func=cmd_audit)

    ep = kinds.add_parser("endpoint", help="an OpenAI-compatible /v1/completions server")
    ep.add_argument("--base-url", help="e.g. http://127.0.0.1:8080 (omit with --serve-bundled)")
    ep.add_argument("--model", help="the request's model field (default with --serve-bundled: target)")
    ep.add_argument("--serve-bundled", action="store_true",
                    help="convert the bundled target to GGUF and serve it for this run: with llama-cpp-python "
                         "(--model target or target-lookup) or llama.cpp's llama-server (--model target-draft: "
                         "with the bundled draft, K=4; target-nodraft: without; `make llama-cpp` builds it)")
    ep.add_argument("--llama-cpp-neutral", action="store_true",
                    help="send top_k=0, min_p=0, repeat_penalty=1, ... (llama.cpp's own defaults are not neutral; "
                         "on by default with --serve-bundled)")
    ep.add_argument("--extra", default="{}", help="further request fields as JSON, e.g. '{\"top_k\": 0}'")
    ep.add_argument("--n-per-request", type=int, default=1, help="OpenAI's n")
    ep.add_argument("--logprobs", type=int, default=1, help="logprobs per token (-1: don't ask)")
    ep.add_argument("--server-label", default=None, help="name of the server in the table")
    ep.add_argument("--timeout", type=float, default=30.0)
    ep.add_argument("--retries", type=int, default=5)
    ep.add_argument("--max-rate", type=float, default=200.0, help="requests per second at most")
    ep.add_argument("--speculative", choices=["yes", "no", "unknown"], default="unknown",
                    help="does the server speculate? 'no': a reference row (no drafting required); 'yes'/'unknown': "
                         "equivalent only where its counters show drafting at a bounded position "
                         "(set by --serve-bundled)")
    ep.add_argument("--server-metrics", action="store_true",
                    help="read the server's Prometheus /metrics (vLLM, llama-server) around each batch")
    ep.add_argument("--drafting-rule", choices=["room", "uncapped"], default=None,
                    help="how the server's counters attribute drafts to token 2: 'room' (llama-server: exact at "
                         "L <= 3), 'uncapped' (vLLM: exact at L = 2); see specdec_lab.drafting")
    _pair_and_common_args(ep, samples=3000, length=3)  # llama-server's counters attribute token 2 exactly at L <= 3
    ep.set_defaults(func=cmd_audit)

    from specdec_lab.adapters.vllm import METHODS as VLLM_METHODS

    vl = kinds.add_parser("vllm", help="vLLM (CPU build in .venv-vllm): offline LLM.generate or vllm serve")
    vl.add_argument("--method", default="draft_model", choices=list(VLLM_METHODS))
    vl.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    path = vl.add_mutually_exclusive_group()
    path.add_argument("--offline", dest="serve", action="store_false", help="vllm.LLM.generate in a worker (default)")
    path.add_argument("--serve", dest="serve", action="store_true", help="vllm serve on loopback, via the endpoint adapter")
    vl.add_argument("--head", default=None, help="Medusa/EAGLE/EAGLE-3 head directory in vLLM's layout")
    vl.add_argument("--n-per-request", type=int, default=8, help="vLLM's n (completions per request)")
    vl.add_argument("--job-size", type=int, default=2048,
                    help="samples per LLM.generate call at most (fewer for long prompts, so that no seeded prefill "
                         "is split across engine steps: vLLM's CPU build crashes on it)")
    vl.add_argument("--patch", default=None, choices=["vllm-cpu-expand"],
                    help="opt-in fix of ours applied inside the worker (specdec_lab/patches; the installed vLLM files "
                         "stay as they are): vllm-cpu-expand gives the CPU expand_batch_to_tokens a float path")
    vl.add_argument("--concurrency", type=int, default=4, help="requests in flight (--serve)")
    _pair_and_common_args(vl, samples=3000, length=2)  # vLLM's counters attribute token 2 exactly at L = 2
    vl.set_defaults(func=cmd_audit, serve=False)

    from specdec_lab.adapters.openvino import METHODS as OPENVINO_METHODS, PIPELINES as OPENVINO_PIPELINES

    ov = kinds.add_parser("openvino", help="OpenVINO GenAI (CPU, in its own environment: `make openvino`)")
    ov.add_argument("--method", default="draft_model", choices=list(OPENVINO_METHODS))
    ov.add_argument("--pipeline", default="llm", choices=list(OPENVINO_PIPELINES),
                    help="LLMPipeline (one request per call; drafts counted per request) or ContinuousBatchingPipeline")
    ov.add_argument("--k", type=int, default=4, help="num_assistant_tokens")
    ov.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    ov.add_argument("--prefix-caching", choices=["default", "on", "off"], default="default",
                    help="SchedulerConfig.enable_prefix_caching (default: the pipeline's own; on for LLMPipeline with a "
                         "draft: docs/audit-openvino.md)")
    _pair_and_common_args(ov, samples=3000, length=3)  # OpenVINO's counters attribute token 2 exactly at L = 3
    ov.set_defaults(func=cmd_audit)

    from specdec_lab.adapters.ortgenai import METHODS as ORTGENAI_METHODS

    og = kinds.add_parser("ortgenai", help="ONNX Runtime GenAI (CPU, in its own environment: `make ortgenai`)")
    og.add_argument("--method", default="draft_model", choices=list(ORTGENAI_METHODS))
    og.add_argument("--k", type=int, default=4, help="speculative.max_draft_tokens")
    og.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    _pair_and_common_args(og, samples=3000, length=2)  # its counters place drafts at tokens 1 and 2 exactly at L = 2
    og.set_defaults(func=cmd_audit)

    from specdec_lab.cli.audit_mlx import add_mlx_parser

    add_mlx_parser(kinds, _pair_and_common_args)  # specdec-lab audit mlx
    kinds.choices["mlx"].set_defaults(func=cmd_audit)

    from specdec_lab.cli.audit_mistralrs import add_mistralrs_parser

    add_mistralrs_parser(kinds, _pair_and_common_args)  # specdec-lab audit mistralrs
    kinds.choices["mistralrs"].set_defaults(func=cmd_audit)

    from specdec_lab.cli.workload import add_workload_parser

    add_workload_parser(kinds)  # specdec-lab audit workload

    from specdec_lab.adapters.llamacpp import DRAFT_TOKENS

    ls = kinds.add_parser("llama-speculative", help="llama.cpp's llama-speculative example on the bundled pair "
                                                    "(one process per sample; `make llama-cpp` builds it)")
    ls.add_argument("--samples", type=int, default=2000)
    ls.add_argument("--length", type=int, default=DRAFT_TOKENS + 2)
    ls.add_argument("--temperature", type=float, default=1.0)
    ls.add_argument("--seed", type=int, default=0)
    ls.add_argument("--tolerance", type=float, default=0.02, help="ε of the equivalence verdict")
    ls.add_argument("--out", type=Path, required=True, help="sample file (parquet; resumes)")
    ls.set_defaults(func=cmd_llama_speculative)
    for name, parser in kinds.choices.items():  # every kind's --help states the exit status
        if name != "workload":
            parser.epilog, parser.formatter_class = EXIT_STATUS, argparse.RawDescriptionHelpFormatter


def _pair_and_common_args(parser, samples: int, length: int) -> None:
    from specdec_lab.models import add_pair_arguments

    add_pair_arguments(parser)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--scored-temperature", type=float, default=None,
                        help="score at this temperature instead (a negative control: must be rejected)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples (default: planned from the exact joint law of tokens 1-2 after the prompt, so a "
                             "correct engine is equivalent with probability 0.999; a negative control: "
                             f"{samples})")
    parser.add_argument("--length", type=int, default=length)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", default=None,
                        help=f"default {DEFAULT_PROMPT!r} ({LOOKUP_PROMPT!r} for prompt lookup)")
    parser.add_argument("--tolerance", type=float, default=0.02, help="ε of the equivalence verdict")
    parser.add_argument("--out", type=Path, default=None, help="sample file (default reports/audit/<name>.parquet)")
    parser.add_argument("--quiet", action="store_true")


def _sampler_from_args(args, sampling: SamplingConfig):
    from specdec_lab.adapters import llamacpp
    from specdec_lab.adapters.endpoint import LLAMA_CPP_NEUTRAL, LLAMA_SERVER_NEUTRAL, EndpointConfig
    from specdec_lab.adapters.hf import HFGenerateConfig

    if args.kind == "vllm" and not args.serve:
        from specdec_lab.adapters.vllm import VllmOfflineConfig

        return VllmOfflineConfig(method=args.method, sampling=sampling, k=args.k, draft=args.head,
                                 n_per_request=args.n_per_request, progress=not args.quiet, patch=args.patch,
                                 job_size=args.job_size)
    if args.kind == "openvino":
        from specdec_lab.adapters.openvino import OpenvinoConfig

        return OpenvinoConfig(method=args.method, pipeline=args.pipeline, sampling=sampling, k=args.k,
                              job_size=args.job_size, progress=not args.quiet,
                              prefix_caching={"default": None, "on": True, "off": False}[args.prefix_caching])
    if args.kind == "mlx":
        from specdec_lab.cli import audit_mlx

        return audit_mlx.sampler(args, sampling)
    if args.kind == "mistralrs":
        from specdec_lab.cli import audit_mistralrs

        return audit_mistralrs.sampler(args, sampling)
    if args.kind == "ortgenai":
        from specdec_lab.adapters.ortgenai import OrtGenaiConfig

        return OrtGenaiConfig(method=args.method, sampling=sampling, k=args.k, job_size=args.job_size,
                              progress=not args.quiet)
    if args.kind == "hf":
        return HFGenerateConfig(mode=args.mode, sampling=sampling, k=args.k, schedule=args.schedule,
                                confidence_threshold=args.confidence_threshold, progress=not args.quiet)
    llama_server = args.serve_bundled and args.model in llamacpp.SERVER_ALIASES
    neutral = LLAMA_SERVER_NEUTRAL if llama_server else LLAMA_CPP_NEUTRAL
    extra = dict(neutral) if (args.llama_cpp_neutral or args.serve_bundled) else {}
    extra.update(json.loads(args.extra))
    speculative, rule = (None if args.speculative == "unknown" else args.speculative == "yes"), args.drafting_rule
    if args.serve_bundled:  # the bundled aliases: which speculate, and where their drafts are counted
        speculative = args.model in ("target-lookup", "target-draft")
        rule = {"target-lookup": "lookup-calls", "target-draft": "room"}.get(args.model)
    return EndpointConfig(args.base_url, args.model, sampling, extra=tuple(sorted(extra.items())),
                          server_metrics=llama_server or args.server_metrics, speculative=speculative,
                          drafting_rule=rule,
                          n_per_request=args.n_per_request, logprobs=None if args.logprobs < 0 else args.logprobs,
                          server=args.server_label, timeout=args.timeout, retries=args.retries,
                          max_rate=args.max_rate, progress=not args.quiet)


def cmd_audit(args) -> int:
    """Run one audit from the command line; the exit status of :func:`_write_results`."""
    from specdec_lab.adapters import llamacpp
    from specdec_lab.adapters import vllm as vllm_adapter
    from specdec_lab.adapters import vllm_serve
    from specdec_lab.models import pair_from_args

    if args.kind == "vllm" and args.temperature == 0:
        return _greedy_vllm(args)
    if args.kind == "mlx" and args.table:
        from specdec_lab.cli import audit_mlx

        return audit_mlx.cmd_table(args)
    if args.kind == "mistralrs" and args.table:
        from specdec_lab.cli import audit_mistralrs

        return audit_mistralrs.cmd_table(args)
    if args.kind in CPU_ENGINES and args.temperature == 0:
        return _greedy_cpu_engine(args)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    scored_at = None if args.scored_temperature is None else \
        SamplingConfig(temperature=args.scored_temperature, top_k=args.top_k, top_p=args.top_p)
    expected = verdicts.LOSSLESS if scored_at is None else verdicts.NEGATIVE_CONTROL
    lookup = getattr(args, "mode", None) == "prompt_lookup" or getattr(args, "model", None) == "target-lookup" \
        or getattr(args, "method", None) in ("ngram", "prompt_lookup")
    args.prompt = args.prompt if args.prompt is not None else (LOOKUP_PROMPT if lookup else DEFAULT_PROMPT)
    pair = pair_from_args(args)
    if args.samples is None:
        if scored_at is not None:
            args.samples = NEGATIVE_CONTROL_SAMPLES
        else:
            args.samples = plan_audit_samples(pair, args.prompt, sampling, args.tolerance, seed=args.seed)
            print(f"planned m = {args.samples:,}: the joint bound on tokens 1-2 after {args.prompt!r} reaches "
                  f"ε = {args.tolerance:g} with probability 0.999 for a correct engine", flush=True)
    with contextlib.ExitStack() as stack:
        if args.kind == "endpoint":
            if args.serve_bundled:
                args.model = args.model or "target"
                server = stack.enter_context(llamacpp.bundled_server(model=args.model))
                args.base_url = server.base_url
                args.server_label = args.server_label or llamacpp.server_label(args.model)
            if not args.base_url or not args.model:
                raise ValueError("give --base-url and --model, or --serve-bundled")
        if args.kind == "vllm" and args.serve:
            server = stack.enter_context(vllm_serve.served(args.method, args.k, args.head, patch=args.patch))
            sampler = vllm_serve.endpoint_config(server, sampling, args.method, args.k, args.n_per_request,
                                                   args.concurrency, progress=not args.quiet, patch=args.patch)
        else:
            sampler = _sampler_from_args(args, sampling)
        out = args.out or Path("reports") / "audit" / f"{args.kind}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        result = audit(pair, sampler, args.samples, args.length, out, prompt=args.prompt, seed=args.seed,
                       scored_at=scored_at, expected=expected, settings=SuiteSettings(tolerance=args.tolerance),
                       progress=not args.quiet)
        if args.kind == "vllm":
            vllm_adapter.close_workers()
        if args.kind in CPU_ENGINES:
            _cpu_engine_module(args.kind).close_workers()
    row = result.summary()
    columns = ["implementation", "settings", "L", "m", "bounded positions", "TV upper 99%", "TV upper 99% (token 1)",
               "drafted share", "acceptance", "Holm p", "tokens/pass", "samples/s", "refused", "verdict"]
    columns[-1:-1] = [c for c in ("speculative steps", "drafted/step", "accepted/step", "engine errors",
                                  "engine messages") if c in row]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 70):
        print(result.tests()[["test", "statistic", "pvalue"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        print(pd.DataFrame([row])[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"\n{row['implementation']}: {row['in words']}\nsamples: {out}")
    print(f"bounded: TV of tokens {row['bounded positions']} ≤ {row['TV upper 99%']:.4f} at 99% "
          f"(token 1 alone, the plain-sampling control: ≤ {row['TV upper 99% (token 1)']:.4f}); drafted share "
          f"{row['drafted share']}, acceptance there {row['acceptance'] or 'n/a'} ({result.drafting.source or '—'}); "
          f"verdict: {row['verdict']}")
    return _write_results(result, out, args)


def _write_results(result, out: Path, args) -> int:
    """Write ``<out>.results.json`` beside the samples; the exit status of the row's call."""
    verdict = result.verdict_row()
    status = verdicts.expectation_status([verdict])
    settings = {key: value for key, value in vars(args).items() if key not in ("func",)}
    path = results.write(out.with_suffix(".results.json"),
                         results.document(f"audit {args.kind}", [verdict], settings=settings,
                                          models=result.samples.meta.get("models"), exit_status=status))
    print(f"results: {path}")
    return status


def _greedy_vllm(args) -> int:
    """T = 0: vLLM's speculative greedy output must equal its own non-speculative greedy output, token for token."""
    from specdec_lab.adapters import vllm as vllm_adapter
    from specdec_lab.models import pair_from_args

    pair = pair_from_args(args)
    check = vllm_adapter.greedy_check(args.method, pair.encode(args.prompt), args.length, args.k, args.head)
    vllm_adapter.close_workers()
    return _print_greedy(check, f"vLLM {vllm_adapter.VERSION} offline", args)


def _print_greedy(check: dict, label: str, args) -> int:
    """Both greedy outputs, the outcome in words; 0 when identical token for token, else 1."""
    for name in ("reference", "speculative"):
        print(f"{name:12s} {check[name]}")
    verdict = "identical" if check["identical"] else f"DIFFERS from token {check['first_difference']}"
    print(f"\n{label}, {args.method} K={args.k}, greedy, L={args.length}: {verdict}")
    return 0 if check["identical"] else 1


def _cpu_engine_module(kind: str):
    from specdec_lab.adapters import mistralrs, mlx, openvino, ortgenai

    return {"openvino": openvino, "ortgenai": ortgenai, "mlx": mlx, "mistralrs": mistralrs}[kind]


def _greedy_cpu_engine(args) -> int:
    """T = 0: OpenVINO GenAI's / ONNX Runtime GenAI's / mlx-lm's / mistral.rs's speculative greedy output must equal
    the same engine's plain greedy output, token for token."""
    from specdec_lab.models import pair_from_args

    engine = _cpu_engine_module(args.kind)
    pair = pair_from_args(args)
    lookup = args.method in ("ngram", "prompt_lookup")
    prompt = pair.encode(args.prompt if args.prompt is not None else (LOOKUP_PROMPT if lookup else DEFAULT_PROMPT))
    if args.kind == "openvino":
        check = engine.greedy_check(args.method, prompt, args.length, args.pipeline, args.k)
        label = f"OpenVINO GenAI {engine.VERSION} {args.pipeline}"
    else:
        check = engine.greedy_check(args.method, prompt, args.length, args.k)
        label = {"ortgenai": "ONNX Runtime GenAI", "mlx": "mlx-lm", "mistralrs": "mistral.rs"}[args.kind] + \
            f" {engine.VERSION}"
    engine.close_workers()
    return _print_greedy(check, label, args)


def cmd_llama_speculative(args) -> int:
    """``specdec-lab audit llama-speculative``: the per-test table and the summary row as JSON."""
    result = audit_llama_speculative(args.samples, args.length, args.out,
                                     SamplingConfig(temperature=args.temperature), seed=args.seed,
                                     tolerance=args.tolerance)
    print(result.tests()[["test", "statistic", "pvalue"]].to_string(index=False))
    print(json.dumps(result.summary(), default=str, indent=1))
    return _write_results(result, args.out, args)
