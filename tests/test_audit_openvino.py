"""Audit of OpenVINO GenAI on the real engine (openvino-genai 2026.4.1.0, CPU, in its own environment built by
`make openvino` / `.ci/run`).

The main environment never imports OpenVINO: a worker process of its environment holds one pipeline. The module
skips when that environment is missing, unless $SPECDEC_LAB_OPENVINO_PYTHON names it (as `.ci/run` does): then a
missing environment fails the module, so CI runs the engine for real.

What is checked, each against the real engine:
- the bundled pair exported to OpenVINO IR by the environment's own optimum-cli is our target: OpenVINO's greedy
  tokens (fp32 inference and KV cache, as the adapter runs it) equal our target's argmax decode, token for token,
  over 12 prompts × 32 tokens (with OpenVINO's CPU defaults, bf16 inference and a u8 KV cache, one of them
  differs at a near tie);
- speculative greedy (draft model, prompt lookup) equals OpenVINO's own plain greedy, token for token;
- the plain row (no speculation, T = 1) is not rejected and a planted wrong law through the same adapter
  (asked for T = 0.7, scored at T = 1) is rejected;
- the engine's own per-request counters show token 2 drafted in every sample at L = 3 (prefix caching off), and on
  ContinuousBatchingPipeline each request's handle attributes prompt lookup's accepted candidates exactly;
- the finding (docs/audit-openvino.md): with LLMPipeline's default prefix caching, sampled speculative decoding
  raises in `Sequence::_make_hash` and the pipeline then never accepts a draft again, even greedy;
- the finding: ContinuousBatchingPipeline with a draft model drafts token 1 for requests past the main model's
  prefill budget and replaces a rejected candidate with a draw from the next position's law (tokens of
  probability 0 at token 1 under top-k 20), where the same pipeline without a draft gives none.

Power: the negative control's first token alone has TV(p_0.7, p_1) ≈ 0.12 after "HAMLET." (see README), so at
m = 1,500 the suite rejects with power > 0.999 at α = 1e-3; the plain row at m = 1,500 is rejected with
probability ≤ α = 1e-3 if OpenVINO samples p exactly.
"""


import pytest
import torch

from specdec_lab.adapters import openvino
from specdec_lab.adapters.worker import sampling_job
from specdec_lab.audit import DEFAULT_PROMPT, LOOKUP_PROMPT, audit
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

from helpers import IDENTITY_PROMPTS, require_engine

SETTINGS = SuiteSettings(alpha=1e-3)

require_engine(openvino, openvino.openvino_python)


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    openvino.close_workers()


def test_exported_ir_is_our_target(pair):
    prompts = IDENTITY_PROMPTS
    rows = openvino.greedy_identity(pair, prompts, length=32)
    assert all(row["identical"] for row in rows), rows


@pytest.mark.parametrize("method", ["draft_model", "prompt_lookup"])
def test_speculative_greedy_equals_plain_greedy(pair, method):
    check = openvino.greedy_check(method, pair.encode(LOOKUP_PROMPT), 24)
    assert check["identical"], check


@pytest.mark.parametrize("pipeline", openvino.PIPELINES)
def test_plain_row_equivalent_and_planted_wrong_law_rejected(pair, tmp_path, pipeline):
    plain = audit(pair, openvino.OpenvinoConfig(method="none", pipeline=pipeline, progress=False), 1500, 3,
                  tmp_path / "plain.parquet", settings=SETTINGS, progress=False)
    assert plain.suite.verdict != "rejected", plain.summary()
    assert plain.summary()["engine errors"] == 0
    wrong = audit(pair, openvino.OpenvinoConfig(method="none", pipeline=pipeline,
                                                sampling=SamplingConfig(temperature=0.7), progress=False),
                  1500, 3, tmp_path / "wrong.parquet", scored_at=SamplingConfig(temperature=1.0),
                  expected="negative control", settings=SETTINGS, progress=False)
    assert wrong.verdict == "rejected", wrong.summary()


def test_counters_show_token_two_drafted(pair):
    config = openvino.OpenvinoConfig(method="draft_model", prefix_caching=False, progress=False)
    result = config.draw(pair, pair.encode(DEFAULT_PROMPT), 300, 3, torch.Generator().manual_seed(0))
    stats = result.stats
    assert stats["engine_errors"] == 0
    assert stats["drafted@2"] == 300  # every request's step after token 1 carried a candidate for token 2
    assert 0.5 < stats["accepted@2"] / 300 < 0.95, stats  # α = 0.75 at T = 1 (docs/models.md): often, not always


def test_continuous_batching_counters_per_request(pair):
    """ContinuousBatchingPipeline's speculative metrics are the call's, so the adapter steps the batch itself and
    reads each request's handle: with prompt lookup at L = 3, a step of 2 tokens after token 1 is an accepted
    candidate, so the requests it counts are exactly those whose tokens 1–2 continue the prompt's earlier match
    (token 1 re-creates the match, token 2 is the lookup's proposal); with a draft model every request's step after
    token 1 mostly carries a candidate (accepted or rejected), whose acceptance the pipeline does not report."""
    prompt = pair.encode(LOOKUP_PROMPT)
    ids = prompt.tolist()
    match = ids.index(ids[-1])  # the earlier occurrence of the prompt's last token
    lookup = openvino.OpenvinoConfig(method="prompt_lookup", pipeline="continuous-batching", progress=False)
    result = lookup.draw(pair, prompt, 300, 3, torch.Generator().manual_seed(0))
    tokens = result.tokens
    continues = int(((tokens[:, 0] == ids[match + 1]) & (tokens[:, 1] == ids[match + 2])).sum())
    assert result.stats["drafted@2"] == result.stats["accepted@2"] == continues > 150, (result.stats, continues)
    assert result.stats["drafted@1"] == 0, result.stats  # the prompt's pass gives token 1 (every prompt fits the budget)
    draft = openvino.OpenvinoConfig(method="draft_model", pipeline="continuous-batching", progress=False)
    stats = draft.draw(pair, pair.encode(DEFAULT_PROMPT), 64, 3, torch.Generator().manual_seed(0)).stats
    # most requests: the step after token 1 validated a candidate (a few drafted nothing there, or token 1: finding 3)
    assert stats["drafted@2"] > 32 and "accepted@2" not in stats, stats
    # 300 requests in one job: past the 256-token prefill budget the draft proposes token 1 (finding 3), and the
    # handles show it (a first step of 2 tokens) for most of them
    many = openvino.OpenvinoConfig(method="draft_model", pipeline="continuous-batching", job_size=300, progress=False)
    stats = many.draw(pair, pair.encode(DEFAULT_PROMPT), 300, 3, torch.Generator().manual_seed(0)).stats
    assert stats["drafted@1"] > 150 and stats["drafted@1"] + stats["drafted@2"] <= 300, stats


def test_finding_default_prefix_caching_breaks_sampled_speculation(pair):
    """LLMPipeline with a draft model and its default prefix caching: sampled requests raise in
    Sequence::_make_hash (sequence_group.cpp), and after that no draft is ever accepted, greedy included."""
    engine = openvino.worker(openvino.engine_settings("draft_model"))
    prompt = pair.encode(DEFAULT_PROMPT)
    sampled = engine.ask(sampling_job(prompt, list(range(40)), 8, SamplingConfig()), close_on_error=False)
    assert sampled["errors"], "no request raised"
    assert "content_length <= prompt_ids.size() + m_generated_ids.size()" in sampled["errors"][0]["message"]
    greedy = engine.ask(sampling_job(prompt, [0, 1, 2], 8, SamplingConfig(temperature=0.0)))
    assert all(c["accepted"] == 0 for c in greedy["counters"]), greedy["counters"]
    fresh = openvino.ENGINE.start(openvino.engine_settings("draft_model"))  # the same settings, never sampled
    try:
        reply = fresh.ask(sampling_job(prompt, [0], 8, SamplingConfig(temperature=0.0)))
        assert reply["counters"][0]["accepted"] > 0, reply["counters"]
    finally:
        fresh.close()


def token_one_outside_top_k(pair, prompt: str, tokens, k: int) -> int:
    """How many first tokens lie outside the target's top-k after ``prompt`` (probability 0 under the law asked)."""
    with torch.no_grad():
        logits = pair.target(torch.as_tensor(pair.encode(prompt)).reshape(1, -1)).logits[0, -1]
    allowed = torch.topk(logits, k).indices
    return int((~torch.isin(torch.as_tensor(tokens[:, 0]), allowed)).sum())


def test_finding_continuous_batching_drafts_token_one(pair):
    """ContinuousBatchingPipeline + draft model, 300 requests per generate() (more prompt tokens than the main
    scheduler's 256-token prefill budget): the draft proposes token 1 for the requests not yet prefilled, and a
    candidate that differs from the target's own draw is replaced by a sample of the *next* position's top-k, so
    token 1 falls outside the target's top-20 (docs/repro/openvino_cb_token1.py: 702 of 1,000 after "HAMLET.\n").
    The same pipeline without a draft model: none."""
    prompt, sampling = "HAMLET.\n", SamplingConfig(top_k=20)
    outside = {}
    for method in ("draft_model", "none"):
        config = openvino.OpenvinoConfig(method=method, pipeline="continuous-batching", sampling=sampling,
                                         job_size=300, progress=False)
        result = config.draw(pair, pair.encode(prompt), 300, 2, torch.Generator().manual_seed(0))
        outside[method] = token_one_outside_top_k(pair, prompt, result.tokens.numpy(), 20)
    assert outside["none"] == 0
    assert outside["draft_model"] > 60, outside  # ≈ 70% of the requests past the first ≈ 32


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unknown OpenVINO GenAI method 'eagle'"):
        openvino.OpenvinoConfig(method="eagle")
    with pytest.raises(ValueError, match="unknown OpenVINO GenAI pipeline"):
        openvino.OpenvinoConfig(pipeline="batched")
