"""Audit of llama.cpp's own ``llama-server`` with draft-model speculative decoding (``-md``), against
the same server without a draft, on the bundled pair converted to GGUF by llama.cpp's converter.

The binaries come from ``make llama-cpp`` (built once per machine into ~/.cache/specdec-lab; ``.ci/run``
and ``make test`` build them); the tests skip, saying so, only when they are not built. Each module
run converts both models and starts two servers on free loopback ports (about a second each).

Window: L = 6 = K + 2 with K = 4, so a sample holds the prompt's token, a full draft of 4 and its
bonus token. The server's first token always comes from the prompt's pass (it never speculates
there): the speculative positions are 2..6, which the suite's per-prefix conditional tests, PIT
and log-probability z-test cover; the tests also assert, from the server's own /metrics, that most
generation steps verified a draft.

Power: at m = 1,500 the first-token Pearson test detects any TV ≥ 0.12 with power ≥ 0.99 at
α = 1e-3; the negative control (asked T = 0.7, scored at T = 1; exact first-token TV 0.116) is
rejected with power ≥ 0.99 at its m.
"""

import numpy as np
import pytest
import torch

from specdec_lab import stats
from specdec_lab.adapters import llamacpp, llamacpp_build
from specdec_lab.adapters.endpoint import LLAMA_SERVER_NEUTRAL, EndpointClient, EndpointConfig, server_counters
from specdec_lab.audit import DEFAULT_PROMPT, audit, second_token_bounds
from specdec_lab.models import BUNDLED_DIR
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

from helpers import first_token_law

ALPHA = 1e-3
SETTINGS = SuiteSettings(alpha=ALPHA)
K = llamacpp.DRAFT_TOKENS
L = K + 2


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    try:
        llamacpp_build.engine_binary("llama-server")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("llama-server")
    target = llamacpp_build.convert_to_gguf(tmp / "target-f32.gguf")
    draft = llamacpp_build.convert_to_gguf(tmp / "draft-f32.gguf", BUNDLED_DIR / "draft")
    started = {}
    try:
        started["target-draft"] = llamacpp.start_llama_server(target, tmp, draft)
        started["target-nodraft"] = llamacpp.start_llama_server(target, tmp)
        # llama.cpp's lossy benchmarking mode (--spec-synth-len K + 1: every draft kept): the positive control
        started["target-draft-synthetic"] = llamacpp.start_llama_server(target, tmp, draft, synthetic_length=K + 1)
        yield {alias: server.base_url for alias, server in started.items()}
    finally:
        for server in started.values():
            server.stop()


def config(servers, model, **kw) -> EndpointConfig:
    return EndpointConfig(servers[model], model, server=llamacpp.server_label(model), extra=LLAMA_SERVER_NEUTRAL,
                          server_metrics=True, progress=False, **kw)


TEXTS = list(llamacpp.GREEDY_PROMPTS[:3]) + [llamacpp.GREEDY_PROMPTS[5]]


def test_tokenization_equal(servers, pair):
    client = EndpointClient(EndpointConfig(servers["target-draft"], "m"))
    for text in TEXTS:
        assert client.post("/tokenize", {"content": text})["tokens"] == pair.encode(text).tolist()


def test_greedy_speculative_equals_plain_and_ours(servers, pair):
    """Greedy: the draft server's tokens equal the no-draft server's and our own argmax, token for token,
    and the draft server verified drafts on those requests."""
    client = EndpointClient(EndpointConfig(servers["target-draft"], "m"))
    before = server_counters(client.get_text("/metrics"))
    for text in TEXTS:
        spec = llamacpp.greedy_tokens(servers["target-draft"], pair, text, 32)
        plain = llamacpp.greedy_tokens(servers["target-nodraft"], pair, text, 32)
        x = pair.encode(text)
        with torch.no_grad():
            logits = pair.target(torch.cat([x, torch.tensor(plain)])[None]).logits[0, len(x) - 1:-1]
        assert spec == plain == logits[:, : pair.vocab_size].argmax(-1).tolist()
    after = server_counters(client.get_text("/metrics"))
    assert after["verify_steps"] - before["verify_steps"] >= len(TEXTS) * 2
    assert after["accepted_tokens"] > before["accepted_tokens"]


def test_draft_speculation_not_rejected_and_active(servers, pair, prompt, tmp_path):
    m = 1500
    p = first_token_law(pair, prompt, SamplingConfig())
    keep, tail = stats.merge_tail(p, m)
    assert stats.power_chisquare(m, 0.12, int(keep.sum()) + int(tail.any()), ALPHA) >= 0.99
    result = audit(pair, config(servers, "target-draft"), m, L, tmp_path / "draft.parquet", prompt="ROMEO:\n", seed=31,
                   settings=SETTINGS, progress=False)
    row = result.summary()
    assert result.suite.verdict != "rejected", result.tests()
    assert row["refused"] == 0
    # the server's own counters: most generation steps verified a draft, drafts were K long when they could be
    assert row["speculative steps"] > 0.5 and row["drafted/step"] > 2 and 0 < row["accepted/step"] < K
    assert "draft-model" in result.name
    # token 2 is the first drafted position: its law after the most frequent first token, bounded
    bounds = second_token_bounds(pair, "ROMEO:\n", result.samples.tokens(), SamplingConfig(), top=1)
    assert bounds["m"].iloc[0] > 100 and bounds["TV upper 99%"].iloc[0] < 1


def test_draft_server_drafts_token_two_per_its_counters(servers, pair, tmp_path):
    """At L = 3 llama-server can draft only at token 2 (one token: it drafts at most (tokens still to emit) − 1),
    so its verification steps are the samples whose token 2 was drafted: the engine verdict's drafted share."""
    result = audit(pair, config(servers, "target-draft", speculative=True, drafting_rule="room"), 400, 3,
                   tmp_path / "draft-l3.parquet", prompt=DEFAULT_PROMPT, seed=34, settings=SETTINGS, progress=False)
    stats_ = result.samples.meta["stats"]
    assert stats_["draft_tokens"] == stats_["verify_steps"] == stats_["drafted@2"]  # one draft token per step
    assert result.drafting.position == 2 and result.drafting.share >= 0.95, result.summary()["drafted share"]
    assert 0 < result.drafting.acceptance < 1
    assert result.suite.verdict != "rejected", result.tests()


def test_no_draft_reference_not_rejected(servers, pair, prompt, tmp_path):
    result = audit(pair, config(servers, "target-nodraft"), 1000, L, tmp_path / "plain.parquet", prompt="ROMEO:\n", seed=32,
                   settings=SETTINGS, progress=False)
    assert result.suite.verdict != "rejected", result.tests()
    assert result.samples.meta["stats"]["verify_steps"] == 0


def test_negative_control_through_draft_server_rejected(servers, pair, prompt, tmp_path):
    """Asked for T = 0.7, scored at T = 1: the same path must reject (power at the exact first-token TV
    asserted, worst case over alternatives at that TV)."""
    m = 1500
    asked, scored = (first_token_law(pair, prompt, SamplingConfig(temperature=t)) for t in (0.7, 1.0))
    keep, tail = stats.merge_tail(scored, m)
    bins = int(keep.sum()) + int(tail.any())
    tv = 0.5 * np.abs(asked - scored).sum()
    assert tv > 0.05 and stats.power_chisquare(m, tv, bins, ALPHA) >= 0.99
    result = audit(pair, config(servers, "target-draft", sampling=SamplingConfig(temperature=0.7)), m, L,
                   tmp_path / "control.parquet", prompt="ROMEO:\n", seed=33, scored_at=SamplingConfig(), expected="negative control",
                   settings=SETTINGS, progress=False)
    assert result.suite.verdict == "rejected" and result.summary()["correct call"]


def test_synthetic_acceptance_rejected(servers, pair, prompt, tmp_path):
    """The same deployment with llama.cpp's documented lossy switch on (``--spec-synth-len``, "benchmarking only"):
    every draft is kept whatever p says, so tokens 2..K+1 follow the draft; the audit path must reject it."""
    result = audit(pair, config(servers, "target-draft-synthetic"), 600, L, tmp_path / "synthetic.parquet",
                   prompt="ROMEO:\n", seed=35, settings=SETTINGS, progress=False)
    assert result.suite.verdict == "rejected", result.tests()
    assert result.summary()["speculative steps"] > 0.5


def test_unknown_bundled_model_refused():
    with pytest.raises(ValueError, match="unknown bundled model"):
        with llamacpp.bundled_server(model="target-eagle"):
            pass


def test_engine_dir_keyed_by_pin(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_LAB_LLAMA_CPP", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert llamacpp_build.engine_dir() == tmp_path / "specdec-lab" / f"llama.cpp-{llamacpp_build.VERSION}"
    with pytest.raises(FileNotFoundError, match="make llama-cpp"):
        llamacpp_build.engine_binary("llama-server")
