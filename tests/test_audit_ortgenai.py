"""Audit of ONNX Runtime GenAI on the real engine (onnxruntime-genai 0.18.0, CPU, in its own environment built by
`make ortgenai` / `.ci/run`).

The main environment never imports it: a worker process of its environment holds one model. The module skips when
that environment is missing, unless $SPECDEC_LAB_ORTGENAI_PYTHON names it (as `.ci/run` does): then a missing
environment fails the module, so CI runs the engine for real.

What is checked, each against the real engine:
- the bundled pair converted by the engine's own model builder is our target: its greedy tokens equal our target's
  argmax decode, token for token, over 12 prompts x 32 tokens;
- speculative greedy (draft model, n-gram) equals the engine's own plain greedy, token for token;
- the plain row (no speculation, T = 1) is not rejected and a planted wrong law through the same adapter (asked for
  T = 0.7, scored at T = 1) is rejected;
- the engine's own per-request counters place drafts at tokens 1 and 2 in every request at L = 2 (draft model).

Power: as in tests/test_audit_openvino.py (m = 1,500, α = 1e-3).
"""


import pytest
import torch

from specdec_lab.adapters import ortgenai
from specdec_lab.audit import DEFAULT_PROMPT, LOOKUP_PROMPT, audit
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

from helpers import IDENTITY_PROMPTS, require_engine

SETTINGS = SuiteSettings(alpha=1e-3)

require_engine(ortgenai, ortgenai.ortgenai_python)


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    ortgenai.close_workers()


def test_converted_model_is_our_target(pair):
    prompts = IDENTITY_PROMPTS
    rows = ortgenai.greedy_identity(pair, prompts, length=32)
    assert all(row["identical"] for row in rows), rows


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_speculative_greedy_equals_plain_greedy(pair, method):
    check = ortgenai.greedy_check(method, pair.encode(LOOKUP_PROMPT), 24)
    assert check["identical"], check


def test_plain_row_equivalent_and_planted_wrong_law_rejected(pair, tmp_path):
    plain = audit(pair, ortgenai.OrtGenaiConfig(method="none", progress=False), 1500, 2, tmp_path / "plain.parquet",
                  settings=SETTINGS, progress=False)
    assert plain.suite.verdict != "rejected", plain.summary()
    assert plain.summary()["engine errors"] == 0
    wrong = audit(pair, ortgenai.OrtGenaiConfig(method="none", sampling=SamplingConfig(temperature=0.7),
                                                progress=False),
                  1500, 2, tmp_path / "wrong.parquet", scored_at=SamplingConfig(temperature=1.0),
                  expected="negative control", settings=SETTINGS, progress=False)
    assert wrong.verdict == "rejected", wrong.summary()


def test_counters_place_drafts_at_tokens_one_and_two(pair):
    config = ortgenai.OrtGenaiConfig(method="draft_model", progress=False)
    stats = config.draw(pair, pair.encode(DEFAULT_PROMPT), 300, 2, torch.Generator().manual_seed(0)).stats
    assert stats["engine_errors"] == 0
    assert stats["drafted@1"] == stats["drafted@2"] == 300
    assert 0.9 < stats["accepted@1"] / 300  # token 1 is "\n" with p = 0.995 under both models
    assert 0.4 < stats["accepted@2"] / 300 < 0.95, stats  # α = 0.75 at T = 1 (docs/models.md): often, not always


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unknown ONNX Runtime GenAI method 'prompt_lookup'"):
        ortgenai.OrtGenaiConfig(method="prompt_lookup")
    with pytest.raises(ValueError, match="k must be in 1..16"):
        ortgenai.OrtGenaiConfig(method="draft_model", k=17)
