"""Every number the README and docs quote in a verdict table comes from a committed results file, and agrees with it.

``make docs`` renders each ``<!-- results: ... -->`` block from ``results/`` (:mod:`specdec_lab.report.docs`); these
tests fail when a block and its file disagree, when a verdict table sits outside a block, and when a results file
lacks the fields every record carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_lab import results, verdicts
from specdec_lab.report import docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_quoted_table_matches_its_results_file():
    assert docs.check_pages(ROOT) == []


def test_every_results_file_is_complete():
    files = sorted((ROOT / "results").glob("*.json"))
    assert files
    for path in files:
        doc = results.load(path)  # raises on a missing field
        assert doc["date"] and doc["command"] and doc["rows"], path
        for row in doc["rows"]:
            verdicts.word(row["verdict"])  # the vocabulary, nothing else


def test_a_stale_number_fails(tmp_path):
    """Change one number in a results file: the page that quotes it no longer matches."""
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    source = json.loads((ROOT / "results" / "audit-llamacpp-1.json").read_text())
    (tmp_path / "results" / "x.json").write_text(json.dumps(source))
    page = tmp_path / "docs" / "page.md"
    page.write_text("Intro.\n\n<!-- results: results/x.json -->\n<!-- /results -->\n")
    assert docs.write_pages(tmp_path) == [page] and docs.check_pages(tmp_path) == []
    assert "76,108 (planned)" in page.read_text()
    source["rows"][0]["cells"]["m"] = "76,109 (planned)"
    (tmp_path / "results" / "x.json").write_text(json.dumps(source))
    assert docs.check_pages(tmp_path) == ["docs/page.md: a results block differs from its results file (run make docs)"]


def test_a_verdict_table_without_a_results_file_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("| row | m | verdict |\n|---|---|---|\n| a | 10 | equivalent |\n")
    assert docs.check_pages(tmp_path) == ["docs/page.md: a verdict table outside a results block: | row | m | verdict |"]


def test_verify_view_renders_a_verify_results_file(tmp_path):
    row = verdicts.Verdict("naive", "equivalent", 45254, 0.01263, 0.18, 0.02, "lossless",
                           details={"L": 2, "exact_tv_2_tokens": 0.0, "tv_upper_2_tokens": 0.027,
                                    "independence_p": 0.63, "tokens_per_pass": None})
    doc = results.document("verify", [row], settings={}, argv=["specdec-lab", "verify"])
    headers, body = docs.view_verify(doc, doc["rows"])
    assert body == [["naive", "lossless", "45,254", "2", "0", "**0.0126**", "0.0270", "0.63", "0.18", "", "equivalent"]]


@pytest.mark.parametrize("page", ["README.md"])
def test_readme_tables_are_generated(page):
    text = (ROOT / page).read_text()
    assert "<!-- results: results/verify-default.json view=verify -->" in text
    assert "view=engines" in text
