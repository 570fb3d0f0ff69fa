"""A cell's samples on disk: parquet part files with the cell's settings in their metadata, resumable; and the
rows of one answered request."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specdec_lab import __version__
from specdec_lab.adapters.endpoint import TokenMap, choice_logprobs, choice_tokens
from specdec_lab.adapters.workload_client import Outcome
from specdec_lab.workload.cells import Cell, Workload

META_KEY = b"specdec_lab"

SCHEMA = pa.schema([("request", pa.int64()), ("choice", pa.int64()), ("seed", pa.int64()), ("status", pa.int64()),
                    ("error", pa.string()), ("tokens", pa.list_(pa.int64())), ("text", pa.string()),
                    ("finish", pa.string()), ("draft_n", pa.int64()), ("draft_accepted", pa.int64()),
                    ("attempts", pa.int64()), ("logprobs", pa.list_(pa.float64()))])


def cell_meta(cell: Cell, workload: Workload, engine: str, model: str, run_seed: int) -> dict:
    return {"cell": cell.describe(), "workload": workload.name, "max_tokens": workload.max_tokens,
            "request_tokens": cell.request_tokens(workload.max_tokens), "engine": engine, "model": model,
            "seed": run_seed, "specdec_lab": __version__}


def _same_settings(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("cell", "max_tokens", "request_tokens", "engine", "model", "seed"))


class CellStore:
    """A cell's samples: part files ``<out>/cells/<name>/part-NNNNN.parquet``, each with the cell's settings in its
    schema metadata; a re-run reads them and sends only the requests not yet answered."""

    def __init__(self, folder: Path, meta: dict) -> None:
        self.folder, self.meta = folder, meta
        self.rows: list[dict] = []

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def load(self) -> pd.DataFrame:
        tables = []
        for part in self.parts():
            table = pq.read_table(part)
            found = json.loads(table.schema.metadata[META_KEY])
            if not _same_settings(found, self.meta):
                raise ValueError(f"{part} holds samples of other settings ({found['cell']}); use another --out")
            if "logprobs" not in table.column_names:  # parts written before logprobs were kept
                table = table.append_column("logprobs", pa.nulls(len(table), pa.list_(pa.float64())))
            tables.append(table.select(SCHEMA.names))
        if not tables:
            return SCHEMA.empty_table().to_pandas()
        return pa.concat_tables(tables).to_pandas()

    def add(self, rows: list[dict]) -> None:
        self.rows.extend(rows)

    def flush(self) -> None:
        if not self.rows:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self.rows, schema=SCHEMA)
        table = table.replace_schema_metadata({META_KEY: json.dumps(self.meta).encode()})
        path = self.folder / f"part-{len(self.parts()):05d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        self.rows = []


def outcome_rows(outcome: Outcome, token_map: TokenMap, length: int, text_only: bool = False) -> list[dict]:
    """The rows of one answered request: one per choice (token ids, null where the answer maps to no tokens; [] for
    ``text_only``), plus an error row when it holds fewer choices than asked; or one error row."""
    job = outcome.job
    base = {"request": job.index, "seed": job.body.get("seed", -1), "attempts": outcome.attempts,
            "draft_n": -1, "draft_accepted": -1}
    if not outcome.ok:
        return [{**base, "choice": -1, "status": -1 if outcome.status is None else outcome.status,
                 "error": outcome.error, "tokens": [], "text": "", "finish": ""}]
    reply = outcome.reply
    timings = reply.get("timings") or {}
    if reply.get("choices") is None or len(reply["choices"]) == 0:
        return [{**base, "choice": -1, "status": 200, "error": f"a reply without choices: {str(reply)[:300]}",
                 "tokens": [], "text": "", "finish": ""}]
    if len(reply["choices"]) == 1 and timings.get("predicted_n") is not None:  # llama-server: draft_n only when > 0
        base["draft_n"] = int(timings.get("draft_n", 0))
        base["draft_accepted"] = int(timings.get("draft_n_accepted", 0))
    rows = []
    for position, choice in enumerate(reply["choices"]):
        ids = [] if text_only else choice_tokens(choice, token_map, length)  # None: the answer maps to no tokens
        rows.append({**base, "choice": int(choice.get("index", position)), "status": 200, "error": None,
                     "tokens": ids, "text": choice.get("text", ""), "finish": choice.get("finish_reason") or "",
                     "logprobs": choice_logprobs(choice)})
    asked = int(job.body.get("n", 1))
    if len(rows) < asked:  # choices the server left out are failures, not fewer samples
        rows.append({**base, "choice": -1, "status": 200, "tokens": [], "text": "", "finish": "",
                     "error": f"a reply with {len(rows)} of the {asked} choices asked for"})
    return rows
