"""The package installs anywhere: a wheel built from this tree carries the bundled models, and from another
directory, with nothing of the repository on the path, it runs `specdec-lab verify --scale smoke` and the kernel
helper engine developers use (`specdec_lab.testing.assert_lossless_kernel`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args, cwd, env=None, timeout=900):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return done


def test_wheel_carries_the_models_and_runs_outside_the_repository(tmp_path):
    source = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT / "specdec_lab", source / "specdec_lab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                 str(tmp_path / "dist"), str(source)], cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("specdec_lab-*.whl"))
    site = tmp_path / "site"
    installed = run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site), str(wheel)],
                    cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (site / "specdec_lab" / "bundled" / "target" / "model.safetensors").exists()
    assert (site / "specdec_lab" / "bundled" / "manifest.json").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    kernel = run([sys.executable, "-c",
                  "import specdec_lab, sys; assert specdec_lab.__file__.startswith(sys.argv[1]), specdec_lab.__file__\n"
                  "from specdec_lab.kernels.ours import LOSSLESS\n"
                  "from specdec_lab.models import load_pair\n"
                  "from specdec_lab.testing import assert_lossless_kernel\n"
                  "assert load_pair('bundled').vocab_size == 512\n"
                  "print(assert_lossless_kernel(LOSSLESS, samples=200, vocab_size=2000).verdict.verdict)",
                  str(site)], cwd=elsewhere, env=env)
    assert kernel.returncode == 0, kernel.stderr[-3000:]
    assert kernel.stdout.strip().splitlines()[-1] in ("equivalent", "inconclusive")

    verify = run([sys.executable, "-m", "specdec_lab.cli", "verify", "--scale", "smoke", "--out", str(elsewhere / "out"),
                  "--quiet"], cwd=elsewhere, env=env)
    assert verify.returncode in (1, 3), verify.stderr[-3000:]  # smoke scale certifies nothing: never 0
    record = json.loads(next((elsewhere / "out").glob("*/results.json")).read_text())
    assert record["exit_status"] == verify.returncode and record["models"]["pair"] == "bundled"
    assert record["command"].startswith("specdec-lab verify") and len(record["rows"]) >= 10
