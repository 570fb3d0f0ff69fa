"""``specdec-lab audit mlx``: mlx-lm on MLX's CPU backend, one row, or ``--table``: the rows of docs/audit-mlx.md.

One row runs through :func:`specdec_lab.cli.audit.cmd_audit` like every engine kind (``<out>.results.json``); T = 0
compares mlx-lm's speculative greedy tokens with its own plain greedy tokens. ``--table`` runs every row of the
page (:data:`TABLE`) at the planned sample sizes and writes one results document whose ``columns`` the page's
results block renders (``make docs``).
"""

from __future__ import annotations

import time
from pathlib import Path

from specdec_lab import results, verdicts
from specdec_lab.audit import NEGATIVE_CONTROL_SAMPLES, audit, plan_audit_samples
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

# The page's rows: (method, asked, min-p, repetition penalty, scored at, expected, m: None = planned). Filters at
# T = 1, where mlx-lm's order (filters on the untempered law, then temperature: sampling.ORDERS["mlx-lm"]) and HF's
# agree. The penalty rows (no prompt cache: ≈ 2.5× the time a request) run at the negative control's size: enough to
# reject the speculative one (TV ≈ 0.19) and to show the plain one is not rejected.
FIXED = NEGATIVE_CONTROL_SAMPLES
TABLE = (
    ("draft_model", SamplingConfig(), 0.0, 1.0, None, verdicts.LOSSLESS, None),
    ("draft_model", SamplingConfig(temperature=0.7), 0.0, 1.0, None, verdicts.LOSSLESS, None),
    ("draft_model", SamplingConfig(top_p=0.9), 0.0, 1.0, None, verdicts.LOSSLESS, None),
    ("draft_model", SamplingConfig(top_k=20), 0.0, 1.0, None, verdicts.LOSSLESS, None),
    ("draft_model", SamplingConfig(), 0.1, 1.0, None, verdicts.LOSSLESS, None),
    ("draft_model", SamplingConfig(), 0.0, 1.3, None, verdicts.LOSSLESS, FIXED),
    ("none", SamplingConfig(), 0.0, 1.3, None, verdicts.LOSSLESS, FIXED),  # the same chain without speculation
    ("draft_model", SamplingConfig(temperature=0.7), 0.0, 1.0, SamplingConfig(), verdicts.NEGATIVE_CONTROL, FIXED),
)
PAGE = "docs/audit-mlx.md"  # the page whose table this document is (the README's engine rows link it)
# "acceptance (token 2)": mlx-lm's own count of accepted drafts at token 2 (from_draft); "exact Σ p·q": what its
# equality rule must accept there, from the local pair's exact laws (mlx.exact_acceptance; rows without min-p/penalty)
COLUMNS = [["method", "method"], ["settings", "settings"], ["m", "m"],
           ["TV upper 99% (tokens 1–2)", "tv_upper", ".4f"],
           ["token 1", "TV upper 99% (token 1)", ".4f"], ["drafted share", "drafted share"],
           ["acceptance (token 2)", "accepted share@2", ".4f"], ["exact Σ p·q", "exact acceptance@2", ".4f"],
           ["Holm p", "holm_p", ".3g"], ["samples/s", "samples/s", ".0f"],
           ["expected", "expected"], ["verdict", "verdict"]]


def add_mlx_parser(kinds, common) -> None:
    """Add ``specdec-lab audit mlx`` to the audit kinds; ``common(parser, samples, length)`` adds the shared
    arguments."""
    from specdec_lab.adapters.mlx import METHODS, REPETITION_CONTEXT

    mx = kinds.add_parser("mlx", help="mlx-lm (MLX's CPU backend, in its own environment: `make mlx`)")
    mx.add_argument("--method", default="draft_model", choices=list(METHODS))
    mx.add_argument("--k", type=int, default=4, help="num_draft_tokens")
    mx.add_argument("--min-p", type=float, default=0.0, help="make_sampler's min_p (0: off)")
    mx.add_argument("--repetition-penalty", type=float, default=1.0, help="make_logits_processors' (1: off)")
    mx.add_argument("--repetition-context-size", type=int, default=REPETITION_CONTEXT)
    mx.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    mx.add_argument("--table", action="store_true",
                    help="run every row of docs/audit-mlx.md and write one results document (--out: its samples' "
                         "folder; the document is <out>/results.json)")
    # mlx-lm drafts tokens 1 and 2 in every request at k >= 2, and min-p/penalty rows are scored on two tokens
    common(mx, samples=NEGATIVE_CONTROL_SAMPLES, length=2)


def sampler(args, sampling: SamplingConfig):
    from specdec_lab.adapters.mlx import MlxConfig

    return MlxConfig(method=args.method, sampling=sampling, k=args.k, min_p=args.min_p,
                     repetition_penalty=args.repetition_penalty, repetition_context=args.repetition_context_size,
                     job_size=args.job_size, progress=not args.quiet)


def planned(pair, prompt: str, sampling: SamplingConfig, tolerance: float, seed: int) -> int:
    """A row's planned m: the plan of its sampling's joint law (the min-p row: the plan of its T = 1 law, whose
    spread min-p narrows)."""
    return plan_audit_samples(pair, prompt, sampling, tolerance, seed=seed)


def cmd_table(args) -> int:
    """Run :data:`TABLE`; write ``<out>/results.json``; the exit status of the rows' calls."""
    from specdec_lab.adapters import mlx
    from specdec_lab.audit import DEFAULT_PROMPT
    from specdec_lab.models import pair_from_args

    pair = pair_from_args(args)
    prompt = args.prompt or DEFAULT_PROMPT
    out = args.out or Path("reports") / "audit" / f"mlx-table-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (method, sampling, min_p, penalty, scored_at, expected, size) in enumerate(TABLE):
        config = mlx.MlxConfig(method=method, sampling=sampling, k=args.k, min_p=min_p, repetition_penalty=penalty,
                               job_size=args.job_size, progress=not args.quiet)
        m = args.samples or size or planned(pair, prompt, sampling, args.tolerance, args.seed)
        result = audit(pair, config, m, args.length, out / f"row{i}.parquet", prompt=prompt, seed=args.seed,
                       scored_at=scored_at, expected=expected, settings=SuiteSettings(tolerance=args.tolerance),
                       progress=not args.quiet)
        row = result.verdict_row()
        row.details["method"] = method if method == "none" else f"{method} K={args.k}"
        stats = result.samples.meta["stats"]
        if method != "none":  # the acceptance mlx-lm's equality rule must show, from the exact laws (filters only)
            row.details["accepted share@2"] = stats["accepted@2"] / stats["drafted@2"]
            if not config.chained:
                row.details["exact acceptance@2"] = mlx.exact_acceptance(pair, pair.encode(prompt), sampling)[1]
        rows.append(row)
        print(f"{row.sampler} · {row.details['settings']}: m = {row.m:,}, TV ≤ {row.tv_upper:.4f}, "
              f"{row.details['drafted share']}, {row.verdict} ({expected})", flush=True)
    mlx.close_workers()
    return write_table("audit mlx --table", rows, args, pair, out, COLUMNS, PAGE)


def write_table(command: str, rows: list, args, pair, out: Path, columns: list, page: str) -> int:
    """Write a ``--table`` run's ``results.json`` (its rows, settings, models, the page it feeds) into ``out``; return
    the exit status of its expectations (:func:`specdec_lab.verdicts.expectation_status`)."""
    status = verdicts.expectation_status(rows)
    settings = {key: str(value) for key, value in vars(args).items() if key != "func"}
    path = results.write(out / "results.json", results.document(
        command, rows, settings=settings, models=results.model_identity(pair), exit_status=status,
        extra={"columns": columns, "page": page}))
    print(f"results: {path}")
    return status
