"""Sample collection: parquet with metadata, resume after a kill, refusal of foreign files."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specdec_lab.collect import SampleFileError, collect, describe_collection, load_samples
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.naive import NaiveConfig
from specdec_lab.samplers.speculative import SpeculativeConfig

PROMPTS = ["ROMEO:\n", "JULIET.\n"]
SAMPLER = SpeculativeConfig(k=3, sampling=SamplingConfig(temperature=0.8))
RUN = dict(n=3000, length=4, seed=17, batch_size=250)

CHILD = """
import sys
from specdec_lab.collect import collect
from specdec_lab.models import load_pair
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.speculative import SpeculativeConfig
collect(load_pair("bundled"), SpeculativeConfig(k=3, sampling=SamplingConfig(temperature=0.8)),
        ["ROMEO:\\n", "JULIET.\\n"], n=3000, length=4, seed=17, path=sys.argv[1], batch_size=250, progress=False)
"""


def test_parquet_has_metadata_and_stats(pair, tmp_path):
    s = collect(pair, SAMPLER, PROMPTS, path=tmp_path / "a.parquet", progress=False, **RUN)
    assert list(s.frame.columns) == ["prompt_index", "sample", "tok_0", "tok_1", "tok_2", "tok_3"]
    assert len(s.frame) == 6000 and s.tokens(1).shape == (3000, 4)
    meta = load_samples(tmp_path / "a.parquet").meta
    assert meta["models"]["target_sha256"] == pair.identity["target_sha256"]
    assert meta["sampler"] == SAMPLER.describe() and meta["seed"] == 17 and meta["prompts"] == PROMPTS
    assert meta["library_version"] and 0 < meta["stats"]["acceptance"] < 1
    assert not (tmp_path / "a.parquet.parts").exists()


def test_resume_after_kill_gives_identical_file(pair, tmp_path):
    reference = tmp_path / "uninterrupted.parquet"
    collect(pair, SAMPLER, PROMPTS, path=reference, progress=False, **RUN)

    target = tmp_path / "interrupted.parquet"
    parts = tmp_path / "interrupted.parquet.parts"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 300
    while time.time() < deadline and len(list(parts.glob("*.parquet"))) < 3:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    done_before = len(list(parts.glob("*.parquet")))
    assert 3 <= done_before < 24, "the child should have been killed midway"
    assert not target.exists(), "no final file may exist after an interrupted run"

    collect(pair, SAMPLER, PROMPTS, path=target, progress=False, **RUN)
    assert target.read_bytes() == reference.read_bytes()
    assert pq.read_table(target).equals(pq.read_table(reference))


def test_metadata_mismatch_refused(pair, tmp_path):
    path = tmp_path / "b.parquet"
    collect(pair, NaiveConfig(), PROMPTS[:1], n=100, length=2, seed=1, path=path, progress=False)
    other = describe_collection(pair, NaiveConfig(), PROMPTS[:1], 100, 2, 2, 4096)
    with pytest.raises(SampleFileError, match="another configuration.*seed: file has 1, asked for 2"):
        load_samples(path, other)
    with pytest.raises(SampleFileError, match="sampler: file has"):
        collect(pair, NaiveConfig(SamplingConfig(temperature=0.5)), PROMPTS[:1], n=100, length=2, seed=1,
                path=path, progress=False)
    # the refused run left the file untouched
    assert load_samples(path).meta["seed"] == 1


def test_parts_from_another_configuration_refused(pair, tmp_path):
    path = tmp_path / "c.parquet"
    parts = Path(str(path) + ".parts")
    parts.mkdir()
    (parts / "collection.json").write_text(
        __import__("json").dumps(describe_collection(pair, NaiveConfig(), PROMPTS[:1], 100, 2, 5, 4096)))
    with pytest.raises(SampleFileError, match="seed: file has 5, asked for 6"):
        collect(pair, NaiveConfig(), PROMPTS[:1], n=100, length=2, seed=6, path=path, progress=False)


def test_corrupted_parquet_refused(pair, tmp_path):
    path = tmp_path / "d.parquet"
    collect(pair, NaiveConfig(), PROMPTS[:1], n=100, length=2, seed=1, path=path, progress=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SampleFileError, match="not a readable specdec-lab sample file"):
        load_samples(path)
    with pytest.raises(SampleFileError, match="not a readable"):
        collect(pair, NaiveConfig(), PROMPTS[:1], n=100, length=2, seed=1, path=path, progress=False)


def test_foreign_parquet_refused(tmp_path):
    import pyarrow as pa
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "e.parquet")
    with pytest.raises(SampleFileError, match="not a readable specdec-lab sample file"):
        load_samples(tmp_path / "e.parquet")
