"""The verdict vocabulary and the rules that produce it: the one module that decides and names verdicts.

Every job — ``verify``, every ``audit``, ``audit workload`` and the kernel harness — judges its rows here and
returns :class:`Verdict` rows; nothing else spells the words. The rules:

- **rejected** — some test rejects at level α after Holm's step (the row's Holm-adjusted p-value < α);
- **equivalent** — not rejected *and* the certified upper confidence bound on TV is ≤ ε (TOST logic: "not
  rejected" alone is never a pass);
- **inconclusive** — neither: more samples are needed;
- **inconclusive (drafting not exercised)** — an engine row that would be equivalent but whose bounded
  positions were not shown to be drafted in at least half of its samples (:mod:`specdec_lab.drafting`);
- **refused by the engine** — every request of the row was answered with a client error;
- **no samples** — every request failed (server errors or transport);
- **failed** — the engine failed some requests (HTTP 5xx or no answer once it was up): a finding.

Exit status, the same for every command (:func:`exit_status`): 0 when every judged row is certified
(equivalent, or for a run with expectations: every row's call is correct); 1 when any row is rejected or
failed, or a call is wrong; 3 when none is rejected but some is inconclusive; 2 for usage and input errors
(raised before any verdict).

>>> decide(0.5, 0.011, alpha=0.01, tolerance=0.02), decide(0.001, 0.011, alpha=0.01, tolerance=0.02)
('equivalent', 'rejected')
>>> decide(0.5, 0.03, alpha=0.01, tolerance=0.02)
'inconclusive'
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

EQUIVALENT = "equivalent"
REJECTED = "rejected"
INCONCLUSIVE = "inconclusive"
NOT_EXERCISED = "inconclusive (drafting not exercised)"
REFUSED = "refused by the engine"
NO_SAMPLES = "no samples"
FAILED = "failed"
WORDS = (EQUIVALENT, REJECTED, INCONCLUSIVE, NOT_EXERCISED, REFUSED, NO_SAMPLES, FAILED)

# What a server's exact promises came to (specdec_lab.workload.promises): broken is a finding (exit 1); within
# numerics names differences a non-batch-invariant or lower-precision engine shows without breaking the promise
KEPT = "kept"
BROKEN = "broken"
WITHIN_NUMERICS = "within numerics"
NOT_CHECKED = "not checked"
DIAGNOSTIC = "diagnostic"
PROMISE_WORDS = (KEPT, BROKEN, WITHIN_NUMERICS, NOT_CHECKED, DIAGNOSTIC)

LOSSLESS = "lossless"
NEGATIVE_CONTROL = "negative control"
EXPECTED = (LOSSLESS, NEGATIVE_CONTROL)

EXIT_CERTIFIED, EXIT_REJECTED, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3


def decide(holm_p: float, tv_upper: float, *, alpha: float, tolerance: float, also: tuple = ()) -> str:
    """The statistical verdict of one row: rejected when ``holm_p`` < ``alpha``, equivalent when not and
    ``tv_upper`` ≤ ``tolerance`` (and every further ``(bound, its tolerance)`` pair in ``also`` holds),
    inconclusive otherwise (a NaN bound is never within tolerance)."""
    if holm_p < alpha:
        return REJECTED
    if tv_upper <= tolerance and all(upper <= tol for upper, tol in also):
        return EQUIVALENT
    return INCONCLUSIVE


def require_drafting(verdict: str, exercised: bool) -> str:
    """The engine downgrade: an *equivalent* speculative row whose bounded positions were not shown to be
    drafted (``exercised`` False) is :data:`NOT_EXERCISED`; every other verdict stands.

    >>> require_drafting("equivalent", False), require_drafting("rejected", False)
    ('inconclusive (drafting not exercised)', 'rejected')
    """
    return NOT_EXERCISED if verdict == EQUIVALENT and not exercised else verdict


def engine_row(*, refused: str | None, m: int, holm_p: float, tv_upper: float, alpha: float, tolerance: float,
               exercised: bool = True, failed: int = 0) -> str:
    """The verdict of one engine row (an audit row or a workload cell), in this order: refused (every request
    answered with a client error; ``refused`` holds the message), no samples, rejected, failed (``failed``
    requests the server did not answer), then :func:`decide` with the drafting downgrade.

    >>> engine_row(refused=None, m=0, holm_p=math.nan, tv_upper=math.nan, alpha=0.01, tolerance=0.02)
    'no samples'
    >>> engine_row(refused=None, m=900, holm_p=0.4, tv_upper=0.01, alpha=0.01, tolerance=0.02, failed=3)
    'failed'
    """
    if refused is not None:
        return f"{REFUSED}: {refused}"
    if m == 0:
        return NO_SAMPLES
    verdict = decide(holm_p, tv_upper, alpha=alpha, tolerance=tolerance)
    if verdict != REJECTED and failed:
        return FAILED
    return require_drafting(verdict, exercised)


def word(verdict: str) -> str:
    """The vocabulary word a verdict string starts with (``'refused by the engine: HTTP 400 …'`` → REFUSED).

    >>> word("refused by the engine: HTTP 400"), word("inconclusive (drafting not exercised)")
    ('refused by the engine', 'inconclusive (drafting not exercised)')
    """
    for w in sorted(WORDS, key=len, reverse=True):
        if verdict.startswith(w):
            return w
    raise ValueError(f"unknown verdict {verdict!r}; valid words: {', '.join(WORDS)}")


def correct_call(verdict: str, expected: str) -> bool:
    """A lossless row must be equivalent; a negative control must be rejected.

    >>> correct_call("equivalent", "lossless"), correct_call("inconclusive", "lossless")
    (True, False)
    """
    if expected not in EXPECTED:
        raise ValueError(f"unknown expectation {expected!r}; valid: {', '.join(EXPECTED)}")
    return verdict == (EQUIVALENT if expected == LOSSLESS else REJECTED)


def exit_status(verdicts: Iterable[str]) -> int:
    """0 when every verdict is equivalent, 1 when any is rejected or failed (or refused, or without samples),
    3 when none is but some is inconclusive. An empty run is usage (2).

    >>> exit_status(["equivalent", "equivalent"]), exit_status(["equivalent", "inconclusive"])
    (0, 3)
    >>> exit_status(["inconclusive", "rejected"]), exit_status(["inconclusive (drafting not exercised)"])
    (1, 3)
    """
    words = [word(v) for v in verdicts]
    if not words:
        return EXIT_USAGE
    if any(w in (REJECTED, FAILED, REFUSED, NO_SAMPLES) for w in words):
        return EXIT_REJECTED
    if any(w in (INCONCLUSIVE, NOT_EXERCISED) for w in words):
        return EXIT_INCONCLUSIVE
    return EXIT_CERTIFIED


def with_promises(status: int, promises: Iterable[str]) -> int:
    """The exit status of a run whose cells gave ``status``, once its promises are counted: a broken promise is a
    finding (1); the others leave it.

    >>> with_promises(0, ["kept", "within numerics", "not checked"]), with_promises(3, ["kept", "broken"])
    (0, 1)
    """
    words = list(promises)
    unknown = set(words) - set(PROMISE_WORDS)
    if unknown:
        raise ValueError(f"unknown promise status {sorted(unknown)[0]!r}; valid: {', '.join(PROMISE_WORDS)}")
    return EXIT_REJECTED if BROKEN in words else status


def expectation_status(rows: Iterable["Verdict"]) -> int:
    """For runs whose rows carry an expectation (verify, an audit with a negative control): 0 when every call is
    correct, else 1 when a lossless row is rejected/failed or a control is not rejected, else 3 (a lossless row
    only inconclusive)."""
    rows = list(rows)
    if all(r.correct for r in rows):
        return EXIT_CERTIFIED
    wrong = [r for r in rows if not r.correct]
    if all(r.expected == LOSSLESS and word(r.verdict) in (INCONCLUSIVE, NOT_EXERCISED) for r in wrong):
        return EXIT_INCONCLUSIVE
    return EXIT_REJECTED


@dataclass(frozen=True)
class Verdict:
    """One judged row of any command: what was judged, on how many samples, the certified bound, the word.

    ``details`` holds what the row's table shows besides (bounded positions, drafted share, acceptance, route,
    settings, seed, ...): plain JSON values. ``expected`` is None for rows with no expectation (a workload cell).
    """

    sampler: str
    verdict: str
    m: int
    tv_upper: float
    holm_p: float
    tolerance: float
    expected: str | None = None
    text: str = ""  # the verdict in words
    details: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        word(self.verdict)  # raises on a word outside the vocabulary
        if self.expected is not None and self.expected not in EXPECTED:
            raise ValueError(f"unknown expectation {self.expected!r}; valid: {', '.join(EXPECTED)}")

    @property
    def correct(self) -> bool:
        """The expected call (True for rows without an expectation that are equivalent)."""
        if self.expected is None:
            return word(self.verdict) == EQUIVALENT
        return correct_call(self.verdict, self.expected)

    def record(self) -> dict:
        """The row as a JSON-ready record (``results.json``)."""
        out = {"sampler": self.sampler, "m": int(self.m), "tv_upper": plain(self.tv_upper),
               "holm_p": plain(self.holm_p), "tolerance": plain(self.tolerance), "verdict": self.verdict}
        if self.expected is not None:
            out["expected"] = self.expected
            out["correct_call"] = self.correct
        if self.text:
            out["in_words"] = self.text
        out.update({key: plain(value) for key, value in self.details.items()})
        return out


def plain(value):
    """A JSON-ready value: numpy scalars to Python, NaN and infinities to None, containers recursively.

    >>> plain(np.float64("nan")), plain(np.int64(3)), plain({"a": (1.5, float("inf"))})
    (None, 3, {'a': [1.5, None]})
    """
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, np.bool_):
        return bool(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def dumps(document: Mapping) -> str:
    """``document`` as readable JSON (:func:`plain` values, one-space indent, keys in their given order)."""
    return json.dumps(plain(document), indent=1, ensure_ascii=False) + "\n"
