"""Engine verdicts rest on drafted positions (issue 30): the rule, and a planted fault at token 2 only.

The fake engine below is an OpenAI-compatible server on loopback that samples token 1 from the exact
target law p (as every engine does, from the prompt's pass) and token 2 from p(· | x1) — or, planted, from
the target's law at another temperature — and exports vLLM-style Prometheus spec-decode counters saying
in how many samples token 2 came out of a verification step. It runs through the same path as a real
engine audit (EndpointConfig → collect → score → suite → drafting evidence → verdict).
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from specdec_lab import drafting, verdicts
from specdec_lab.adapters.endpoint import EndpointConfig
from specdec_lab.audit import audit
from specdec_lab.laws import two_token_law
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

PROMPT = "HAMLET."  # token 1 concentrated (p = 0.995), token 2 broad: the joint bound is cheap
# ε = 0.1: a correct engine's joint bound is below it at m = 3,000 (about 0.06 here), and the planted
# token-2 law at T = 0.6 is far from p (its exact joint TV ≈ 0.2), so it is rejected with power ≈ 1.
SETTINGS = SuiteSettings(tolerance=0.1, n_resamples=999)
M = 3000


class TestRule:
    """Case table: the drafted share needed for a speculative row to be equivalent."""

    @pytest.mark.parametrize("suite_verdict, drafted, expected", [
        ("equivalent", {"drafted@2": 60, "accepted@2": 10}, "equivalent"),
        ("equivalent", {"drafted@2": 50, "accepted@2": 10}, "equivalent"),  # exactly half
        ("equivalent", {"drafted@2": 49, "accepted@2": 10}, verdicts.NOT_EXERCISED),
        ("equivalent", {"drafted@1": 0, "drafted@2": 0}, verdicts.NOT_EXERCISED),
        ("equivalent", {}, verdicts.NOT_EXERCISED),  # counters that do not attribute
        ("rejected", {"drafted@2": 0}, "rejected"),  # a wrong law is a finding either way
        ("inconclusive", {"drafted@2": 100}, "inconclusive"),
    ])
    def test_speculative_rows(self, suite_verdict, drafted, expected):
        evidence = drafting.drafting_evidence(drafted, 100, speculative=True)
        assert verdicts.require_drafting(suite_verdict, evidence.exercised) == expected

    def test_reference_row_needs_no_drafting(self):
        evidence = drafting.drafting_evidence({}, 100, speculative=False)
        assert verdicts.require_drafting("equivalent", evidence.exercised) == "equivalent"
        assert evidence.columns()["drafted share"] == "no speculation"

    def test_best_bounded_position_counts(self):
        evidence = drafting.drafting_evidence({"drafted@1": 100, "accepted@1": 80, "drafted@2": 10}, 100, True)
        assert (evidence.position, evidence.share, evidence.acceptance) == (1, 1.0, 0.8)

    @pytest.mark.parametrize("rule, length, attributed", [("room", 2, True), ("room", 3, True), ("room", 4, False),
                                                          ("uncapped", 2, True), ("uncapped", 3, False)])
    def test_counters_attribute_only_in_their_window(self, rule, length, attributed):
        counts = drafting.position_two_from_counters({"verify_steps": 7, "accepted_tokens": 3, "accepted_first": 2},
                                                     length, rule)
        assert ("drafted@2" in counts) == attributed

    def test_hf_steps_to_positions(self):
        # HF drafts from the prompt: step 1 proposes 4 and accepts 1, step 2 proposes 1 (the confidence stop)
        drafted, accepted = drafting.positions_from_steps([(5, 4, 1), (7, 1, 1), (9, 0, 0)], 5, 5)
        assert drafted == [1, 1, 1, 0, 0] and accepted == [1, 0, 1, 0, 0]


class FakeEngine(ThreadingHTTPServer):
    """Token 1 from p, token 2 from ``cond`` (V, V) — p's own conditional or a planted one; token 2 drafted
    (counted in vLLM's counters) with probability ``share``."""

    def __init__(self, first, cond, share, prompt_tokens, seed=0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.first, self.cond, self.share, self.prompt_tokens = first, cond, share, prompt_tokens
        self.rng, self.lock = np.random.default_rng(seed), threading.Lock()
        self.drafts = self.accepted = 0

    def complete(self, n):
        with self.lock:
            choices = []
            for i in range(n):
                x1 = int(self.rng.choice(len(self.first), p=self.first))
                x2 = int(self.rng.choice(len(self.first), p=self.cond[x1]))
                if self.rng.random() < self.share:
                    self.drafts += 1
                    self.accepted += int(self.rng.random() < 0.5)
                choices.append({"index": i, "text": "", "token_ids": [x1, x2], "finish_reason": "length"})
            return {"choices": choices, "usage": {"prompt_tokens": self.prompt_tokens}}

    def metrics(self):
        return (f"vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {self.drafts}\n"
                f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"0\"}} {self.accepted}\n")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(json.dumps(self.server.complete(body["n"])), "application/json")

    def do_GET(self):
        self._send(self.server.metrics(), "text/plain")

    def _send(self, text, kind):
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def laws(pair):
    ids = pair.encode(PROMPT)
    right = two_token_law(pair, ids, SamplingConfig())
    planted = two_token_law(pair, ids, SamplingConfig(temperature=0.6))
    return len(ids), right.first, right.cond, planted.cond


def run_fake(pair, tmp_path, laws, share, planted=False, seed=0):
    prompt_tokens, first, cond, wrong = laws
    engine = FakeEngine(first, wrong if planted else cond, share, prompt_tokens, seed)
    thread = threading.Thread(target=engine.serve_forever, daemon=True)
    thread.start()
    try:
        config = EndpointConfig(f"http://127.0.0.1:{engine.server_address[1]}", "fake", n_per_request=50,
                                logprobs=None, server="fake engine", speculative=True, server_metrics=True,
                                drafting_rule="uncapped", max_rate=10_000, progress=False)
        return audit(pair, config, M, 2, tmp_path / f"fake-{share}-{planted}.parquet", prompt=PROMPT, seed=seed,
                     settings=SETTINGS, batch_size=1000, progress=False)
    finally:
        engine.shutdown()
        engine.server_close()


def test_correct_engine_drafting_token_two_is_equivalent(pair, tmp_path, laws):
    result = run_fake(pair, tmp_path, laws, share=0.9)
    row = result.summary()
    assert result.suite.verdict == "equivalent" and row["verdict"] == "equivalent", row["in words"]
    assert row["bounded positions"] == "1–2 (joint)" and row["drafted share"].endswith("(token 2)")
    assert 0.85 < result.drafting.share < 0.95 and 0.4 < result.drafting.acceptance < 0.6


def test_correct_engine_drafting_too_rarely_is_inconclusive(pair, tmp_path, laws):
    """The same correct law, token 2 drafted in about 30% of samples: never equivalent."""
    result = run_fake(pair, tmp_path, laws, share=0.3)
    row = result.summary()
    assert result.suite.verdict == "equivalent"  # the law is right ...
    assert row["verdict"] == verdicts.NOT_EXERCISED and not row["correct call"]  # ... but drafting was not shown


def test_planted_fault_at_token_two_only_rejected_while_token_one_clean(pair, tmp_path, laws):
    """Token 1 exact, token 2 (the drafted position) from the wrong law: rejected through the same path, while
    the token-1 control stays clean (its bound below ε, its own tests not rejecting)."""
    result = run_fake(pair, tmp_path, laws, share=0.9, planted=True)
    row = result.summary()
    assert row["verdict"] == "rejected", row["in words"]
    assert row["TV upper 99% (token 1)"] <= SETTINGS.tolerance
    assert all(result.suite.tests[t].pvalue > 0.01 for t in ("pearson (first token)", "G (first token)",
                                                              "ADK (first token)"))
    assert row["TV upper 99%"] > SETTINGS.tolerance  # the joint bound sees the fault
