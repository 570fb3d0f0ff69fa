"""Committed notebooks carry the outputs of one top-to-bottom run, small, and keep the house rules.

A reader on GitHub sees what the notebook shows when run: ``make notebooks-render`` executes every
notebook in place at the small default scale (``SPECDEC_LAB_SCALE=ci``). What a notebook claims is
still checked by its assert cells under nbval (``make test``); this test checks that the committed
outputs are such a run and not a hand edit, a partial run or a run in another order: every code cell
has an execution count, the counts are 1..n in cell order, no output is an error or a traceback, and
the outputs stay small (PNG figures only, at a modest size, and a cap on each notebook's bytes).
"""

import base64
import json
import re
import struct
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
MAX_NOTEBOOK_BYTES = 1_500_000  # a whole rendered notebook, figures included
MAX_PNG_BYTES = 200_000  # one figure
MAX_PNG_WIDTH = 1_600  # pixels: about 16 in at the inline backend's 100 dpi
MAX_TEXT_CHARS = 20_000  # one text or HTML output (no long tables)
# Cells allowed a definition because they are the lesson itself (at most one of each per notebook), with their
# longest length in non-comment lines: notebook 00's ten-line numpy sampler, its "break it yourself" rule (the
# reader edits it and gets its exact law from the library), and notebook 02's standalone enumerator of the
# block argument (pure Python/numpy, no library call: the proof checked without trusting the library).
TEACHING_TAGS = {"teaching-sampler": 14, "break-it-yourself": 10, "teaching-enumerator": 32}
TEACHING_IMPORTS = {"numpy", "itertools"}


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def text_of(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def png_size(data: str) -> tuple[int, int, int]:
    """(bytes, width, height) of a base64 PNG, from its IHDR chunk."""
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", raw[16:24])
    return len(raw), width, height


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, "notebooks/ should hold the teaching notebooks"


def test_png_size_reads_the_header():
    one_pixel = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAA"
                 "AABJRU5ErkJggg==")
    assert png_size(one_pixel)[1:] == (1, 1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
class TestNotebook:
    def test_outputs_are_one_run_top_to_bottom(self, path):
        code = [(i, c) for i, c in enumerate(cells(path)) if c["cell_type"] == "code"]
        counts = [c.get("execution_count") for _, c in code]
        assert None not in counts, f"{path.name}: cells {[i for i, c in code if c.get('execution_count') is None]} " \
                                   "were not run; render with `make notebooks-render`"
        assert counts == list(range(1, len(code) + 1)), \
            f"{path.name}: execution counts {counts} are not 1..{len(code)} in order (not one top-to-bottom run)"
        for i, cell in code:
            for out in cell.get("outputs", []):
                assert out["output_type"] != "error", f"{path.name} cell {i} shows an error: {out.get('ename')}"
                if out["output_type"] == "stream":
                    assert "Traceback" not in text_of(out["text"]), f"{path.name} cell {i} shows a traceback"
                if "execution_count" in out:
                    assert out["execution_count"] == cell["execution_count"], f"{path.name} cell {i}"
        assert any(c.get("outputs") for _, c in code), f"{path.name} has no outputs at all"

    def test_outputs_are_small(self, path):
        size = path.stat().st_size
        assert size <= MAX_NOTEBOOK_BYTES, f"{path.name} is {size:,} bytes (cap {MAX_NOTEBOOK_BYTES:,})"
        for i, cell in enumerate(cells(path)):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                images = [kind for kind in data if kind.startswith("image/")]
                assert set(images) <= {"image/png"}, f"{path.name} cell {i}: images {images}; PNG only"
                if "image/png" in data:
                    nbytes, width, _ = png_size(text_of(data["image/png"]))
                    assert nbytes <= MAX_PNG_BYTES and width <= MAX_PNG_WIDTH, \
                        f"{path.name} cell {i}: a {width} px, {nbytes:,}-byte PNG (cap {MAX_PNG_WIDTH} px, " \
                        f"{MAX_PNG_BYTES:,} bytes): lower its size or dpi"
                for kind in ("text/plain", "text/html"):
                    if kind in data:
                        assert len(text_of(data[kind])) <= MAX_TEXT_CHARS, f"{path.name} cell {i}: {kind} too long"
                if out["output_type"] == "stream":
                    assert len(text_of(out["text"])) <= MAX_TEXT_CHARS, f"{path.name} cell {i}: long stream output"

    def test_opens_with_claim_and_ends_with_asserts(self, path):
        cs = cells(path)
        assert cs[0]["cell_type"] == "markdown" and "claim" in source(cs[0]).lower(), \
            f"{path.name} must open with the claim it tests"
        code = [source(c) for c in cs if c["cell_type"] == "code"]
        assert any(re.search(r"^assert ", s, re.M) for s in code), f"{path.name} has no assert cell"

    def test_imports_only_specdec_lab_and_no_hard_coded_device(self, path):
        """Cells call the library. The exceptions are cells tagged with one of :data:`TEACHING_TAGS`: the lesson
        itself (the worked example's numpy sampler and editable rule, notebook 02's enumerator), which may import
        numpy or itertools and define a function; at most one of each tag per notebook, and short."""
        tags = {i: set(c.get("metadata", {}).get("tags", [])) & set(TEACHING_TAGS) for i, c in enumerate(cells(path))}
        for tag in TEACHING_TAGS:
            assert sum(tag in t for t in tags.values()) <= 1, f"{path.name}: more than one {tag} cell"
        for i, cell in enumerate(cells(path)):
            if cell["cell_type"] != "code":
                continue
            s = source(cell)
            allowed = {"specdec_lab"} | TEACHING_IMPORTS if tags[i] else {"specdec_lab"}
            for line in s.splitlines():
                m = re.match(r"\s*(?:from|import)\s+([\w.]+)", line)
                if m:
                    assert m.group(1).split(".")[0] in allowed, \
                        f"{path.name} cell {i} imports {m.group(1)}: notebooks import specdec_lab only"
            assert not re.search(r"""["']cuda["']|\.cuda\(\)""", s), f"{path.name} cell {i} hard-codes a device"
            if tags[i]:
                (tag,) = tags[i]
                lines = [line for line in s.splitlines() if line.strip() and not line.strip().startswith("#")]
                assert len(lines) <= TEACHING_TAGS[tag], f"{path.name} cell {i}: the {tag} cell has {len(lines)} lines"
                continue
            assert not re.search(r"^\s*(for|while|def|class) ", s, re.M), \
                f"{path.name} cell {i} holds library logic (a loop or definition); move it into specdec_lab"

    def test_teaching_enumerator_calls_no_library(self, path):
        """Notebook 02's enumerator proves the block argument without trusting the library: it imports nothing from
        specdec_lab (it reads no name from the library: p and q are written in the cell)."""
        for cell in cells(path):
            if "teaching-enumerator" in cell.get("metadata", {}).get("tags", []):
                assert "specdec_lab" not in source(cell), f"{path.name}: the enumerator must not call the library"
