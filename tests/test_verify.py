"""The main job's plumbing: planned sample sizes per row, and rows that run the same in worker
processes as one by one (the verdicts themselves: `make verify`, and the smoke run in test_cli)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specdec_lab import verify
from specdec_lab.suite import SuiteSettings
from specdec_lab.verify import VerifyOptions, rows_to_run, run_rows


def test_default_scale_plans_each_lossless_row(pair):
    rows = {row.name: row for row in rows_to_run(pair, VerifyOptions(medusa=False))}
    assert rows["naive"].n == rows["speculative K=4 T=1"].n == rows["point-mass draft K=2"].n  # one law
    # every speculative row's drafts and bonus inside its window (the point-mass row at its own K = 2)
    assert rows["point-mass draft K=2"].length == 4 and rows["speculative K=4 T=1"].length == 6
    assert rows_to_run(pair, VerifyOptions(medusa=False, k=1))[4].name == "point-mass draft K=1"
    # a more peaked first-token law needs fewer samples for the same bound
    assert rows["speculative K=4 top-p=0.9"].n < rows["speculative K=4 T=0.7"].n < rows["naive"].n
    assert 20_000 < rows["naive"].n < 200_000
    controls = {name: row.n for name, row in rows.items() if not row.lossless}
    assert set(controls.values()) == {4_000, 10_000}  # the dependence control and SMALL_EFFECT keep the larger size
    assert sorted(name for name, n in controls.items() if n == 10_000) == [
        "faulty: block_tokenwise_residual", next(name for name in controls if name.startswith("faulty: overlapping"))]
    # three looks each: a lossless row from the size where its bound passes with probability 0.6 up to n, at the
    # run's levels split three ways; a control at a quarter, a half and all of its size
    for row in rows.values():
        assert len(row.plan.sizes) == 3 and row.plan.sizes[-1] == row.n and list(row.plan.sizes) == sorted(row.plan.sizes)
        assert row.plan.alpha == pytest.approx(0.01 / 3) and row.plan.confidence == pytest.approx(1 - 0.01 / 3)
    assert rows["faulty: always_accept"].plan.sizes == (1_000, 2_000, 4_000)
    fixed = rows_to_run(pair, VerifyOptions(samples=5000, medusa=False))
    assert {row.n for row in fixed if row.lossless} == {5000}
    assert all(row.plan is None for row in rows_to_run(pair, VerifyOptions(scale="smoke")))  # one look


def test_full_scale_controls_keep_the_default_sizes(pair):
    """Full scale sharpens the lossless rows' ε; the controls, rejected by a wide margin at 4,000, stay there."""
    full = {row.name: row.n for row in rows_to_run(pair, VerifyOptions(scale="full"), lossless=False)}
    default = {row.name: row.n for row in rows_to_run(pair, VerifyOptions(), lossless=False)}
    assert full == default and set(full.values()) == {4_000, 10_000}


def test_negative_controls_need_no_plan(pair, monkeypatch):
    """The controls start in the workers before the lossless rows are planned: building them plans nothing."""
    from specdec_lab import verify

    options = VerifyOptions(scale="smoke", medusa=False)  # smoke: no planning to wait for; the split is the same
    everything = {row.index: row for row in rows_to_run(pair, options)}
    lossless = rows_to_run(pair, options, lossless=True)
    monkeypatch.setattr(verify, "plan_samples", lambda *a: pytest.fail("the controls planned"))
    controls = rows_to_run(pair, options, lossless=False)
    assert controls and all(not row.lossless for row in controls) and all(row.lossless for row in lossless)
    assert {row.index: row for row in controls + lossless} == everything


def test_pool_order_plans_beside_the_costlier_controls_and_ends_on_small_rows(pair):
    """run_rows queues the costlier half of the controls, plans (``later``), queues the planned rows costliest
    first, then the cheaper controls: the workers are busy while the parent plans and finish on small rows."""
    from concurrent.futures import Future

    class RecordingPool:  # records the submission order (the real pool runs rows in that order)
        def __init__(self):
            self.order = []

        def submit(self, fn, job):
            self.order.append(job[0].name)
            future = Future()
            future.set_result({})
            return future

    options = VerifyOptions(scale="smoke", progress=False, workers=2)
    controls = rows_to_run(pair, options, lossless=False)
    lossless = [replace(row, n=1_000 * (i + 1)) for i, row in enumerate(rows_to_run(pair, options, lossless=True))]
    pool = RecordingPool()

    def plan():
        pool.order.append("planning")
        return lossless

    list(run_rows(pair, controls, options, SuiteSettings(), Path("unused"), pool, later=plan))
    by_cost = [row.name for row in sorted(controls, key=verify._cost, reverse=True)]
    head = (len(controls) + 1) // 2
    planned = [row.name for row in sorted(lossless, key=verify._cost, reverse=True)]
    assert pool.order == by_cost[:head] + ["planning"] + planned + by_cost[head:]


def test_rows_run_the_same_in_worker_processes(pair, tmp_path):
    options = VerifyOptions(scale="smoke", progress=False, workers=1)
    rows = [replace(row, n=400) for row in rows_to_run(pair, options)
            if row.name in ("speculative K=4 T=1", "faulty: always_accept")]
    settings = SuiteSettings(n_resamples=199)
    alone = {row.index: r for row, r in run_rows(pair, rows, options, settings, tmp_path / "one")}
    # the second row joins the pool later, as the planned lossless rows join the running negative controls
    pooled = {row.index: r for row, r in run_rows(pair, rows[:1], replace(options, workers=2), settings,
                                                  tmp_path / "two", later=lambda: rows[1:])}
    assert alone.keys() == pooled.keys() == {row.index for row in rows}
    for index in alone:
        a, b = alone[index], pooled[index]
        assert np.array_equal(a["first_counts"], b["first_counts"])
        # scores are float32 forwards: a worker's one thread and this process's threads may round apart
        np.testing.assert_allclose(a["pit"], b["pit"], atol=1e-5)
        assert a["entry"]["suite"].global_pvalue == pytest.approx(b["entry"]["suite"].global_pvalue, rel=1e-3)
    assert {r["entry"]["suite"].verdict for r in alone.values()} >= {"rejected"}


def test_bad_workers_is_a_clear_error():
    with pytest.raises(ValueError, match="workers must be"):
        VerifyOptions(workers=0)
