"""The Makefile's targets that run notebooks find the engines' environments where `make test` does.

`make -n` prints each recipe without running it (no environment is built): every target that runs notebook 07 or
the browser test must pass SPECDEC_LAB_VLLM_PYTHON, defaulting to the interpreter `make test` would use (a machine
whose vLLM environment lives in the per-machine cache once made `make browser` fail)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def recipe(target: str) -> str:
    done = subprocess.run(["make", "-n", target, "STAMP=", "CORE_STAMP=", "AUDIT_STAMP=", "VLLM_STAMP="],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout


def vllm_default(text: str) -> str:
    line = next(line for line in text.splitlines() if "SPECDEC_LAB_VLLM_PYTHON=" in line)
    return line.split("SPECDEC_LAB_VLLM_PYTHON:-", 1)[1].split("}", 1)[0]


@pytest.mark.parametrize("target", ["browser", "notebooks", "notebooks-render", "lab"])
def test_notebook_targets_find_vllm_where_make_test_does(target):
    assert vllm_default(recipe(target)) == vllm_default(recipe("test"))


def test_notebooks_render_executes_in_place_at_ci_scale():
    text = recipe("notebooks-render")
    assert "SPECDEC_LAB_SCALE=ci" in text and "--execute --inplace" in text
    assert all(f"notebooks/{p.name}" in text for p in (ROOT / "notebooks").glob("*.ipynb"))
