"""Each cell's evidence and verdict: the exact-law tests, the drafting evidence, Holm across cells, the plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from specdec_lab import drafting as drafting_
from specdec_lab import stats, verdicts
from specdec_lab.laws.workload import LawBook
from specdec_lab.suite import SuiteSettings, run_suite, scores_from_law
from specdec_lab.workload.cells import Cell, Workload


# How a token cell's completion ended, by kind (the counts the table shows; see :func:`token_outcome`)
ENDINGS = ("2 tokens", "EOS at 1", "EOS at 2", "text", "choice", "cut short", "stop without EOS", "unmapped",
           "impossible text")
IMPOSSIBLE = ("cut short", "stop without EOS", "unmapped", "impossible text")  # endings of probability 0


@dataclass
class CellResult:
    """One cell's evidence and verdict.

    ``m`` counts every answered completion: each is an outcome of the cell's law (tokens 1–2 and how the
    completion ended), the impossible ones included (``endings``); nothing answered is left out. ``errors``
    counts the requests the server failed (or answered without choices).
    """

    cell: Cell
    requests: int
    errors: int
    error_example: str
    refused: str | None
    m: int
    endings: dict = field(default_factory=dict)  # kind of ending -> completions (ENDINGS; text cells: {})
    pvalue: float = float("nan")
    tv_upper: float = float("nan")
    tv_plugin: float = float("nan")
    rejected_by: str = ""
    drafting: drafting_.Drafting = field(default_factory=lambda: drafting_.Drafting(False))
    holm_p: float = float("nan")
    verdict: str = ""
    confidence: float = 0.99  # of this cell's TV bound (the run's level split across its cells and looks)
    look: int = 1  # which look at the cell this is (specdec_lab.workload.sequential)
    alpha: float = 0.01  # the level this look may reject at (spent from the run's α)
    family_wise: bool = False  # pvalue already family-wise (the sequential e-process, Bonferroni): no Holm step
    outcomes: np.ndarray | None = None  # (m,) each answered completion's outcome, in arrival order
    outcome_counts: np.ndarray | None = None  # (outcomes + 1,) counts over the cell's outcomes (the last: impossible)
    outcome_law: np.ndarray | None = None  # (outcomes + 1,) their exact law

    @property
    def impossible(self) -> int:
        return sum(self.endings.get(kind, 0) for kind in IMPOSSIBLE)

    def endings_text(self) -> str:
        """The nonzero ending counts, e.g. ``'2 tokens 980, EOS at 2 12, cut short 8'``."""
        return ", ".join(f"{kind} {self.endings[kind]}" for kind in ENDINGS if self.endings.get(kind))

    def row(self) -> dict:
        d = self.drafting.columns()
        return {"cell": self.cell.name, "group": self.cell.group, "settings": self.cell.label(),
                "bounded": bounded(self.cell),
                "requests": self.requests, "errors": self.errors, "m": self.m, "endings": self.endings_text(),
                "TV upper": self.tv_upper, "Holm p": self.holm_p, "drafted share": d["drafted share"],
                "acceptance": d["acceptance"], "look": self.look, "verdict": self.verdict}

    def verdict_row(self, tolerance: float) -> verdicts.Verdict:
        details = {key: value for key, value in self.row().items() if key not in ("cell", "m", "TV upper", "Holm p",
                                                                                    "verdict")}
        details.update({"endings_counts": dict(self.endings), "confidence": self.confidence,
                        "rejected_by": self.rejected_by, "cell_settings": self.cell.describe()})
        return verdicts.Verdict(self.cell.name, self.verdict, self.m, self.tv_upper, self.holm_p, tolerance,
                                details=details)


def bounded(cell: Cell) -> str:
    """What a cell's verdict bounds, in a few words."""
    if cell.structured:
        return "completed choice"
    return "text of 1–2" if cell.observes_text else "tokens 1–2 + ending"


def token_outcome(tokens: list, finish: str, request_tokens: int, eos: int | None) -> tuple[str, tuple | None]:
    """(kind of ending, (x1, x2)) of one token-cell completion; (x1, x2) is None for an impossible ending.

    An ending by EOS is an outcome with its exact probability: EOS at token 1 is (EOS, EOS) — the row x1 = EOS of
    the joint law collapsed into one cell (:func:`collapse_eos`) — and EOS at token 2 is (x1, EOS). A server may
    return the EOS id or leave it out: a ``stop`` before ``request_tokens`` is read as EOS at the next position (a
    token cell has no stop strings). Impossible (probability 0, so it rejects): ``stop`` before token 2 when the
    tokenizer has no EOS, ``length`` before ``request_tokens`` (cut short), and an answer that does not map to tokens.

    >>> token_outcome([5, 7, 9], "length", 3, 0), token_outcome([5], "stop", 3, 0), token_outcome([], "stop", 3, 0)
    (('2 tokens', (5, 7)), ('EOS at 2', (5, 0)), ('EOS at 1', (0, 0)))
    >>> token_outcome([5], "length", 3, 0), token_outcome([5], "stop", 3, None), token_outcome(None, "length", 3, 0)
    (('cut short', None), ('stop without EOS', None), ('unmapped', None))
    """
    if tokens is None:
        return "unmapped", None
    ids = [int(t) for t in tokens]
    if eos is not None and eos in ids:
        ids, finish = ids[: ids.index(eos)], "stop"  # what follows an EOS is not generated
    if finish == "length" and len(ids) < request_tokens:
        return "cut short", None
    if len(ids) >= 2:
        return "2 tokens", (ids[0], ids[1])
    if finish != "stop":
        return "cut short", None
    if eos is None:
        return "stop without EOS", None
    return ("EOS at 1", (eos, eos)) if not ids else ("EOS at 2", (ids[0], eos))


def collapse_eos(joint: np.ndarray, vocab_size: int, eos: int | None) -> np.ndarray:
    """The law (V * V,) of :func:`token_outcome`'s pairs: the joint law of tokens 1–2 with the row x1 = EOS (the
    completion ends at token 1) moved into the one cell (EOS, EOS).

    >>> collapse_eos(np.array([0.1, 0.2, 0.3, 0.4]), 2, 0).tolist()
    [0.30000000000000004, 0.0, 0.3, 0.4]
    """
    if eos is None:
        return joint
    law = joint.copy()
    row = slice(eos * vocab_size, (eos + 1) * vocab_size)
    ended = law[row].sum()
    law[row] = 0.0
    law[eos * vocab_size + eos] = ended
    return law


def judge_categorical(counts: np.ndarray, law: np.ndarray, settings: SuiteSettings,
                      rng: np.random.Generator) -> tuple[float, float, float, str]:
    """(p-value, TV upper bound, TV plug-in, rejecting test) of counts over outcomes against their exact law."""
    m = int(counts.sum())
    impossible = int(counts[law <= 0].sum())
    plugin = 0.5 * float(np.abs(counts / m - law).sum())
    if impossible:
        return 0.0, 1.0, plugin, f"{impossible} outcome(s) of probability 0"
    if int((law > 0).sum()) == 1:  # a point mass: m hits of it bound TV by Clopper–Pearson
        return 1.0, 1.0 - (1.0 - settings.confidence) ** (1.0 / m), 0.0, ""
    tests = {"ADK": stats.adk_identity(counts, law, n_resamples=settings.n_resamples, rng=rng).pvalue,
             "G": stats.chisquare_identity(counts, law, statistic="g", rng=rng).pvalue}
    holm = stats.holm(list(tests.values()), settings.alpha)
    bound = stats.tv_upper_bound(counts, law, confidence=settings.confidence)
    worst = min(tests, key=tests.get)
    return holm.pvalue, bound.upper, plugin, worst if holm.pvalue < settings.alpha else ""


def cell_drafting(frame: pd.DataFrame, m: int, max_tokens: int, speculative: bool,
                  whole: bool = False) -> drafting_.Drafting:
    """Where the server drafted within tokens 1–2, from its per-request ``timings.draft_n`` (llama-server): with
    ``max_tokens = 3`` a request drafts at most one token, for position 2 (``get_n_draft_max``); with 2 none.
    ``whole``: the verdict bounds the whole completion (a choice cell), so a request with any draft counts."""
    if not speculative:
        return drafting_.Drafting(False)
    good = frame[(frame["status"] == 200) & (frame["choice"] >= 0)]
    known = good[good["draft_n"] >= 0]
    source = "llama-server's per-request timings.draft_n" + (" (a draft anywhere in the completion)" if whole else "")
    if len(known) == 0 or len(known) < len(good) or (max_tokens > 3 and not whole):
        return drafting_.Drafting(True, source=source, reason="no per-request draft counts (or max_tokens > 3)")
    stats_ = {"drafted@1": 0, "drafted@2": int((known["draft_n"] >= 1).sum()),
              "accepted@2": int((known["draft_accepted"] >= 1).sum()), "sequences": len(known)}
    return drafting_.drafting_evidence(stats_, m, True, source)


def counter_drafting(results: list[CellResult], answered: dict[str, int], counters: dict, max_tokens: int,
                     rule: str) -> None:
    """Each cell's drafted share at token 2 from the server's *aggregate* counters (vLLM), where they attribute.

    At ``max_tokens`` within the rule's exact window (``uncapped``, vLLM: 2) every sequence has one step after its
    prompt's pass, and each verification step is one sequence whose token 2 was drafted
    (:func:`specdec_lab.drafting.position_two_from_counters`). The counters do not say which cell a step belonged
    to, so each cell gets a **lower bound**: every sequence of the run that was not drafted is charged to it,
    share ≥ 1 − (sequences − drafted) / (the cell's sequences). The acceptance is the run's. Outside the window,
    or with no counters, the cells keep "not attributable" and cannot be equivalent.

    >>> r = [CellResult(Cell("a", "x"), 10, 0, "", None, 10), CellResult(Cell("b", "y"), 30, 0, "", None, 30)]
    >>> counter_drafting(r, {"a": 10, "b": 30}, {"verify_steps": 38, "accepted_first": 19}, 2, "uncapped")
    >>> [(d.drafting.share, d.drafting.acceptance) for d in r]
    [(0.8, 0.5), (0.9333333333333333, 0.5)]
    """
    found = drafting_.position_two_from_counters(counters, max_tokens, rule) if counters else {}
    sequences = sum(answered.values())
    longer = [r.cell.name for r in results if answered.get(r.cell.name) and r.cell.request_tokens(max_tokens) > max_tokens]
    if longer:  # a cell asking more tokens drafts more steps: the counters no longer attribute token 2 exactly
        found = {}
        reason = (f"not attributable: cell {longer[0]} asks more than {max_tokens} tokens, so the run's counters mix "
                  "its later drafts in (run it apart, or --exclude-cell it)")
        for r in results:
            r.drafting = drafting_.Drafting(True, source="the server's aggregate counters", reason=reason)
        return
    if not found or not sequences or found["drafted@2"] > sequences:  # > : other traffic, or the rule does not hold
        reason = (drafting_.UNATTRIBUTED if not found or not sequences else
                  f"the counters saw {found['drafted@2']} verification steps for {sequences} sequences: not this run's")
        for r in results:
            r.drafting = drafting_.Drafting(True, source="the server's aggregate counters", reason=reason)
        return
    drafted = found["drafted@2"]
    undrafted = sequences - drafted
    acceptance = found["accepted@2"] / drafted if drafted else None
    source = (f"the server's spec_decode counters over the run ({drafted} of {sequences} sequences drafted at "
              "token 2), a lower bound per cell")
    for r in results:
        own = answered.get(r.cell.name, 0)
        if own:
            r.drafting = drafting_.Drafting(True, drafting_.BOUNDED, 2, max(0, own - undrafted) / own, acceptance,
                                            source)


def judge_cell(cell: Cell, frame: pd.DataFrame, laws: LawBook, workload: Workload, settings: SuiteSettings,
               speculative: bool, rng: np.random.Generator) -> CellResult:
    """The evidence of one cell (before the Holm step across cells): every answered completion is an outcome."""
    failed = frame[(frame["status"] != 200) | (frame["choice"] < 0)]  # HTTP errors and replies without choices
    good = answered(frame)
    requests = int(frame["request"].nunique())
    errors = int(failed["request"].nunique())
    example = "" if failed.empty else f"HTTP {failed['status'].iloc[0]}: {failed['error'].iloc[0]}"[:300]
    # refused: every request answered with a client error (4xx: the engine refuses an option); a 5xx is the server failing
    refused = (example if requests and errors == requests and failed["status"].between(400, 499).all() else None)
    result = CellResult(cell, requests, errors, example, refused, len(good), confidence=settings.confidence)
    if len(good):
        outcomes, law, result.endings = cell_outcomes(cell, good, laws, workload)
        result.outcomes, result.outcome_law = outcomes, law
        result.outcome_counts = np.bincount(outcomes, minlength=len(law))
        judge_outcomes(result, outcomes, law, laws.pair.vocab_size, settings, rng)
    result.drafting = cell_drafting(frame, result.m, cell.request_tokens(workload.max_tokens), speculative,
                                    whole=cell.structured)
    return result


def answered(frame: pd.DataFrame) -> pd.DataFrame:
    """The answered completions of a cell's rows, in arrival order (request, then choice)."""
    good = frame[(frame["status"] == 200) & (frame["choice"] >= 0)]
    return good.sort_values(["request", "choice"], kind="stable")


def cell_outcomes(cell: Cell, good: pd.DataFrame, laws: LawBook, workload: Workload
                  ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(outcome of each answered completion (m,), as an index into the law; the cell's exact law over outcomes with
    a last outcome of probability 0 for every impossible ending; the counts per kind of ending).

    Token cells: outcome x1 * V + x2 of :func:`token_outcome` under :func:`collapse_eos`'s law. Text cells: the
    client-visible outcome of :meth:`LawBook.stop_outcomes`; a finish reason other than stop/length, or a text the
    law cannot produce, is impossible. Choice cells: the completed text of :meth:`LawBook.choice_outcomes` (anything
    but a whole choice ended by the engine is impossible)."""
    if cell.structured:
        index, law = laws.choice_outcomes(cell)
        outcomes = np.array([index.get((t, f == "stop"), len(law)) for t, f in zip(good["text"], good["finish"])],
                            dtype=np.int64)
        unknown = int((outcomes == len(law)).sum())
        endings = {"choice": len(outcomes) - unknown, "impossible text": unknown}
    elif cell.observes_text:
        index, law = laws.stop_outcomes(cell)
        keys = [(t, f == "stop") if f in ("stop", "length") else None for t, f in zip(good["text"], good["finish"])]
        outcomes = np.array([index.get(k, len(law)) for k in keys], dtype=np.int64)
        unknown = int((outcomes == len(law)).sum())
        endings = {"text": len(keys) - unknown, "impossible text": unknown}
    else:
        V, eos = laws.pair.vocab_size, laws.pair.tokenizer.eos_token_id
        law = collapse_eos(laws.joint(cell), V, eos)
        found = [token_outcome(None if t is None else list(t), f, cell.request_tokens(workload.max_tokens), eos)
                 for t, f in zip(good["tokens"], good["finish"])]
        outcomes = np.array([len(law) if pair is None else pair[0] * V + pair[1] for _, pair in found],
                            dtype=np.int64)
        endings = {kind: sum(k == kind for k, _ in found) for kind in ENDINGS[:3] + IMPOSSIBLE[:3]}
    return outcomes, np.concatenate([law, [0.0]]), {k: v for k, v in endings.items() if v}


def judge_outcomes(result: CellResult, outcomes: np.ndarray, law: np.ndarray, vocab_size: int,
                   settings: SuiteSettings, rng: np.random.Generator) -> None:
    """Fill ``result``'s p-value, bounds and rejecting test from the outcomes: an outcome of probability 0 rejects
    (TV is at least its share); token cells at T > 0 get the whole suite on tokens 1–2, the others the categorical
    tests (:func:`judge_categorical`)."""
    impossible = int((law[outcomes] <= 0).sum())
    if impossible:
        result.pvalue, result.tv_upper, result.tv_plugin = 0.0, 1.0, impossible / len(outcomes)
        result.rejected_by = f"{impossible} completion(s) with an outcome of probability 0 ({result.endings_text()})"
        return
    cell = result.cell
    if cell.observes_text or cell.greedy or cell.structured:
        result.pvalue, result.tv_upper, result.tv_plugin, result.rejected_by = judge_categorical(
            np.bincount(outcomes, minlength=len(law)), law, settings, rng)
        return
    pairs = np.stack([outcomes // vocab_size, outcomes % vocab_size], axis=1)  # (m, 2)
    suite = run_suite(cell.name, pairs, scores_from_law(pairs, law[:-1], settings.min_prefix_count), settings, rng)
    result.pvalue, result.tv_plugin = suite.global_pvalue, suite.joint_tv_plugin
    result.tv_upper = suite.joint_bound.upper
    result.rejected_by = ", ".join(suite.rejected_by)


def simultaneous(settings: SuiteSettings, cells: int) -> SuiteSettings:
    """Per-cell settings whose TV bounds hold simultaneously over ``cells`` cells at ``settings.confidence``
    (Bonferroni: each at 1 − (1 − confidence) / cells), so "every cell equivalent" is one statement at that level.

    >>> round(simultaneous(SuiteSettings(confidence=0.99), 16).confidence, 6)
    0.999375
    """
    return replace(settings, confidence=1.0 - (1.0 - settings.confidence) / max(1, cells))


def final_verdicts(results: list[CellResult], settings: SuiteSettings) -> None:
    """Holm across the cells with samples (family-wise at the looks' spent α; the sequential e-process p-values are
    family-wise already), then each cell's verdict
    (:func:`specdec_lab.verdicts.engine_row`: refused, no samples, rejected, failed, then the bound against ε
    with the drafting downgrade)."""
    for r in results:
        if r.family_wise:
            r.holm_p = r.pvalue
    judged = [r for r in results if r.refused is None and r.m > 0 and not r.family_wise]
    if judged:
        holm = stats.holm([r.pvalue for r in judged], min(r.alpha for r in judged))
        for r, adjusted in zip(judged, holm.adjusted):
            r.holm_p = float(adjusted)
    for r in results:
        r.verdict = verdicts.engine_row(refused=r.refused, m=r.m, holm_p=r.holm_p, tv_upper=r.tv_upper,
                                        alpha=r.alpha, tolerance=settings.tolerance,
                                        exercised=r.drafting.exercised, failed=r.errors)


def summary_line(results: list[CellResult]) -> str:
    """Counts of each verdict word and of failed requests, one line."""
    words = [verdicts.word(r.verdict) for r in results]
    counts = ", ".join(f"{words.count(w)} {w}" for w in verdicts.WORDS)
    errors = sum(r.errors for r in results)
    requests = sum(r.requests for r in results)
    impossible = sum(r.impossible for r in results)
    return (f"{len(results)} cells: {counts}; {errors} of {requests} requests failed; {impossible} completions "
            "ended in a way the exact law cannot produce")


def plan_cells(laws: LawBook, workload: Workload, tolerance: float, seed: int = 0,
               confidence: float = 0.99) -> pd.DataFrame:
    """Per cell, for the first look of a run whose bounds hold simultaneously over its cells at ``confidence``
    (each cell at 1 − spent(1 − confidence, 1) / cells): the m at which a correct server's TV bound is <=
    ``tolerance`` with probability 0.999 (:func:`stats.plan_bound_by_simulation` on the cell's exact law; greedy
    cells: the Clopper–Pearson m); what two-sample mode needs from *each* of its two servers
    (:func:`stats.plan_two_sample_bound`); and the same-seed pairs with no mismatch that certify by coupling
    (:func:`stats.coupling_pairs_needed`)."""
    from specdec_lab.workload.sequential import spent

    cell_confidence = 1.0 - spent(1.0 - confidence, 1) / max(1, len(workload.cells))
    rows = []
    for cell in workload.cells:
        law = (laws.choice_outcomes(cell)[1] if cell.structured else
               laws.stop_outcomes(cell)[1] if cell.observes_text else laws.joint(cell))
        law = law[law > 0]
        if len(law) == 1:  # a point mass
            m = stats.coupling_pairs_needed(tolerance, cell_confidence)
        else:
            m = stats.plan_bound_by_simulation(law, tolerance, confidence=cell_confidence,
                                               rng=np.random.default_rng(seed))
        two = stats.plan_two_sample_bound(law, tolerance, confidence=cell_confidence, rng=np.random.default_rng(seed))
        coupling = stats.coupling_pairs_needed(tolerance, 1.0 - (1.0 - cell_confidence) / 2) if cell.seeded else None
        rows.append({"cell": cell.name, "settings": cell.label(), "m planned": m,
                     "two-sample m (each server)": two, "coupling pairs (no mismatch)": coupling,
                     "cell confidence": cell_confidence})
    return pd.DataFrame(rows)


def workload_bound(per_cell: list[tuple[np.ndarray, np.ndarray]], confidence: float = 0.99) -> dict:
    """The workload-level certificate: a bound on the TV of the joint (cell, outcome) law under the workload's mix,
    Σ_c w_c TV(server_c, p_c) with w_c the cell's share of the completions — the per-request average TV.

    ``per_cell``: each judged cell's (outcome counts (n_c,), exact law over those outcomes (n_c,)). The cells' counts
    are concatenated and judged against the mixture law w_c · p_c by :func:`specdec_lab.stats.tv_upper_bound`: one
    bound on one law of Σ m_c draws, far tighter than J bounds at δ/J each. The cells' shares are fixed by design
    (stratified sampling: a multinomial conditioned on the margins the mixture law states exactly), which narrows
    the counts' spread; ``tests/test_workload.py::test_workload_bound_covers_under_stratified_sampling`` checks the
    coverage by simulation. Returns {"m", "tv_upper", "tv_plugin", "route"}.
    """
    m = int(sum(c.sum() for c, _ in per_cell))
    if m == 0:
        return {"m": 0, "tv_upper": float("nan"), "tv_plugin": float("nan"), "route": ""}
    counts = np.concatenate([c for c, _ in per_cell]).astype(np.int64)
    law = np.concatenate([c.sum() / m * p for c, p in per_cell])
    impossible = int(counts[law <= 0].sum())
    if impossible:  # outcomes of probability 0: TV is at least their share, and no bound below 1 is claimed
        return {"m": m, "tv_upper": 1.0, "tv_plugin": float("nan"), "route": f"{impossible} impossible outcomes"}
    bound = stats.tv_upper_bound(counts, law, confidence=confidence)
    return {"m": m, "tv_upper": bound.upper, "tv_plugin": stats.tv_plugin(counts, law), "route": bound.binding}
