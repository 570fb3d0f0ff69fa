"""``specdec-lab audit mistralrs``: mistral.rs 0.6.0 on CPU, one row, or ``--table``: the rows of
docs/audit-mistralrs.md.

One row runs through :func:`specdec_lab.cli.audit.cmd_audit` like every engine kind (``<out>.results.json``); T = 0
compares mistral.rs's speculative greedy tokens with its own plain greedy tokens. ``--table`` runs every row of the
page (:data:`TABLE`) and writes one results document whose ``columns`` the page's results block renders
(``make docs``). Each row states its planned m (the size at which a correct engine's joint bound reaches ε with
probability 0.999) beside the m it ran: the plain rows run at a fixed size that shows they are not rejected, the
speculative rows at the size that rejects them (docs/audit-mistralrs.md says why the planned sizes were not run).
"""

from __future__ import annotations

import time
from pathlib import Path

from specdec_lab import verdicts
from specdec_lab.adapters.mistralrs import VERSION
from specdec_lab.audit import NEGATIVE_CONTROL_SAMPLES, audit, plan_audit_samples
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings
from specdec_lab.cli.audit_mlx import write_table

# The page's rows: (method, asked, scored at, expected, m). The plain rows (the same engine without speculation) and
# the negative control run at the negative control's size; the speculative rows at 1,000: their law is a point mass
# (docs/audit-mistralrs.md), rejected at any of these sizes.
PLAIN, SPECULATIVE = NEGATIVE_CONTROL_SAMPLES, 1000
PAGE = "docs/audit-mistralrs.md"
SETTINGS = (SamplingConfig(), SamplingConfig(temperature=0.7), SamplingConfig(top_p=0.9), SamplingConfig(top_k=20))
TABLE = (tuple(("none", s, None, verdicts.LOSSLESS, PLAIN) for s in SETTINGS)
         + tuple(("draft_model", s, None, verdicts.LOSSLESS, SPECULATIVE) for s in SETTINGS)
         + (("none", SamplingConfig(temperature=0.7), SamplingConfig(), verdicts.NEGATIVE_CONTROL, PLAIN),))
COLUMNS = [["method", "method"], ["settings", "settings"], ["m", "m"], ["planned m", "planned m"],
           ["TV upper 99% (tokens 1–2)", "tv_upper", ".4f"], ["token 1", "TV upper 99% (token 1)", ".4f"],
           ["drafted share", "drafted share"], ["Holm p", "holm_p", ".3g"], ["refused", "refused"],
           ["samples/s", "samples/s", ".0f"], ["expected", "expected"], ["verdict", "verdict"]]


def readme_cells(row: verdicts.Verdict) -> dict:
    """The cells the README's engines view reads (specdec_lab.report.docs.engine_row)."""
    d = row.details
    verdict = f"**{row.verdict}**" if row.verdict in (verdicts.REJECTED, verdicts.EQUIVALENT) else row.verdict
    return {"method": f"mistral.rs {VERSION} {d['method']}", "settings": d["settings"], "m": f"{row.m:,}",
            "TV upper 99% (tokens 1–2)": f"{row.tv_upper:.4f}", "token 1": f"{d['TV upper 99% (token 1)']:.4f}",
            "drafted share": d["drafted share"], "verdict": verdict}


def add_mistralrs_parser(kinds, common) -> None:
    """Add ``specdec-lab audit mistralrs`` to the audit kinds; ``common(parser, samples, length)`` adds the shared
    arguments."""
    from specdec_lab.adapters.mistralrs import METHODS

    mr = kinds.add_parser("mistralrs", help="mistral.rs 0.6.0 (CPU, in its own environment: `make mistralrs`)")
    mr.add_argument("--method", default="draft_model", choices=list(METHODS))
    mr.add_argument("--k", type=int, default=1,
                    help="speculative_gamma (>= 2 finishes no request on 0.6.0: docs/audit-mistralrs.md)")
    mr.add_argument("--job-size", type=int, default=500, help="requests per worker job")
    mr.add_argument("--table", action="store_true",
                    help="run every row of docs/audit-mistralrs.md and write one results document (--out: its "
                         "samples' folder; the document is <out>/results.json)")
    # its speculative pipeline drafts every token it emits, the first included: tokens 1 and 2 at L = 2
    common(mr, samples=NEGATIVE_CONTROL_SAMPLES, length=2)


def refuse_resume(path: Path) -> None:
    """Raise ValueError when ``path`` is a collection left unfinished (its ``.parts`` folder): the engine's unseeded
    stream restarts in a new process, so resuming would repeat its first draws. A finished file is only reloaded."""
    if Path(f"{path}.parts").exists():
        raise ValueError(f"{path} is an unfinished collection: a mistral.rs collection cannot resume (its sampler "
                         "takes no seed); give a new --out")


def sampler(args, sampling: SamplingConfig):
    """The row's :class:`~specdec_lab.adapters.mistralrs.MistralrsConfig` (:func:`refuse_resume` on ``--out``)."""
    from specdec_lab.adapters.mistralrs import MistralrsConfig

    if args.out is not None:
        refuse_resume(args.out)
    return MistralrsConfig(method=args.method, sampling=sampling, gamma=args.k, job_size=args.job_size,
                           progress=not args.quiet)


def cmd_table(args) -> int:
    """Run :data:`TABLE`; write ``<out>/results.json``; the exit status of the rows' calls."""
    from specdec_lab.adapters import mistralrs
    from specdec_lab.audit import DEFAULT_PROMPT
    from specdec_lab.models import pair_from_args

    pair = pair_from_args(args)
    prompt = args.prompt or DEFAULT_PROMPT
    out = args.out or Path("reports") / "audit" / f"mistralrs-table-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (method, sampling, scored_at, expected, size) in enumerate(TABLE):
        config = mistralrs.MistralrsConfig(method=method, sampling=sampling, gamma=args.k, job_size=args.job_size,
                                           progress=not args.quiet)
        plan = plan_audit_samples(pair, prompt, scored_at or sampling, args.tolerance, seed=args.seed)
        refuse_resume(out / f"row{i}.parquet")
        result = audit(pair, config, args.samples or size, args.length, out / f"row{i}.parquet", prompt=prompt,
                       seed=args.seed, scored_at=scored_at, expected=expected,
                       settings=SuiteSettings(tolerance=args.tolerance), progress=not args.quiet)
        row = result.verdict_row()
        row.details.update({"method": method if method == "none" else f"{method} gamma={args.k}",
                            "planned m": plan})
        row.details["cells"] = readme_cells(row)
        rows.append(row)
        print(f"{row.sampler} · {row.details['settings']}: m = {row.m:,} (planned {plan:,}), TV ≤ "
              f"{row.tv_upper:.4f}, {row.details['drafted share']}, {row.verdict} ({expected})", flush=True)
    mistralrs.close_workers()
    return write_table("audit mistralrs --table", rows, args, pair, out, COLUMNS, PAGE)
