"""Smoke test of the benchmark at tiny size: every job runs and the report holds together.

No timing is asserted (timings depend on the machine); what is checked is the bookkeeping that the
numbers rest on: the work-per-token counts match the sampler's own counts and the theory's identity,
every row is present, and the files are written.
"""

import json

import pytest
import torch

from specdec_lab import bench


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, pair):
    """The whole benchmark at smoke size, jobs in this process, on the session's loaded pair."""
    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench.jobs, "_load_pair", lambda device, prompt: (pair, pair.encode(prompt)))
        data, markdown = bench.run_benchmark(bench.QUICK, out, progress=False, runner=bench.run_job)
    torch.set_num_threads(threads)
    return data, markdown, out


def test_report_has_every_section_and_row(quick_run):
    data, markdown, out = quick_run
    for heading in ("## 1. Collection throughput", "## 2. Work per token", "## 3. Batch-1 latency",
                    "## 4. Peak memory", "HF assisted K=4 (batch 1)", "HF generate (batch 16)", "Medusa"):
        assert heading in markdown
    saved = json.loads((out / "bench.json").read_text())
    long_rows = {name + bench.LONG for name in bench.THROUGHPUT}
    assert set(saved["results"]) == set(bench.ORDER) | long_rows
    assert (out / "bench.md").read_text() == markdown
    for name in bench.THROUGHPUT:
        for key in (name, name + bench.LONG):
            s = saved["results"][key]["samples_per_s"]
            assert s["n"] == bench.QUICK.repeats and 0 < s["min"] <= s["median"] <= s["max"]
        short, long = saved["results"][name]["prompt_tokens"], saved["results"][name + bench.LONG]["prompt_tokens"]
        assert long > 10 * short  # the second table really is after the long prompt


def test_prompt_is_fed_once_per_batch_by_us_and_once_per_sample_by_hf(quick_run):
    """Target positions per sample: ours ≈ L (+ one shared prefill), HF generate = P − 1 + L − 1 + ... ≥ P."""
    results = quick_run[0]["results"]
    P = results["naive" + bench.LONG]["prompt_tokens"]
    assert results["naive" + bench.LONG]["target_positions_per_sample"] < bench.QUICK.length + P / 4
    assert results["hf_generate" + bench.LONG]["target_positions_per_sample"] >= P


def test_work_per_token_counts_agree_with_the_sampler(quick_run):
    """Hook counts: K draft forwards and one target forward per chain step, as the sampler says."""
    rows = [r for r in quick_run[0]["results"]["work"]["rows"]
            if r["sampler"].startswith("speculative") and not r["trimmed"]]
    assert [r["k"] for r in rows] == list(bench.QUICK.ks)
    for r in rows:
        assert r["draft_per_token"] == pytest.approx(r["k"] * r["target_per_token"])
        assert r["target_per_delivered_token"] >= r["target_per_token"]  # truncation only wastes
        assert 0 < r["alpha"] < 1 and 1 / (r["k"] + 1) <= r["target_per_token"] <= 1
    k1 = rows[0]  # K = 1: theory (1 − α)/(1 − α²) = 1/(1 + α), and α is measured on the same steps
    assert k1["target_per_token"] == pytest.approx(k1["theory_target_per_token"], rel=1e-9)


def test_trimmed_row_drafts_nothing_it_throws_away(quick_run):
    """trim=True: every emitted token is delivered, and the last steps draft fewer than K."""
    (r,) = [r for r in quick_run[0]["results"]["work"]["rows"] if r["trimmed"]]
    assert r["k"] == bench.QUICK.k and r["target_per_delivered_token"] == pytest.approx(r["target_per_token"])
    assert r["draft_per_token"] < r["k"] * r["target_per_token"]
    assert 1 / (r["k"] + 1) <= r["theory_target_per_token"] <= 1


def test_medusa_rows_when_the_sampler_exists(quick_run):
    rows = [r for r in quick_run[0]["results"]["work"]["rows"] if r["sampler"].startswith("Medusa")]
    if bench.medusa_status() is not None:
        pytest.skip(bench.medusa_status())
    assert len(rows) == len(bench.MEDUSA_TREES)
    for r in rows:
        assert r["draft_per_token"] == 0 and 0 <= r["alpha"] <= 1  # heads, no draft model
        assert 1 / (r["k"] + 1) <= r["target_per_token"] <= 1


def test_latency_counts_forwards(quick_run):
    runs = quick_run[0]["results"]["latency"]["runs"]
    assert runs["naive"]["draft_positions_per_token"] == 0
    assert runs["HF generate"]["draft_positions_per_token"] == 0
    assert runs["speculative K=4"]["draft_positions_per_token"] > 0
    assert runs["HF assisted K=4"]["draft_positions_per_token"] > 0


def test_forward_counter_skips_prefill_and_counts_chains(pair):
    from specdec_lab.sampling import make_generator
    from specdec_lab.samplers.naive import NaiveConfig, sample_naive

    counter = bench.ForwardCounter(pair.target)
    sample_naive(pair, pair.encode("ROMEO:\n"), 5, 3, NaiveConfig(), make_generator(0))
    counter.close()
    assert (counter.chain_forwards, counter.positions) == (15, 15)


def test_bad_settings_and_job_names():
    with pytest.raises(ValueError, match="repeats"):
        bench.BenchConfig(repeats=0)
    with pytest.raises(ValueError, match="valid names"):
        bench.run_job("nope", bench.QUICK)


def test_subprocess_job_reports_its_own_peak_rss():
    result = bench.run_in_subprocess("machine", bench.QUICK)
    assert result["peak_rss_mib"] > 0 and result["matmul_gflops"]["median"] > 0
