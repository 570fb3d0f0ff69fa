"""Audit of mistral.rs on the real engine (PyPI mistralrs 0.6.0, CPU, in its own environment built by
`make mistralrs` / `.ci/run`).

The main environment never imports it: a worker process of its environment holds one `Runner`. The module skips when
that environment is missing, unless $SPECDEC_LAB_MISTRALRS_PYTHON names it (as `.ci/run` does): then a missing
environment fails the module, so CI runs the engine for real.

What is checked, each against the real engine:
- it runs our target: its greedy tokens equal our target's argmax decode, token for token (two prompts x 16
  tokens; two of the twelve identity prompts of the other engines reach near-ties of our target within 32 tokens,
  where the engine's numerics pick the other token: docs/audit-mistralrs.md);
- speculative greedy (draft model, gamma 1) equals the engine's own plain greedy, token for token;
- the plain row (no speculation, T = 1) is not rejected and a planted wrong law through the same adapter (asked for
  T = 0.7, scored at T = 1) is rejected;
- the finding: with the draft model, sampling at T = 1 returns the greedy continuation in every request, every
  position drafted by the pipeline that served it; with gamma 2 no request finishes (the engine panics).

Power: the planted law (T = 0.7 against T = 1 after "HAMLET.") is rejected at m = 300 with α = 1e-3 with power
≈ 1 (its token-2 law moves by TV ≈ 0.2); the speculative law is a point mass where the target's token-2 law has top
probability 0.13.
"""

import pytest
import torch

from specdec_lab.adapters import mistralrs
from specdec_lab.adapters.worker import greedy_decode
from specdec_lab.audit import DEFAULT_PROMPT, audit
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

from helpers import IDENTITY_PROMPTS, require_engine

SETTINGS = SuiteSettings(alpha=1e-3)
PROMPTS = [p for p in IDENTITY_PROMPTS if not p.startswith(("MERCUTIO", "OTHELLO"))][:2]  # no near-tie within 16

require_engine(mistralrs, mistralrs.mistralrs_python)


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    mistralrs.close_workers()


def test_engine_runs_our_target(pair):
    rows = mistralrs.greedy_identity(pair, PROMPTS, length=16)
    assert all(row["identical"] for row in rows), rows


def test_speculative_greedy_equals_plain_greedy(pair):
    check = mistralrs.greedy_check("draft_model", pair.encode(DEFAULT_PROMPT), 24)
    assert check["identical"], check


def test_plain_row_not_rejected_and_planted_wrong_law_rejected(pair, tmp_path):
    plain = audit(pair, mistralrs.MistralrsConfig(method="none", progress=False), 300, 2, tmp_path / "plain.parquet",
                  settings=SETTINGS, progress=False)
    assert plain.suite.verdict != "rejected", plain.summary()
    assert plain.summary()["engine errors"] == 0
    wrong = audit(pair, mistralrs.MistralrsConfig(method="none", sampling=SamplingConfig(temperature=0.7),
                                                  progress=False),
                  300, 2, tmp_path / "wrong.parquet", scored_at=SamplingConfig(temperature=1.0),
                  expected="negative control", settings=SETTINGS, progress=False)
    assert wrong.verdict == "rejected", wrong.summary()


def test_speculative_sampling_returns_the_greedy_continuation(pair):
    prompt = pair.encode(DEFAULT_PROMPT)
    config = mistralrs.MistralrsConfig(method="draft_model", progress=False)
    result = config.draw(pair, prompt, 50, 2, torch.Generator().manual_seed(0))
    assert result.stats["engine_errors"] == 0 and result.stats["refused_samples"] == 0
    assert result.stats["drafted@1"] == result.stats["drafted@2"] == 50  # the speculative pipeline served each
    greedy = greedy_decode(pair, prompt, 2)
    assert (result.tokens == torch.tensor(greedy)).all(), result.tokens.unique(dim=0)


def test_gamma_two_never_finishes_a_request(pair):
    config = mistralrs.MistralrsConfig(method="draft_model", gamma=2, progress=False)
    with pytest.raises(mistralrs.MistralrsError, match="raised on every request"):
        config.draw(pair, pair.encode(DEFAULT_PROMPT), 1, 2, torch.Generator().manual_seed(0))


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unknown mistral.rs method 'prompt_lookup'"):
        mistralrs.MistralrsConfig(method="prompt_lookup")
    with pytest.raises(ValueError, match="gamma and job_size must be >= 1"):
        mistralrs.MistralrsConfig(method="draft_model", gamma=0)
