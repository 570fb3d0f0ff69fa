"""Audit of mlx-lm on the real engine (mlx-lm 0.32.2 on mlx[cpu] 0.32.4, in its own environment built by `make mlx` /
`.ci/run`).

The main environment never imports MLX: a worker process of its environment loads the bundled folders as they are.
The module skips when that environment is missing, unless $SPECDEC_LAB_MLX_PYTHON names it (as `.ci/run` does):
then a missing environment fails the module, so CI runs the engine for real.

What is checked, each against the real engine:
- mlx-lm's Llama on the bundled target is our target: its greedy tokens equal our argmax decode, token for token,
  over 12 prompts × 32 tokens;
- speculative greedy (the bundled draft, K = 4) equals mlx-lm's own plain greedy, token for token;
- a speculative row (T = 1) is not rejected, with mlx-lm's own from_draft flags placing a draft at tokens 1 and 2 in
  every request, accepted as often as the exact laws say the equality rule accepts (Σ p·q, within 5 standard
  errors); a planted wrong law through the same adapter (asked for T = 0.7, scored at T = 1) is rejected;
- the finding (docs/audit-mlx.md): with a repetition penalty, speculative_generate_step's penalties see only the
  prompt's last token, so its law of tokens 1–2 is rejected, while the same chain without a draft is not.

Power: the negative control at m = 400 and the penalty finding at m = 200 (TV of the joint law 0.19 after "HAMLET.")
are rejected with power > 0.999 at α = 1e-3 (both at Holm p < 1e-9 in runs of 600); the lossless rows are rejected
with probability ≤ α = 1e-3 if mlx-lm samples p exactly.
"""

import pytest
import torch

from specdec_lab.adapters import mlx
from specdec_lab.audit import DEFAULT_PROMPT, audit
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings

from helpers import IDENTITY_PROMPTS, require_engine

SETTINGS = SuiteSettings(alpha=1e-3)

require_engine(mlx, mlx.mlx_python)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread_and_stop_workers():
    """The main process only scores and decodes a small model while the engine's worker samples: one torch thread
    (on 2 busy cores more threads only spin: our greedy decode took 2.8 s a prompt with 2, 0.34 s with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    mlx.close_workers()


def test_mlx_target_is_our_target(pair):
    rows = mlx.greedy_identity(pair, IDENTITY_PROMPTS, length=32)
    assert all(row["identical"] for row in rows), rows


def test_speculative_greedy_equals_plain_greedy(pair):
    check = mlx.greedy_check("draft_model", pair.encode(DEFAULT_PROMPT), 24)
    assert check["identical"], check


def test_speculative_row_not_rejected_and_planted_wrong_law_rejected(pair, tmp_path):
    row = audit(pair, mlx.MlxConfig(method="draft_model", progress=False), 400, 2, tmp_path / "row.parquet",
                settings=SETTINGS, progress=False)
    assert row.suite.verdict != "rejected", row.summary()
    stats = row.samples.meta["stats"]
    assert stats["drafted@1"] == stats["drafted@2"] == 400, stats  # k = 4: both tokens drafted in every request
    # mlx-lm keeps a draft iff it equals the target's own draw: the acceptance the exact laws give that rule
    for t, exact in zip((1, 2), mlx.exact_acceptance(pair, pair.encode(DEFAULT_PROMPT), SamplingConfig())):
        assert abs(stats[f"accepted@{t}"] / 400 - exact) < 5 * (exact * (1 - exact) / 400) ** 0.5 + 1e-3, (t, exact)
    wrong = audit(pair, mlx.MlxConfig(method="draft_model", sampling=SamplingConfig(temperature=0.7), progress=False),
                  400, 2, tmp_path / "wrong.parquet", scored_at=SamplingConfig(temperature=1.0),
                  expected="negative control", settings=SETTINGS, progress=False)
    assert wrong.verdict == "rejected", wrong.summary()


def test_finding_repetition_penalty_sees_only_the_last_prompt_token(pair, tmp_path):
    """make_logits_processors(repetition_penalty=1.3): generate_step's penalty counts the prompt and the output (the
    last 20 tokens), speculative_generate_step's only the prompt's last token and the output (its _prefill never
    adds the prompt to prev_tokens), so the speculative row is rejected and the plain one is not."""
    verdicts = {}
    for method in ("draft_model", "none"):
        config = mlx.MlxConfig(method=method, repetition_penalty=1.3, progress=False)
        result = audit(pair, config, 200, 2, tmp_path / f"{method}.parquet", settings=SETTINGS, progress=False)
        verdicts[method] = result.suite.verdict
    assert verdicts["draft_model"] == "rejected", verdicts
    assert verdicts["none"] != "rejected", verdicts


@pytest.mark.parametrize("flags, k, drafted, accepted", [
    ([False, False], 4, [1, 1], [0, 0]),  # token 1 rejected, round 2 drafts token 2, rejected
    ([True, True], 4, [1, 1], [1, 1]),  # both accepted: the request ends, no bonus
    ([True, False], 1, [1, 0], [1, 0]),  # k = 1: token 2 is the bonus of a fully accepted round
])
def test_positions_from_flags(flags, k, drafted, accepted):
    assert mlx.positions_from_flags(flags, k) == (drafted, accepted)


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unknown mlx-lm method 'eagle'"):
        mlx.MlxConfig(method="eagle")
    with pytest.raises(ValueError, match="min_p must lie in"):
        mlx.MlxConfig(min_p=1.5)
