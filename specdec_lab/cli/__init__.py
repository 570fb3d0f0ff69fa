"""``specdec-lab`` command line: ``verify`` (the main job), ``collect``, ``calibrate`` and ``audit``.

Exit status, the same for every command (:mod:`specdec_lab.verdicts`): 0 certified, 1 rejected or failed (a
wrong call, or an engine that failed), 3 inconclusive, 2 usage and input errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from specdec_lab.adapters.endpoint import EndpointError
from specdec_lab.adapters.vllm import VllmError
from specdec_lab.models import add_pair_arguments, pair_from_args
from specdec_lab.verdicts import EXIT_REJECTED, EXIT_USAGE


def cmd_verify(args) -> int:
    from specdec_lab.report.verify_report import overall_line
    from specdec_lab.verify import VerifyOptions, run_verify

    options = VerifyOptions(scale=args.scale, k=args.k, temperature=args.temperature,
                            low_temperature=args.low_temperature, top_p=args.top_p, top_k=args.top_k,
                            samples=args.samples, seed=args.seed, prompt=args.prompt, out=args.out,
                            progress=not args.quiet, length=args.length, workers=args.workers)
    pair = pair_from_args(args)
    print(f"specdec-lab verify: {pair.identity['pair']} on {pair.device}, scale {args.scale}", flush=True)
    result = run_verify(pair, options)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 90):
        columns = ["sampler", "expected", "m", "L", "exact TV (2 tokens)", "TV plug-in", "TV upper 99%", "route",
                   "TV upper 99% (2 tokens)", "independence p", "Holm p", "verdict"]
        print(result["table"][["sampler", "test", "statistic", "pvalue", "tv_upper", "tv_upper_joint",
                               "verdict"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        print(result["summary"][columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        for _, row in result["summary"].iterrows():
            print(f"  {row['sampler']}: {row['in words']}")
    print(f"\nreport: {result['folder'] / 'report.md'}\nresults: {result['folder'] / 'results.json'}")
    print(overall_line(result["status"]))
    return result["status"]


def cmd_collect(args) -> int:
    from specdec_lab.collect import collect
    from specdec_lab.sampling import SamplingConfig
    from specdec_lab.samplers import faulty
    from specdec_lab.samplers.naive import NaiveConfig
    from specdec_lab.samplers.rules import LOSSLESS
    from specdec_lab.samplers.speculative import SpeculativeConfig

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.sampler == "naive":
        sampler = NaiveConfig(sampling)
    else:
        verifier = LOSSLESS.get(args.sampler) or faulty.get(args.sampler)
        sampler = SpeculativeConfig(k=args.k, sampling=sampling, verifier=verifier, trim=args.trim)
    pair = pair_from_args(args)
    samples = collect(pair, sampler, args.prompt, args.samples, args.length, args.seed, args.out,
                      batch_size=args.batch_size)
    print(f"{args.out}: {len(samples.frame)} samples; stats {samples.meta.get('stats')}")
    return 0



def _measured_alpha(path: Path) -> float:
    from specdec_lab.collect import load_samples

    meta = load_samples(path).meta
    stats = meta.get("stats") or {}
    if "acceptance" not in stats:
        raise ValueError(f"{path} holds no measured acceptance (sampler {meta['sampler'].get('sampler')!r}); "
                         "collect samples from a speculative sampler")
    print(f"measured α = {stats['acceptance']:.4f} from {path} ({stats['accepted_drafts']:,} of "
          f"{stats['evaluated_drafts']:,} draft tokens accepted at K = {stats['k']})")
    return float(stats["acceptance"])


def cmd_calibrate(args) -> int:
    from specdec_lab import theory

    if (args.alpha is None) == (args.samples is None):
        raise ValueError("give exactly one of --alpha (a measured acceptance rate) and --samples (a parquet "
                         "file from `specdec-lab collect`)")
    models = (args.model, args.draft_model, args.hardware)
    if any(models) and not all(models):
        raise ValueError("--model, --draft-model and --hardware go together (c comes from their roofline)")
    if (args.c is None) == (not any(models)):
        raise ValueError("give either --c (draft/target cost ratio) or --model/--draft-model/--hardware, not "
                         "both and not neither")
    alpha = args.alpha if args.samples is None else _measured_alpha(args.samples)
    if any(models):
        target = theory.decode_roofline(args.model, args.hardware, args.batch, args.context)
        draft = theory.decode_roofline(args.draft_model, args.hardware, args.batch, args.context)
        c = draft.step_time_s / target.step_time_s
        for name, r in (("target", target), ("draft", draft)):
            print(f"{name} {r.model} on {r.hardware}, batch {r.batch}, context {r.context}: "
                  f"{r.bytes_moved / 1e9:.3g} GB per step, {r.step_time_s * 1e3:.3g} ms ({r.bound}-bound), "
                  f"≤ {r.tokens_per_s:,.1f} tokens/s")
        print(f"c = draft step / target step = {c:.4g}")
    else:
        c = args.c
    table = theory.speedup_table(alpha, c, args.k_max)
    if any(models):
        table["roofline speedup"] = [theory.roofline_speedup(alpha, int(k), args.model, args.draft_model,
                                                             args.hardware, args.batch, args.context)
                                     for k in table["K"]]
    print(f"α = {alpha:.4g}, c = {c:.4g}\n")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    best = table.loc[table["best"]].iloc[0]
    if int(best["K"]) == 0:
        print(f"\nbest K = 0: do not speculate — at α = {alpha:.3g} the draft costs more than it saves")
    else:
        print(f"\nbest K = {int(best['K'])}: {best['tokens/pass']:.3f} tokens per target pass, "
              f"expected speedup {best['speedup']:.3f}×")
    if args.plot is not None:
        from specdec_lab.report import plot_speedup

        plot_speedup(table, args.plot, title=f"Expected speedup at α = {alpha:.3g}, c = {c:.3g}")
        print(f"figure: {args.plot}")
    return 0

def main(argv: list[str] | None = None) -> int:
    from specdec_lab.verify import DEFAULT_PROMPT, SCALES

    parser = argparse.ArgumentParser(prog="specdec-lab", description="Prove speculative decoding is lossless.")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verify", help="the main job: every sampler, every test, one report")
    add_pair_arguments(v)
    v.add_argument("--scale", default="default", choices=sorted(SCALES))
    v.add_argument("--k", type=int, default=4, help="draft tokens per target pass")
    v.add_argument("--temperature", type=float, default=1.0)
    v.add_argument("--low-temperature", type=float, default=0.7)
    v.add_argument("--top-k", type=int, default=None)
    v.add_argument("--top-p", type=float, default=0.9, help="the top-p case's nucleus mass")
    v.add_argument("--samples", type=int, default=None,
                   help="samples per lossless sampler (default: planned per row from the exact laws)")
    v.add_argument("--workers", type=int, default=None,
                   help="processes running rows side by side (default: one per core up to 4 on a CPU, 1 on a GPU)")
    v.add_argument("--length", type=int, default=None,
                   help="new tokens per sample for every row (default: each row's window, K + 2 for "
                        "speculative rows so every draft position and the bonus token are tested)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--prompt", default=DEFAULT_PROMPT)
    v.add_argument("--out", type=Path, default=Path("reports"))
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=cmd_verify)

    c = sub.add_parser("collect", help="collect samples from one sampler into a parquet file")
    add_pair_arguments(c)
    c.add_argument("--sampler", default="leviathan",
                   help="naive, leviathan, point_mass, block or a faulty variant name")
    c.add_argument("--k", type=int, default=4)
    c.add_argument("--trim", action="store_true",
                   help="draft min(K, r - 1) tokens when r are missing: less work, the same law for a "
                        "lossless rule (a faulty rule's law then depends on --length)")
    c.add_argument("--temperature", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=None)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--samples", type=int, default=10_000)
    c.add_argument("--length", type=int, default=8)
    c.add_argument("--batch-size", type=int, default=1024)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--prompt", default=DEFAULT_PROMPT)
    c.add_argument("--out", type=Path, required=True)
    c.set_defaults(func=cmd_collect)

    k = sub.add_parser("calibrate", help="speedup over K from a measured acceptance rate, and the best K")
    k.add_argument("--alpha", type=float, help="per-token acceptance rate α")
    k.add_argument("--samples", type=Path, help="a speculative sample file; its measured α is used")
    k.add_argument("--c", type=float, help="cost of a draft pass relative to a target pass")
    k.add_argument("--model", help="target preset or HF id, with --draft-model/--hardware: c from the roofline")
    k.add_argument("--draft-model", help="draft preset or HF id")
    k.add_argument("--hardware", help="accelerator, e.g. h100-sxm5")
    k.add_argument("--batch", type=int, default=1, help="sequences decoded together (roofline)")
    k.add_argument("--context", type=int, default=0, help="tokens in each KV cache (roofline)")
    k.add_argument("--k-max", type=int, default=10, help="largest K in the table")
    k.add_argument("--plot", type=Path, help="write a seaborn figure of the speedup curve here")
    k.set_defaults(func=cmd_calibrate)

    from specdec_lab.cli.audit import add_audit_parser

    add_audit_parser(sub)  # specdec-lab audit hf|endpoint

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad settings and load errors: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EndpointError, VllmError) as exc:  # the engine refused or crashed: a finding, its own message
        print(f"engine error: {exc}", file=sys.stderr)
        return EXIT_REJECTED

