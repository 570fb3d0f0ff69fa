"""The command line end to end: verify writes its report; bad input gets a clear error."""

import json

import pandas as pd

from specdec_lab.cli import main
from specdec_lab.samplers.faulty import FAULTY


def test_verify_smoke_writes_report(tmp_path, capsys):
    code = main(["verify", "--scale", "smoke", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    folder = next(tmp_path.iterdir())
    summary = pd.read_csv(folder / "summary.csv")
    # smoke scale is too small for equivalence verdicts: no wrong call but an inconclusive lossless row exits 3
    controls = summary[summary.expected == "negative control"]
    lossless = summary[summary.expected == "lossless"]
    if (controls.verdict == "rejected").all() and (lossless.verdict != "rejected").all():
        assert code == 3 and (lossless.verdict == "inconclusive").any()
    else:
        assert code == 1
    record = json.loads((folder / "results.json").read_text())
    assert record["kind"] == "verify" and record["exit_status"] == code and record["command"].startswith("specdec-lab")
    assert len(record["rows"]) == len(summary)
    for row, (_, expected) in zip(record["rows"], summary.iterrows()):
        assert {"sampler", "m", "tv_upper", "verdict", "holm_p", "route", "settings", "seed", "L"} <= set(row)
        assert row["sampler"] == expected.sampler and row["verdict"] == expected.verdict and row["m"] == expected.m
        assert row["tv_upper"] == expected["TV upper 99%"]
    assert record["models"]["target_sha256"] and record["specdec_lab"] and record["date"]
    for name in ("report.md", "summary.csv", "tests.csv", "results.json", "tv_bounds.png", "first_token.png", "pit.png"):
        assert (folder / name).stat().st_size > 0, name
    assert len(summary) == 6 + len(FAULTY) + 1  # six lossless rows, the controls, the overlapping-streams control
    assert set(summary.verdict) <= {"equivalent", "rejected", "inconclusive"}
    # the big negative controls are caught even at smoke scale
    for name in ("always_accept", "residual_from_q", "swapped_ratio"):
        assert summary.set_index("sampler").loc[f"faulty: {name}", "verdict"] == "rejected"
    assert len(list((folder / "samples").glob("*.parquet"))) == len(summary)
    assert "TV upper 99%" in out and "report:" in out
    # every speculative row's window holds its draft positions and bonus token (L = K + 2)
    rows = summary.set_index("sampler")
    assert rows.loc["speculative K=4 T=1", "L"] == 6 and rows.loc["faulty: bonus_wrong_position", "L"] == 6
    assert {"TV upper 99% (2 tokens)", "independence p", "route"} <= set(summary.columns)


def test_verify_length_option(tmp_path):
    from specdec_lab.verify import SCALES, VerifyOptions, row_length, samplers_to_run, uncovered

    options = VerifyOptions(scale="smoke", length=3)
    runs = dict((name, s) for name, s, _ in samplers_to_run(options))
    assert all(row_length(s, options) == 3 for s in runs.values())
    assert runs["faulty: bonus_wrong_position"].k == 1  # a window of 3 cannot hold K=4's bonus: K=1
    assert "bonus untested" in uncovered(runs["speculative K=4 T=1"], 3)
    default = VerifyOptions()
    assert SCALES["default"].length is None
    by_name = {name: s for name, s, _ in samplers_to_run(default)}
    assert by_name["faulty: bonus_wrong_position"].k == 4  # the bonus bug at the K under test
    assert row_length(by_name["faulty: bonus_wrong_position"], default) == 6 and not uncovered(
        by_name["faulty: bonus_wrong_position"], 6)


def test_bad_temperature_is_a_clear_error(tmp_path, capsys):
    code = main(["verify", "--scale", "smoke", "--temperature", "-1", "--out", str(tmp_path)])
    assert code == 2 and "temperature must be" in capsys.readouterr().err


def test_unknown_sampler_is_a_clear_error(tmp_path, capsys):
    code = main(["collect", "--sampler", "medusa-typo", "--out", str(tmp_path / "x.parquet")])
    assert code == 2 and "valid names" in capsys.readouterr().err


def test_target_without_draft(capsys):
    try:
        main(["verify", "--target", "gpt2"])
    except SystemExit as exc:
        assert "give both --target and --draft" in str(exc)
    else:
        raise AssertionError("expected an error")


def test_collect_command(tmp_path, capsys):
    path = tmp_path / "s.parquet"
    assert main(["collect", "--sampler", "point_mass", "--samples", "64", "--length", "3", "--out", str(path)]) == 0
    assert path.exists() and "64 samples" in capsys.readouterr().out


def test_collect_with_trim_records_it(tmp_path):
    from specdec_lab.collect import load_samples

    path = tmp_path / "t.parquet"
    assert main(["collect", "--samples", "32", "--length", "5", "--trim", "--out", str(path)]) == 0
    meta = load_samples(path).meta
    assert meta["sampler"]["trim"] is True and meta["stats"]["emitted_tokens"] == 32 * 5  # nothing truncated


def test_every_audit_help_states_the_exit_status(capsys):
    """0 certified, 1 rejected or failed, 3 inconclusive, 2 usage: in every audit command's --help."""
    import pytest

    for kind in ("hf", "endpoint", "vllm", "openvino", "ortgenai", "llama-speculative", "workload"):
        with pytest.raises(SystemExit):
            main(["audit", kind, "--help"])
        text = capsys.readouterr().out
        assert "exit status" in text and "3  " in text and "inconclusive" in text, kind
