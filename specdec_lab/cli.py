"""``specdec-lab`` command line: ``verify`` (the main job) and ``collect``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def _pair_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="Hugging Face id or local path of the target (default: bundled)")
    parser.add_argument("--draft", help="Hugging Face id or local path of the draft (default: bundled)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default: cpu)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow model code from the hub (off by default)")


def _load(args):
    from specdec_lab.models import load_pair

    if (args.target is None) != (args.draft is None):
        raise SystemExit("error: give both --target and --draft, or neither (bundled models)")
    if args.target is None:
        return load_pair("bundled", device=args.device)
    return load_pair(target=args.target, draft=args.draft, device=args.device,
                     trust_remote_code=args.trust_remote_code)


def cmd_verify(args) -> int:
    from specdec_lab.verify import VerifyOptions, run_verify

    options = VerifyOptions(scale=args.scale, k=args.k, temperature=args.temperature,
                            low_temperature=args.low_temperature, top_p=args.top_p, top_k=args.top_k,
                            samples=args.samples, seed=args.seed, prompt=args.prompt, out=args.out,
                            progress=not args.quiet)
    pair = _load(args)
    print(f"specdec-lab verify: {pair.identity['pair']} on {pair.device}, scale {args.scale}", flush=True)
    result = run_verify(pair, options)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 90):
        columns = ["sampler", "expected", "m", "exact TV (2 tokens)", "TV plug-in", "TV upper 99%",
                   "KL (MM)", "Holm p", "verdict"]
        print(result["table"][["sampler", "test", "statistic", "pvalue", "tv_plugin", "tv_upper",
                               "kl_mm", "verdict"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        print(result["summary"][columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        for _, row in result["summary"].iterrows():
            print(f"  {row['sampler']}: {row['in words']}")
    print(f"\nreport: {result['folder'] / 'report.md'}")
    print("PASS: every lossless sampler equivalent, every negative control rejected" if result["passed"]
          else "FAIL: some verdict is not the expected one (see the 'correct call' column)")
    return 0 if result["passed"] else 1


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
        sampler = SpeculativeConfig(k=args.k, sampling=sampling, verifier=verifier)
    pair = _load(args)
    samples = collect(pair, sampler, args.prompt, args.samples, args.length, args.seed, args.out,
                      batch_size=args.batch_size)
    print(f"{args.out}: {len(samples.frame)} samples; stats {samples.meta.get('stats')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from specdec_lab.verify import DEFAULT_PROMPT, SCALES

    parser = argparse.ArgumentParser(prog="specdec-lab", description="Prove speculative decoding is lossless.")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verify", help="the main job: every sampler, every test, one report")
    _pair_args(v)
    v.add_argument("--scale", default="default", choices=sorted(SCALES))
    v.add_argument("--k", type=int, default=4, help="draft tokens per target pass")
    v.add_argument("--temperature", type=float, default=1.0)
    v.add_argument("--low-temperature", type=float, default=0.7)
    v.add_argument("--top-k", type=int, default=None)
    v.add_argument("--top-p", type=float, default=0.9, help="the top-p case's nucleus mass")
    v.add_argument("--samples", type=int, default=None, help="samples per lossless sampler")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--prompt", default=DEFAULT_PROMPT)
    v.add_argument("--out", type=Path, default=Path("reports"))
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=cmd_verify)

    c = sub.add_parser("collect", help="collect samples from one sampler into a parquet file")
    _pair_args(c)
    c.add_argument("--sampler", default="leviathan",
                   help="naive, leviathan, point_mass or a faulty variant name")
    c.add_argument("--k", type=int, default=4)
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

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad settings and load errors: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
