"""Committed notebooks carry no outputs or execution counts, and keep the house rules.

Outputs are stripped so diffs stay readable and nothing stale looks like a result: outputs belong
to runs, and what a notebook claims is checked by its assert cells under nbval.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, "notebooks/ should hold the teaching notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
class TestNotebook:
    def test_no_outputs_or_execution_counts(self, path):
        for i, cell in enumerate(cells(path)):
            if cell["cell_type"] != "code":
                continue
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
            assert cell.get("outputs", []) == [], f"{path.name} cell {i} has outputs; strip them before committing"

    def test_opens_with_claim_and_ends_with_asserts(self, path):
        cs = cells(path)
        assert cs[0]["cell_type"] == "markdown" and "claim" in source(cs[0]).lower(), \
            f"{path.name} must open with the claim it tests"
        code = [source(c) for c in cs if c["cell_type"] == "code"]
        assert any(re.search(r"^assert ", s, re.M) for s in code), f"{path.name} has no assert cell"

    def test_imports_only_specdec_lab_and_no_hard_coded_device(self, path):
        for i, cell in enumerate(cells(path)):
            if cell["cell_type"] != "code":
                continue
            s = source(cell)
            for line in s.splitlines():
                m = re.match(r"\s*(?:from|import)\s+([\w.]+)", line)
                if m:
                    assert m.group(1).split(".")[0] == "specdec_lab", \
                        f"{path.name} cell {i} imports {m.group(1)}: notebooks import specdec_lab only"
            assert not re.search(r"""["']cuda["']|\.cuda\(\)""", s), f"{path.name} cell {i} hard-codes a device"
            assert not re.search(r"^\s*(for|while|def|class) ", s, re.M), \
                f"{path.name} cell {i} holds library logic (a loop or definition); move it into specdec_lab"
