"""The command line end to end: verify writes its report; bad input gets a clear error."""

import pandas as pd

from specdec_lab.cli import main
from specdec_lab.samplers.faulty import FAULTY


def test_verify_smoke_writes_report(tmp_path, capsys):
    code = main(["verify", "--scale", "smoke", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # smoke scale is too small for equivalence verdicts; the pipeline must run
    folder = next(tmp_path.iterdir())
    for name in ("report.md", "summary.csv", "tests.csv", "tv_bounds.png", "first_token.png", "pit.png"):
        assert (folder / name).stat().st_size > 0, name
    summary = pd.read_csv(folder / "summary.csv")
    assert len(summary) == 5 + len(FAULTY)
    assert set(summary.verdict) <= {"equivalent", "rejected", "inconclusive"}
    # the big negative controls are caught even at smoke scale
    for name in ("always_accept", "residual_from_q", "swapped_ratio"):
        assert summary.set_index("sampler").loc[f"faulty: {name}", "verdict"] == "rejected"
    assert len(list((folder / "samples").glob("*.parquet"))) == len(summary)
    assert "TV upper 99%" in out and "report:" in out


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
