"""Evidence that an engine drafted the positions an audit verdict bounds.

An engine samples the first token after the prompt with the target alone (the prompt's pass) and
starts drafting at token 2 (vLLM, llama.cpp's ``llama-server`` and ``llama-speculative``,
llama-cpp-python's prompt lookup); Hugging Face assisted generation is the exception, its first
step drafts from the prompt. A bound on token 1 alone therefore certifies the engine's plain
sampling, not its speculation. An engine verdict bounds the **joint law of tokens 1–2**
(:data:`BOUNDED`; the suite's ``joint_bound``; TV of the joint law bounds the TV of every event
about the first two tokens, and E_{x1∼p} TV(p(·|x1), q(·|x1)) ≤ TV(joint) + TV(token 1)), which
contains token 2, and it must show from the engine's own counters that the bounded position was
drafted.

Per-position counts, in a sample set's stats (plain integers, so :func:`specdec_lab.collect.collect`
sums them over batches):

- ``drafted@t``: samples in which the token at position t (1-based, after the prompt) came out of a
  verification of a draft token proposed for position t (the draft accepted, or rejected and
  replaced by the verifier's own sample). A bonus token after a fully accepted block is *not*
  drafted: nothing was proposed for its position.
- ``accepted@t``: of those, samples whose draft token at t was accepted.
- ``sequences`` (counter-based engines only): the sequences the engine ran, the share's denominator (vLLM
  runs whole requests of n completions, a few more than the samples kept; an endpoint's refused samples ran too).

Where they come from:

=========================  ======================================================================
engine                      source of ``drafted@t`` / ``accepted@t``
=========================  ======================================================================
HF assisted, prompt lookup  per sample: the candidate generator's candidate length and HF's
                            ``n_matches`` per step (:mod:`specdec_lab.adapters.hf`), any L
``llama-speculative``       per sample: its debug log names every draft token accepted/rejected
llama-cpp-python lookup     per sample: the server's draft calls (``specdec_lab.adapters.lookup_server``
                            logs each call's input length and draft), any L
``llama-server``            its Prometheus counters (:func:`position_two_from_counters`), exact at
                            L ≤ 3: a step drafts at most (tokens still to emit) − 1, so only the
                            step after token 1 can draft, and then one token, for position 2
vLLM (offline and serve)    its spec-decode counters, exact at L = 2: one step after the prefill
                            per sequence; ``accepted@2`` from the per-position acceptance counter
OpenVINO GenAI              per request (``LLMPipeline``): the draft's generated tokens and the main
                            model's tokens per step, exact at L = 3 (at most (tokens still to emit)
                            − 1 candidates a step: :mod:`specdec_lab.adapters.openvino`)
ONNX Runtime GenAI          per request: its ``get_speculative_stats`` (rounds, draft tokens
                            evaluated / accepted), exact at L = 2; it drafts from token 1
                            (:mod:`specdec_lab.adapters.ortgenai`)
mlx-lm                      per token: ``speculative_generate_step``'s ``from_draft`` flag and the
                            round sizes min(tokens still to emit, k), any L; it drafts from token 1
                            (:mod:`specdec_lab.adapters.mlx`)
mistral.rs 0.6.0            per request: the pipeline that served it (the response's ``model``); its
                            speculative pipeline verifies a draft for every token it emits, the
                            first included; no acceptance reported (:mod:`specdec_lab.adapters.mistralrs`)
=========================  ======================================================================

Where the counters cannot attribute drafts to a position (a longer window on a counters-only
engine), no share is claimed, and a speculative row that the suite finds equivalent is reported
**inconclusive (drafting not exercised)** (:func:`specdec_lab.verdicts.require_drafting`), as it is when its best bounded position was drafted in
fewer than half of the samples (:data:`MIN_DRAFTED_SHARE`). A rejected row stays rejected: a wrong
law is a finding whether or not the drafting is attributed.
"""

from __future__ import annotations

from dataclasses import dataclass

BOUNDED = (1, 2)  # positions whose joint law the engine verdict bounds (the suite's two-token joint bound)
MIN_DRAFTED_SHARE = 0.5  # below it a speculative row cannot be equivalent
UNATTRIBUTED = ("the engine's counters do not say which positions were drafted in this run (aggregate counters "
                "attribute drafts to token 2 only in a short window: L = 2 for vLLM, L <= 3 for llama-server)")
# How an engine's aggregate counters map to position 2, by rule name (see position_two_from_counters)
COUNTER_RULES = {
    "room": "token 1 from the prompt's pass; a step drafts at most (tokens still to emit) − 1 tokens "
            "(llama-server's get_n_draft_max): exact at L <= 3",
    "uncapped": "token 1 from the prompt's pass; drafts not capped by max_tokens (vLLM): exact at L = 2",
}


@dataclass(frozen=True)
class Drafting:
    """Where the engine drafted within the bounded positions, from its own counters.

    ``share`` and ``acceptance`` are those of ``position``: the last bounded position drafted in at least half of
    the samples, else the one drafted most often;
    ``share`` is None when the counters cannot attribute drafts to a position (``reason`` says why).
    """

    speculative: bool
    positions: tuple = BOUNDED
    position: int | None = None
    share: float | None = None
    acceptance: float | None = None
    source: str = ""
    reason: str = ""

    @property
    def exercised(self) -> bool:
        return not self.speculative or (self.share is not None and self.share >= MIN_DRAFTED_SHARE)

    def columns(self) -> dict:
        """The three columns every audit summary carries."""
        bounded = "–".join(map(str, (self.positions[0], self.positions[-1]))) + " (joint)"
        if not self.speculative:
            return {"bounded positions": bounded, "drafted share": "no speculation", "acceptance": ""}
        if self.share is None:
            return {"bounded positions": bounded, "drafted share": "not attributable", "acceptance": ""}
        acceptance = "" if self.acceptance is None else f"{self.acceptance:.3f}"
        return {"bounded positions": bounded, "drafted share": f"{self.share:.3f} (token {self.position})",
                "acceptance": acceptance}

    def words(self) -> str:
        if not self.speculative:
            return "no speculation (a reference row)"
        if self.share is None:
            return f"drafting at tokens {self.positions[0]}–{self.positions[-1]} not attributable: {self.reason}"
        return (f"token {self.position} drafted in {self.share:.1%} of samples (acceptance there "
                f"{'n/a' if self.acceptance is None else f'{self.acceptance:.1%}'}; {self.source})")


def per_position(stats: dict, positions=BOUNDED) -> dict:
    """{t: (drafted, accepted)} for the bounded positions present in ``stats`` (accepted None where the engine
    reports drafts but not their acceptance)."""
    return {t: (int(stats[f"drafted@{t}"]),
                int(stats[f"accepted@{t}"]) if f"accepted@{t}" in stats else None)
            for t in positions if f"drafted@{t}" in stats}


def drafting_evidence(stats: dict, samples: int, speculative: bool, source: str = "",
                      positions=BOUNDED) -> Drafting:
    """The :class:`Drafting` of a sample set from its stats (``drafted@t`` / ``accepted@t``).

    >>> d = drafting_evidence({"drafted@1": 0, "drafted@2": 90, "accepted@2": 30}, 100, True)
    >>> d.position, d.share, round(d.acceptance, 3), d.exercised
    (2, 0.9, 0.333, True)
    >>> drafting_evidence({"drafted@2": 40, "accepted@2": 30}, 100, True).exercised
    False
    >>> drafting_evidence({"drafted@2": 90}, 100, True).columns()["acceptance"]  # drafts seen, acceptance not
    ''
    >>> drafting_evidence({}, 100, True).columns()["drafted share"]
    'not attributable'
    """
    if not speculative:
        return Drafting(False, tuple(positions))
    found = per_position(stats, positions)
    if not found or samples <= 0:
        return Drafting(True, tuple(positions), source=source, reason=UNATTRIBUTED)
    samples = int(stats.get("sequences", samples))  # counters count every sequence the engine ran
    # the last bounded position drafted in at least half of the samples (token 2, whose law is the broad one, where
    # both are), else the one drafted most often
    exercised = [t for t in found if found[t][0] >= MIN_DRAFTED_SHARE * samples]
    position = max(exercised) if exercised else max(found, key=lambda t: (found[t][0], -t))
    drafted, accepted = found[position]
    return Drafting(True, tuple(positions), position, drafted / samples,
                    accepted / drafted if drafted and accepted is not None else None, source)


def position_two_from_counters(counters: dict, length: int, rule: str) -> dict:
    """``drafted@2`` / ``accepted@2`` from an engine's aggregate counters, where they attribute exactly.

    ``counters``: ``verify_steps`` (verification steps, i.e. steps that checked at least one draft token),
    ``accepted_tokens`` and, for the ``uncapped`` rule, ``accepted_first`` (accepted draft tokens at the
    first draft position of a step: vLLM's ``spec_decode_num_accepted_tokens_per_pos{position="0"}``).
    ``rule`` in :data:`COUNTER_RULES`. Returns the two counts, or ``{}`` where they do not attribute exactly.

    Each sequence's token 1 comes from the prompt's pass and its token 2 from its first step after it.
    When that is the only step that can carry a draft (rule ``room`` at L <= 3, ``uncapped`` at L = 2),
    each verification step is one sequence whose token 2 was drafted, and the accepted drafts at the
    step's first draft position are the accepted drafts at token 2.

    >>> position_two_from_counters({"verify_steps": 70, "accepted_tokens": 30}, 3, "room")
    {'drafted@2': 70, 'accepted@2': 30}
    >>> position_two_from_counters({"verify_steps": 70, "accepted_tokens": 30}, 6, "room")
    {}
    """
    if rule not in COUNTER_RULES:
        raise ValueError(f"unknown counter rule {rule!r}; valid: {', '.join(COUNTER_RULES)}")
    exact_up_to = 3 if rule == "room" else 2
    if length > exact_up_to:
        return {}
    verify = int(counters.get("verify_steps", 0))
    if rule == "room":  # at L = 3 each verification step drafted exactly one token, for position 2
        accepted = int(counters.get("accepted_tokens", 0)) if length == 3 else 0
    else:
        accepted = int(counters.get("accepted_first", 0))
    return {"drafted@2": verify, "accepted@2": accepted}


def positions_from_steps(steps, prompt_length: int, length: int) -> tuple[list[int], list[int]]:
    """Per-position drafted/accepted flags (each a list of L 0/1 values) of one sample from its engine
    steps ``(cur_len, candidates, accepted)``: the step starting at sequence length ``cur_len`` proposed
    ``candidates`` draft tokens for positions cur_len − P + 1, … and accepted the first ``accepted``; the
    position after them, if a candidate was proposed there, holds the verifier's sample after a rejection.

    >>> positions_from_steps([(3, 2, 2), (6, 1, 0), (7, 0, 0)], 3, 5)
    ([1, 1, 0, 1, 0], [1, 1, 0, 0, 0])
    """
    drafted, accepted = [0] * length, [0] * length
    for cur_len, candidates, matches in steps:
        first = cur_len - prompt_length  # 0-based index of the step's first new token
        # the accepted candidates and, after them, the rejected one; later candidates are discarded unverified
        for j in range(first, min(first + min(candidates, matches + 1), length)):
            drafted[j] = 1
        for j in range(first, min(first + matches, length)):
            accepted[j] = 1
    return drafted, accepted


def add_positions(stats: dict, drafted: list[int], accepted: list[int]) -> None:
    """Add one sample's flags to ``stats``' ``drafted@t`` / ``accepted@t`` counts."""
    for t, (d, a) in enumerate(zip(drafted, accepted), start=1):
        stats[f"drafted@{t}"] = stats.get(f"drafted@{t}", 0) + int(d)
        stats[f"accepted@{t}"] = stats.get(f"accepted@{t}", 0) + int(a)


def speculates(described: dict) -> bool:
    """Whether a sampler's ``describe()`` is a speculative configuration (else a reference row)."""
    kind = described.get("sampler", "")
    if kind == "hf_generate":
        return described.get("mode") != "plain"
    if kind in ("vllm_offline", "openvino_genai", "ortgenai", "mlx_lm"):
        return described.get("method") != "none"
    if kind == "mistralrs":
        return described.get("method") != "none"
    if kind == "endpoint":  # a server of unknown configuration counts as speculative
        return described.get("speculative") is not False
    if "llama-speculative" in kind:
        return True
    return "k" in described or "verifier" in described


def counter_source(described: dict) -> str:
    """Which of the engine's own counters the drafted share comes from."""
    kind = described.get("sampler", "")
    if kind == "hf_generate":
        return "HF's candidate lengths and n_matches per step"
    if kind == "vllm_offline":
        return "vLLM's spec_decode counters (num_drafts, accepted per position)"
    if kind == "ortgenai":
        return "ONNX Runtime GenAI's per-request get_speculative_stats (rounds, draft tokens evaluated and accepted)"
    if kind == "mlx_lm":
        return "mlx-lm's per-token from_draft flags (speculative_generate_step)"
    if kind == "mistralrs":
        return "mistral.rs's per-request pipeline name (its speculative pipeline drafts every emitted token)"
    if kind == "openvino_genai":
        if described.get("pipeline") == "continuous-batching":
            return "OpenVINO GenAI's per-request handle metrics (main-model tokens per step)"
        return "OpenVINO GenAI's per-request metrics (draft tokens generated, main-model tokens per step)"
    if kind == "endpoint":
        if described.get("drafting_rule") == "lookup-calls":
            return "llama-cpp-python's prompt-lookup draft calls"
        return "the server's Prometheus spec_decode counters"
    if "llama-speculative" in kind:
        return "llama-speculative's log of draft tokens accepted/rejected"
    return "the sampler's own counts"
