"""Large sample sets: N continuations of L tokens per prompt, resumable, saved as parquet.

A collection is split into batches; batch j of prompt i draws from its own generator seeded by
``(seed, i, j)``, so a batch's samples do not depend on which batches ran before. Each finished
batch is written to ``<file>.parts/`` (temp file, then rename); an interrupted run picks up the
finished batches and the final file is identical to an uninterrupted run. The final parquet is also
written to a temp file and renamed, so a reader never sees half a file.

Metadata (parquet schema key ``specdec_lab``) records the library version, the sampler settings,
seed, prompts, model hashes and vocabulary; :func:`load_samples` refuses a file whose metadata
differs from the configuration asked for, naming the differing fields.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from specdec_lab import __version__
from specdec_lab.sampling import make_generator
from specdec_lab.samplers.protocol import merge_stats

META_KEY = b"specdec_lab"


class SampleFileError(ValueError):
    """A sample file is unreadable or was made by another configuration."""


@dataclass
class SampleSet:
    frame: pd.DataFrame  # columns prompt_index, sample, tok_0 .. tok_{L-1}
    meta: dict

    def tokens(self, prompt_index: int = 0) -> np.ndarray:
        """Tokens (N, L) of one prompt."""
        rows = self.frame[self.frame.prompt_index == prompt_index]
        return rows[[f"tok_{t}" for t in range(self.meta["length"])]].to_numpy(dtype=np.int64)


def describe_collection(pair, sampler, prompts: list[str], n: int, length: int, seed: int,
                        batch_size: int) -> dict:
    """The metadata a collection must carry; also what a loaded file is checked against."""
    return {
        "format": 1,
        "library_version": __version__,
        "sampler": sampler.describe(),
        "seed": int(seed),
        "prompts": list(prompts),
        "prompt_ids": [pair.encode(p).tolist() for p in prompts],
        "n_per_prompt": int(n),
        "length": int(length),
        "batch_size": int(batch_size),
        "models": dict(pair.identity),
        "vocab_size": int(pair.vocab_size),
    }


def batch_seed(seed: int, prompt_index: int, batch_index: int) -> int:
    return int(np.random.SeedSequence([seed, prompt_index, batch_index]).generate_state(1, np.uint64)[0] >> 1)


def collect(pair, sampler, prompts: list[str] | str, n: int, length: int, seed: int, path: str | Path,
            batch_size: int = 1024, progress: bool = True) -> SampleSet:
    """Collect ``n`` samples of ``length`` new tokens per prompt from ``sampler`` into ``path``.

    ``sampler`` is any object with ``describe() -> dict`` and
    ``draw(pair, prompt_ids, n, length, generator) -> SampleResult`` (the naive, speculative and
    faulty samplers' configs all qualify). If ``path`` already holds the finished collection it is
    loaded (after the metadata check) instead of recomputed.
    """
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    path = Path(path)
    meta = describe_collection(pair, sampler, prompts, n, length, seed, batch_size)
    if path.exists():
        return load_samples(path, meta)
    parts = _parts_dir(path)
    _open_parts(parts, meta)
    jobs = [(i, j) for i in range(len(prompts)) for j in range(-(-n // batch_size))]
    label = meta["sampler"].get("verifier", meta["sampler"]["sampler"])
    bar = tqdm(total=n * len(prompts), desc=label, unit="samples", disable=not progress, leave=False)
    for i, j in jobs:
        size = min(batch_size, n - j * batch_size)
        part = parts / f"p{i:03d}-b{j:05d}.parquet"
        if not part.exists():
            generator = make_generator(batch_seed(seed, i, j), pair.device)
            result = sampler.draw(pair, torch.tensor(meta["prompt_ids"][i]), size, length, generator)
            _write_atomic(_batch_table(result, i, j * batch_size, length), part,
                          {"stats": result.stats or {}, "size": size})
        bar.update(size)
    bar.close()
    tables = [pq.read_table(parts / f"p{i:03d}-b{j:05d}.parquet") for i, j in jobs]
    batches = [json.loads(t.schema.metadata[META_KEY]) for t in tables]
    meta["stats"] = merge_stats([b["stats"] for b in batches])
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    _write_atomic(table, path, meta)
    shutil.rmtree(parts)
    return SampleSet(table.to_pandas(), meta)


def load_samples(path: str | Path, expected: dict | None = None) -> SampleSet:
    """Read a sample file; with ``expected``, refuse it unless every expected field matches."""
    path = Path(path)
    try:
        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[META_KEY])
    except (pa.ArrowException, OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise SampleFileError(f"{path} is not a readable specdec-lab sample file ({exc}); "
                              "delete it and collect again") from exc
    if expected is not None:
        _check_meta(meta, expected, path)
    length = meta["length"]
    if table.num_rows != meta["n_per_prompt"] * len(meta["prompts"]) or \
            table.column_names != ["prompt_index", "sample"] + [f"tok_{t}" for t in range(length)]:
        raise SampleFileError(f"{path} has {table.num_rows} rows / columns {table.column_names}, "
                              "not what its metadata describes; the file is damaged")
    return SampleSet(table.to_pandas(), meta)


def _check_meta(meta: dict, expected: dict, where) -> None:
    differing = [key for key in expected if key != "stats" and meta.get(key) != expected[key]]
    if differing:
        lines = "; ".join(f"{k}: file has {meta.get(k)!r}, asked for {expected[k]!r}" for k in differing)
        raise SampleFileError(f"{where} was collected with another configuration ({lines}). "
                              "Use another path or delete the file.")


def _parts_dir(path: Path) -> Path:
    return path.with_name(path.name + ".parts")


def _open_parts(parts: Path, meta: dict) -> None:
    config = parts / "collection.json"
    if config.exists():
        _check_meta(json.loads(config.read_text()), meta, parts)
        return
    parts.mkdir(parents=True, exist_ok=True)
    tmp = config.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, sort_keys=True))
    os.replace(tmp, config)


def _batch_table(result, prompt_index: int, first: int, length: int) -> pa.Table:
    tokens = result.tokens.numpy().astype(np.int32)  # (n, L)
    columns = {"prompt_index": pa.array(np.full(len(tokens), prompt_index, dtype=np.int32)),
               "sample": pa.array(np.arange(first, first + len(tokens), dtype=np.int64))}
    columns.update({f"tok_{t}": pa.array(tokens[:, t]) for t in range(length)})
    return pa.table(columns)


def _write_atomic(table: pa.Table, path: Path, meta: dict) -> None:
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
