"""Audit of an OpenAI-compatible server: a real llama-cpp-python server on loopback serving the
bundled target (converted to GGUF by llama.cpp's own converter), with and without its speculative
option (prompt-lookup decoding).

The server comes from ``$SPECDEC_LAB_LLAMA_SERVER`` when ``.ci/run`` started one, otherwise the
module fixture converts the target and starts (and stops) its own. The tests skip only when the
``llama_cpp`` package is missing; ``make test`` installs it from requirements-audit.txt.

Power: at m = 3,000 the first-token Pearson test detects any TV ≥ 0.08 with power ≥ 0.99 at
α = 1e-3 (worst case over the ~34 merged bins); the negative controls' exact power is asserted.
"""

import http.server
import json
import os
import threading

import numpy as np
import pytest
import torch

from specdec_lab import stats
from specdec_lab.adapters import llamacpp
from specdec_lab.adapters.endpoint import (LLAMA_CPP_NEUTRAL, EndpointClient, EndpointConfig, EndpointError,
                                           SEED_RANGE, TokenMap, check_prompt_length, choice_tokens,
                                           sample_endpoint)
from specdec_lab.adapters.loopback import free_port
from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.audit import audit
from specdec_lab.cli import main
from specdec_lab.sampling import SamplingConfig, make_generator, to_probs
from specdec_lab.suite import SuiteSettings

from helpers import first_token_law

ALPHA = 1e-3
SETTINGS = SuiteSettings(alpha=ALPHA)
LOOKUP_PROMPT = "ROMEO:\nGood night, good night!\nJULIET:\nGood night, good"  # n-grams recur


@pytest.fixture(scope="module")
def server_url():
    url = os.environ.get(llamacpp.ENV_URL)
    if url:
        yield url
        return
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed "
                        "(`make test` installs requirements-audit.txt)")
    with llamacpp.bundled_server() as server:
        yield server.base_url


def config(url, model="target", **kw) -> EndpointConfig:
    kw.setdefault("extra", LLAMA_CPP_NEUTRAL)
    return EndpointConfig(url, model, server=llamacpp.server_label(model), progress=False, **kw)


class TestServedModelIsOurs:
    """Before trusting the server: same tokenizer, same greedy tokens, same log-probabilities."""

    TEXTS = ["ROMEO:\n", LOOKUP_PROMPT, "  Tabs\tand... “quotes”, é ñ 1234 —\n\n"]

    def test_tokenization_equal(self, server_url, pair):
        client = EndpointClient(config(server_url))
        for text in self.TEXTS:
            assert client.post("/extras/tokenize", {"input": text})["tokens"] == pair.encode(text).tolist()

    def test_greedy_tokens_and_logprobs_equal(self, server_url, pair):
        client, token_map = EndpointClient(config(server_url)), TokenMap(pair.tokenizer, pair.vocab_size)
        for text in self.TEXTS[:2]:
            reply = client.post("/v1/completions", {"model": "target", "prompt": text, "max_tokens": 8,
                                                    "temperature": 0.0, "logprobs": 1, **dict(LLAMA_CPP_NEUTRAL)})
            choice = reply["choices"][0]
            served = choice_tokens(choice, token_map, 8)
            x = pair.encode(text)
            with torch.no_grad():
                logits = pair.target(torch.cat([x, torch.tensor(served)])[None]).logits[0, len(x) - 1:-1]
            logp = torch.log(to_probs(logits[:, : pair.vocab_size], SamplingConfig()))  # (8, V)
            assert served == logp.argmax(-1).tolist()
            ours = logp.gather(-1, torch.tensor(served)[:, None]).squeeze(-1).numpy()
            assert np.abs(np.array(choice["logprobs"]["token_logprobs"]) - ours).max() < 1e-3


def test_plain_sampling_not_rejected(server_url, pair, prompt, tmp_path):
    m = 3000
    p = first_token_law(pair, prompt, SamplingConfig())
    keep, tail = stats.merge_tail(p, m)
    assert stats.power_chisquare(m, 0.08, int(keep.sum()) + int(tail.any()), ALPHA) >= 0.99
    result = audit(pair, config(server_url), m, 2, tmp_path / "plain.parquet", prompt="ROMEO:\n", seed=21, settings=SETTINGS,
                   progress=False)
    assert result.suite.verdict != "rejected", result.tests()
    assert result.summary()["refused"] == 0
    assert result.samples.meta["stats"]["requests"] == m  # llama-cpp-python ignores n: one sample per request


def test_prompt_lookup_speculation_not_rejected(server_url, pair, tmp_path):
    m = 1500
    ids = pair.encode(LOOKUP_PROMPT)
    p = first_token_law(pair, ids, SamplingConfig())
    keep, tail = stats.merge_tail(p, m)
    assert stats.power_chisquare(m, 0.12, int(keep.sum()) + int(tail.any()), ALPHA) >= 0.99
    result = audit(pair, config(server_url, "target-lookup"), m, 3, tmp_path / "lookup.parquet",
                   prompt=LOOKUP_PROMPT, seed=22, settings=SETTINGS, progress=False)
    assert result.suite.verdict != "rejected", result.tests()
    assert "prompt-lookup" in result.name


def test_prompt_lookup_drafts_token_two_per_its_draft_calls(server_url, pair, tmp_path):
    """The default lookup prompt repeats its speaker tag, so llama-cpp-python's lookup drafts token 2 in every
    sample and drafts on at least 80% of its steps (its own draft calls, logged by the server)."""
    from specdec_lab.audit import LOOKUP_PROMPT as DEFAULT_LOOKUP

    result = audit(pair, config(server_url, "target-lookup", speculative=True, drafting_rule="lookup-calls"), 300, 3,
                   tmp_path / "lookup-calls.parquet", prompt=DEFAULT_LOOKUP, seed=23, settings=SETTINGS,
                   progress=False)
    stats_ = result.samples.meta["stats"]
    assert result.drafting.position == 2 and result.drafting.share == 1.0, result.summary()["drafted share"]
    assert stats_["draft_calls_drafting"] >= 0.8 * stats_["draft_calls"], stats_
    assert result.suite.verdict != "rejected", result.tests()


def test_llama_cpp_default_sampler_rejected(server_url, pair, prompt, tmp_path):
    """Negative control: llama.cpp's own defaults (top-k 40, min-p 0.05, repeat penalty 1.1) at T = 1."""
    m = 1000
    result = audit(pair, config(server_url, extra=()), m, 2, tmp_path / "defaults.parquet", prompt="ROMEO:\n", seed=23,
                   expected="negative control", settings=SETTINGS, progress=False)
    assert result.suite.verdict == "rejected" and result.summary()["correct call"]


def test_top_p_before_temperature_is_a_different_law(server_url, pair, prompt, tmp_path):
    """llama-cpp-python's chain is top-k → typical → top-p → min-p → temperature: the nucleus is cut
    from the T = 1 law. At T = 0.7, top-p = 0.9 that is not HF's/vLLM's (and our) law, whose nucleus
    is cut after tempering; the audit must see the difference (exact first-token TV 0.054)."""
    m = 1000
    logits = pair.target(prompt[None]).logits[0, -1, : pair.vocab_size].detach().double()
    ours = to_probs(logits, SamplingConfig(temperature=0.7, top_p=0.9)).numpy()
    keep = to_probs(logits, SamplingConfig(top_p=0.9)) > 0
    llama = torch.softmax((logits / 0.7).masked_fill(~keep, float("-inf")), -1).numpy()
    assert 0.5 * np.abs(ours - llama).sum() > 0.05
    assert (llama[ours == 0] > 0).any()  # llama.cpp can emit tokens our law excludes
    result = audit(pair, config(server_url, sampling=SamplingConfig(temperature=0.7, top_p=0.9)), m, 2,
                   tmp_path / "order.parquet", prompt="ROMEO:\n", seed=24, expected="negative control", settings=SETTINGS,
                   progress=False)
    assert result.suite.verdict == "rejected"


def test_cli_audit_endpoint(server_url, tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    code = main(["audit", "endpoint", "--base-url", server_url, "--model", "target", "--llama-cpp-neutral",
                 "--samples", "40", "--length", "2", "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert out.exists() and "randomized PIT" in printed
    verdict = json.loads(out.with_suffix(".results.json").read_text())["rows"][0]["verdict"]
    assert code == {"inconclusive": 3, "rejected": 1}[verdict]  # 40 samples cannot certify: never 0


def test_resume_reloads_finished_file(server_url, pair, prompt, tmp_path):
    path = tmp_path / "resume.parquet"
    first = audit(pair, config(server_url), 60, 2, path, prompt="ROMEO:\n", seed=3, batch_size=25, progress=False)
    again = audit(pair, config(server_url), 60, 2, path, prompt="ROMEO:\n", seed=3, batch_size=25, progress=False)
    assert np.array_equal(first.samples.tokens(), again.samples.tokens())


def test_same_seed_same_sample(server_url, pair, prompt):
    """The request seed is honoured: equal seeds give equal samples (so distinct seeds matter)."""
    a = sample_endpoint(pair, prompt, 5, 3, config(server_url), make_generator(9)).tokens
    b = sample_endpoint(pair, prompt, 5, 3, config(server_url), make_generator(9)).tokens
    assert torch.equal(a, b)


# ------------------------------------------------------------- transport and token mapping, no server


class FlakyHandler(http.server.BaseHTTPRequestHandler):
    """Answers 503 twice, then a completion; HTTP 400 for prompt "bad"."""

    calls = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls += 1
        if body["prompt"] == "bad":
            self._send(400, {"error": "unknown parameter"})
        elif type(self).calls <= 2:
            self._send(503, {"error": "busy"})
        else:
            self._send(200, {"choices": [{"text": " the", "finish_reason": "length",
                                          "logprobs": {"tokens": [" the"]}}]})

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def flaky_url():
    FlakyHandler.calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class TestTransport:
    def test_retries_with_backoff_then_succeeds(self, flaky_url):
        client = EndpointClient(EndpointConfig(flaky_url, "m", backoff=0.01, retries=3))
        reply = client.post("/v1/completions", {"prompt": "x"})
        assert reply["choices"][0]["text"] == " the" and client.retried == 2 and FlakyHandler.calls == 3

    def test_gives_up_after_retries(self, flaky_url):
        client = EndpointClient(EndpointConfig(flaky_url, "m", backoff=0.01, retries=1))
        with pytest.raises(EndpointError, match="HTTP 503"):
            client.post("/v1/completions", {"prompt": "x"})

    def test_bad_request_fails_at_once_with_message(self, flaky_url):
        client = EndpointClient(EndpointConfig(flaky_url, "m", backoff=0.01))
        with pytest.raises(EndpointError, match="HTTP 400.*unknown parameter"):
            client.post("/v1/completions", {"prompt": "bad"})
        assert FlakyHandler.calls == 1

    def test_unreachable(self):
        client = EndpointClient(EndpointConfig(f"http://127.0.0.1:{free_port()}", "m", retries=1,
                                               backoff=0.01, timeout=2))
        with pytest.raises(EndpointError, match="unreachable after 2 tries"):
            client.post("/v1/completions", {})

    @pytest.mark.parametrize("kw", [{"base_url": "localhost:8080"}, {"retries": -1}, {"max_rate": 0},
                                    {"sampling": SamplingConfig(temperature=0)}])
    def test_bad_settings_refused(self, kw):
        with pytest.raises(ValueError):
            EndpointConfig(**{"base_url": "http://h", "model": "m", **kw})


class TestTokenMapping:
    @pytest.fixture(scope="class")
    def token_map(self, pair):
        return TokenMap(pair.tokenizer, pair.vocab_size)

    def test_pieces_map_to_ids(self, pair, token_map):
        ids = pair.encode(" the king").tolist()
        pieces = [pair.decode([i]) for i in ids]
        assert token_map.from_pieces(pieces, " the king") == ids
        assert token_map.from_pieces(pieces, " the queen") is None  # pieces must join to the text
        assert token_map.from_pieces(["token_id:5", "token_id:7"], "") == [5, 7]

    def test_text_split_must_be_unique(self, pair, token_map):
        ids = pair.encode(" the").tolist()
        assert len(ids) == 1 and token_map.from_text(" the", 1) == ids
        assert token_map.from_text(" the", 2) is None  # " t"+"he", " th"+"e", ...: ambiguous, refused
        assert token_map.from_text("", 1) is None

    def test_early_stop_and_prompt_mismatch_refused(self, pair, token_map):
        choice = {"text": " the", "finish_reason": "length", "logprobs": {"tokens": [" the"]}}
        assert choice_tokens(choice, token_map, 1) == pair.encode(" the").tolist()
        check_prompt_length({"usage": {"prompt_tokens": 7}}, 7)
        with pytest.raises(EndpointError, match="BOS"):
            check_prompt_length({"usage": {"prompt_tokens": 8}}, 7)

    def test_stopped_choices_are_refused_and_counted(self, pair, prompt, flaky_url, monkeypatch):
        replies = iter([{"choices": [{"text": "", "finish_reason": "stop"}]}] +
                       [{"choices": [{"text": " the", "finish_reason": "length"}]}] * 3)
        monkeypatch.setattr(EndpointClient, "post", lambda self, route, body: next(replies))
        result = sample_endpoint(pair, prompt, 2, 1, EndpointConfig(flaky_url, "m", progress=False),
                                 make_generator(0))
        assert result.stats["refused_samples"] == 1 and result.stats["stopped_early"] == 1
        assert result.tokens.tolist() == [pair.encode(" the").tolist()] * 2

    def test_seeds_distinct(self):
        seeds = distinct_seeds(make_generator(0), 5000, SEED_RANGE)
        assert len(set(seeds)) == 5000 and max(seeds) < 2**32 - 1
