"""``specdec-lab audit workload``: the file format, the client, the exact per-cell laws, the verdicts — and the
controls: our own batching server (:mod:`specdec_lab.adapters.batch_server`) with a planted temperature leak is
rejected in exactly the cells that share batches with other temperatures, and the same server without the
leak in none; a real llama-server with the bundled draft and four slots runs the default workload end to end.

Power of the planted control: in the "mixed" group a T = 1, a T = 0.7 (min-p) and a greedy cell share
batches; the leak gives a greedy row a sampling temperature (impossible outputs: p = 0) and a sampling row
T = 0 in the batches a greedy row leads (a point mass on the argmax pair, ≈ 1/3 of the mixed batches), a TV of
≈ 0.3 from the exact law, rejected with power ≈ 1 at m = 300. The "same" group's cells (T = 1 only, with a
repetition penalty, top-k and unseeded requests, a stop string, no logprobs) are untouched by the fault.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from specdec_lab.adapters.batch_server import BatchServerConfig, served
from specdec_lab.adapters.workload_client import ClientSettings
from specdec_lab.laws import LawBook
from specdec_lab.models import load_pair
from specdec_lab.suite import SuiteSettings
from specdec_lab.verdicts import REFUSED
from specdec_lab.workload import (DEFAULT_WORKLOAD, SCHEMA, Cell, CellResult, WorkloadError,
                                  WorkloadRun, audit_workload, counter_drafting, interleaved_jobs, judge_cell,
                                  load_workload, parse_workload, request_seed)

ROOT = Path(__file__).resolve().parents[1]
PLANTED = {
    "name": "planted", "max_tokens": 3,
    "cells": [
        {"name": "mixed-t1", "group": "mixed", "prompt": "HAMLET.", "temperature": 1.0},
        {"name": "mixed-t07", "group": "mixed", "prompt": "ROMEO:\n", "temperature": 0.7, "min_p": 0.05},
        {"name": "mixed-greedy", "group": "mixed", "prompt": "ROMEO:\n", "temperature": 0.0},
        {"name": "same-a", "group": "same", "prompt": "HAMLET.", "repetition_penalty": 1.3},
        {"name": "same-b", "group": "same", "prompt": "ROMEO:\n", "top_k": 20, "seeded": False},
        {"name": "same-stop", "group": "same", "prompt": "ROMEO:\n", "stop": " "},
        {"name": "same-text", "group": "same", "prompt": "HAMLET.", "logprobs": False},
        {"name": "same-refused", "group": "same", "prompt": "ROMEO:\n", "n": 20},  # our server allows n <= 16
    ]}
MIXED = {"mixed-t1", "mixed-t07", "mixed-greedy"}


@pytest.fixture(scope="module")
def pair():
    return load_pair("bundled")


def run_planted(pair, tmp_path, leak: bool, samples: int = 300, end_early: float = 0.0, workload=None) -> dict:
    workload = workload or parse_workload(PLANTED)
    folder = tmp_path / ("leak" if leak else f"early-{end_early:g}" if end_early else "lossless")
    with served(pair, BatchServerConfig(leak_temperature=leak, end_early=end_early)) as server:
        run = WorkloadRun(server.base_url, folder, samples, speculative=False,
                          client=ClientSettings(concurrency=8, progress=False), server_metrics=False)
        found = audit_workload(pair, workload, run)
        found["mixed batches"] = server.engine.mixed_batches
    return found


def verdicts(found: dict) -> dict:
    return {r.cell.name: r.verdict for r in found["results"]}


# ------------------------------------------------------------------------------------------ the controls


def test_planted_leak_rejected_in_exactly_its_cells(pair, tmp_path):
    found = run_planted(pair, tmp_path, leak=True)
    assert found["mixed batches"] > 50  # the condition was exercised
    got = verdicts(found)
    assert {name for name, v in got.items() if v == "rejected"} == MIXED, found["table"].to_string()
    assert got["same-refused"].startswith(REFUSED) and "n: must be" in got["same-refused"]
    assert sum(r.errors for r in found["results"]) == sum(r.requests for r in found["results"]
                                                          if r.cell.name == "same-refused")


def test_lossless_server_not_rejected_and_resumes(pair, tmp_path):
    found = run_planted(pair, tmp_path, leak=False)
    got = verdicts(found)
    assert not any(v == "rejected" for v in got.values()), found["table"].to_string()
    # every answered completion counted: 300 per cell, each ending of positive probability
    results = {r.cell.name: r for r in found["results"]}
    assert all(r.m == 300 and r.impossible == 0 for name, r in results.items() if name != "same-refused")
    # 300 argmax pairs: TV <= 1 − (δ_cell)^(1/300), δ_cell = 0.01 · 6/π² / 8 (8 cells, first look) = 0.0236 > ε:
    # the greedy cell is certified simultaneously with the others only from ≈ 360 samples on (--plan)
    greedy = results["mixed-greedy"]
    delta = 0.01 * 6 / np.pi ** 2 / 8
    assert greedy.tv_upper == pytest.approx(1 - delta ** (1 / 300)) and greedy.verdict == "inconclusive"
    assert greedy.confidence == pytest.approx(1 - delta) and greedy.look == 1
    assert "0 rejected" in found["summary"]
    # a second run on the same folder sends nothing new; it is a second look: same data, levels spent further
    again = run_planted(pair, tmp_path, leak=False)
    assert again["seconds"] < found["seconds"] and again["mixed batches"] == 0
    second = {r.cell.name: r for r in again["results"]}
    for name, r in results.items():
        assert second[name].m == r.m and second[name].endings == r.endings and second[name].look == 2
        if r.m:
            assert second[name].tv_upper >= r.tv_upper and second[name].confidence > r.confidence


def test_early_ending_server_rejected_not_dropped(pair, tmp_path):
    """The hole of issue 45: a server exact except that it ends 30% of its completions after token 1 ("stop", no
    EOS, no stop string) was certified on its survivors. Every completion is an outcome now: rejected in every
    sampled cell, the early endings counted in the table."""
    w = parse_workload({"max_tokens": 3, "cells": [c for c in PLANTED["cells"] if c["name"] in
                                                   ("mixed-t1", "same-a", "same-b", "same-text")]})
    found = run_planted(pair, tmp_path, leak=False, samples=200, end_early=0.3, workload=w)
    results = {r.cell.name: r for r in found["results"]}
    assert all(r.verdict == "rejected" for r in results.values()), found["table"].to_string()
    for name in ("mixed-t1", "same-a", "same-b"):
        assert results[name].m == 200  # nothing dropped
        assert 30 <= results[name].endings["EOS at 2"] <= 90, results[name].endings  # ≈ 60 early endings
    assert "EOS at 2" in found["table"].set_index("cell").loc["mixed-t1", "endings"]


def test_token_outcomes_count_every_ending(pair):
    """EOS endings are outcomes of their exact probability; cut-short, unexplained stops and unmapped answers are
    outcomes of probability 0 that reject."""
    from specdec_lab.workload.judge import collapse_eos, token_outcome

    eos = pair.tokenizer.eos_token_id
    assert token_outcome([3, eos, 9], "length", 3, eos) == ("EOS at 2", (3, eos))  # what follows EOS is ignored
    assert token_outcome([eos], "stop", 3, eos) == ("EOS at 1", (eos, eos))
    assert token_outcome([3, 4], "length", 3, eos)[0] == "cut short"
    law = collapse_eos(np.full(16, 1 / 16), 4, 1)
    assert law.sum() == pytest.approx(1) and law[4 + 1] == pytest.approx(0.25) and law[4:8].sum() == pytest.approx(0.25)
    cell = Cell("c", "HAMLET.")
    frame = pd.DataFrame({"request": [0, 1, 2], "choice": [0, 0, 0], "status": [200] * 3, "error": [None] * 3,
                          "tokens": [[5, 6, 7], [5], None], "text": ["", "", ""], "finish": ["length", "length", "length"],
                          "draft_n": [-1] * 3, "draft_accepted": [-1] * 3, "attempts": [1] * 3, "seed": [0, 1, 2]})
    w = parse_workload({"cells": [{"name": "c", "prompt": "HAMLET."}]})
    result = judge_cell(cell, frame, LawBook(pair, "llama.cpp"), w, SuiteSettings(n_resamples=99), False,
                        np.random.default_rng(0))
    assert result.m == 3 and result.endings == {"2 tokens": 1, "cut short": 1, "unmapped": 1}
    assert result.pvalue == 0 and result.tv_upper == 1 and "probability 0" in result.rejected_by


# ------------------------------------------------------------------------------------------ exact laws


def test_penalised_law_matches_step_by_step(pair):
    """The joint law's token-2 row under penalties equals the chain applied to the context prompt + x1."""
    from specdec_lab.sampling import chain_probs

    cell = parse_workload(PLANTED).cells[3]  # repetition 1.3
    laws = LawBook(pair, "llama.cpp")
    joint = laws.joint(cell).reshape(pair.vocab_size, pair.vocab_size)
    ids = pair.encode(cell.prompt)
    chain = cell.chain("llama.cpp")
    x1 = int(joint.sum(1).argmax())
    with torch.no_grad():
        logits = pair.target(torch.cat([ids, torch.tensor([x1])])[None]).logits[0, -1, : pair.vocab_size].double()
    row = chain_probs(logits, chain, *chain.counts(ids.tolist(), [x1], pair.vocab_size)).numpy()
    assert np.allclose(joint[x1] / joint[x1].sum(), row, atol=1e-9)
    plain = LawBook(pair, "llama.cpp").joint(parse_workload(PLANTED).cells[0])  # same prompt, no penalty
    assert 0.5 * np.abs(plain - laws.joint(cell)).sum() > 0.05  # the penalty moves the law


def test_stop_law_is_push_forward(pair):
    laws = LawBook(pair, "llama.cpp")
    cell = parse_workload(PLANTED).cells[5]
    index, law = laws.stop_outcomes(cell)
    assert abs(law.sum() - 1) < 1e-9
    assert all(" " not in text for text, _ in index)
    stopped = sum(p for (text, s), p in zip(index, law) if s)
    assert 0.1 < stopped < 0.5


# ------------------------------------------------------------------------------------------ the file format


def test_default_workload_covers_the_production_conditions(pair):
    w = load_workload()
    cells = w.cells
    prompts = {c.prompt for c in cells}
    lengths = sorted(len(pair.encode(p)) for p in prompts)
    assert len(prompts) >= 8 and lengths[-1] > 128 and len(w.groups()) == 1  # above the prefill chunk (-b 128)
    prefix = [p for p in prompts if p.startswith("KING RICHARD III:\nNow is the winter")]
    assert len(prefix) >= 3
    assert {0.0, 0.7, 1.0} <= {c.temperature for c in cells}
    assert any(c.top_p < 1 for c in cells) and any(c.top_k for c in cells) and any(c.min_p for c in cells)
    assert any(c.presence_penalty for c in cells) and any(c.frequency_penalty for c in cells)
    assert any(c.repetition_penalty != 1 for c in cells)
    assert any(c.seeded for c in cells) and any(not c.seeded for c in cells)
    assert any(c.n > 1 for c in cells) and any(not c.logprobs for c in cells) and any(c.stop for c in cells)


@pytest.mark.parametrize("edit, message", [
    (lambda w: w["cells"][1].update(temperature=-1), r"cells\[1\]\.temperature: must be a number >= 0"),
    (lambda w: w["cells"][0].update(top_p=1.5), r"cells\[0\]\.top_p"),
    (lambda w: w["cells"][2].update(colour="red"), r"cells\[2\]\.colour: unknown field"),
    (lambda w: w["cells"][0].pop("prompt"), r"cells\[0\]\.prompt: required"),
    (lambda w: w["cells"][3].update(name="mixed-t1"), r"cells\[3\]\.name: 'mixed-t1' is used twice"),
    (lambda w: w["cells"][0].update(n=0), r"cells\[0\]\.n"),
    (lambda w: w["cells"][0].update(seeded="yes"), r"cells\[0\]\.seeded: must be true or false"),
    (lambda w: w["cells"][0].update(stop=[""]), r"cells\[0\]\.stop"),
    (lambda w: w.update(max_tokens=1), r"max_tokens: must be an integer in \[2, 16\]"),
    (lambda w: w.update(cells=[]), r"cells: required"),
])
def test_malformed_workload_names_the_field(edit, message):
    raw = json.loads(json.dumps(PLANTED))
    edit(raw)
    with pytest.raises(WorkloadError, match=message):
        parse_workload(raw)


def test_malformed_file_exits_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cells:\n  - {name: a, prompt: HAMLET., temperature: hot}\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "specdec_lab.cli", "audit", "workload", "--base-url",
                           "http://127.0.0.1:9", "--workload", str(bad), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "cells[0].temperature: must be a number >= 0, got 'hot'" in done.stderr
    assert not out.exists()


def test_out_is_required_unless_planning(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specdec_lab.cli", "audit", "workload", "--base-url",
                           "http://127.0.0.1:9"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "--out is required" in done.stderr


@pytest.mark.parametrize("extra, message", [
    (["--exclude-cell", "nope"], "--exclude-cell nope: no such cell"),
    (["--patch", "vllm-cpu-expand"], "--patch applies to a server this command starts"),
    (["--max-tokens", "1"], "--max-tokens must be in [2, 16]"),
])
def test_bad_options_exit_2_and_write_nothing(tmp_path, extra, message):
    done = subprocess.run([sys.executable, "-m", "specdec_lab.cli", "audit", "workload", "--base-url",
                           "http://127.0.0.1:9", "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_yaml_syntax_error_is_an_input_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cells: [ {name: a\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(bad)


def test_jobs_interleave_cells_with_distinct_seeds():
    w = parse_workload(PLANTED)
    jobs = interleaved_jobs(w, {c.name: list(range(3)) for c in w.cells}, "llama.cpp", "target", 0)
    assert [j.key for j in jobs[:3]] == ["mixed-t1", "mixed-t07", "mixed-greedy"]  # group by group, interleaved
    seeds = [j.body["seed"] for j in jobs if "seed" in j.body]
    assert len(seeds) == len(set(seeds)) and all(0 <= s < 2**32 - 1 for s in seeds)
    assert not any("seed" in j.body for j in jobs if j.key == "same-b")  # unseeded
    # llama-server and vLLM seed choice k of a request with seed + k: an n-choice cell's seeds are n apart
    wide = [j.body["seed"] for j in jobs if j.key == "same-refused"]
    assert np.diff(wide).tolist() == [20, 20]


def test_unreachable_server_gives_errors_not_silence(pair, tmp_path):
    """Transport failures are retried, then counted per cell; no cell gets samples."""
    from specdec_lab.adapters.loopback import free_port

    w = parse_workload({"cells": PLANTED["cells"][:2]})
    run = WorkloadRun(f"http://127.0.0.1:{free_port()}", tmp_path / "down", 5, speculative=False,
                      client=ClientSettings(concurrency=2, retries=1, backoff=0.01, progress=False),
                      server_metrics=False)
    found = audit_workload(pair, w, run)
    assert [(r.requests, r.errors, r.m, r.verdict) for r in found["results"]] == [(5, 5, 0, "no samples")] * 2
    frame = pd.concat(found["frames"].values())
    assert (frame["status"] == -1).all() and (frame["attempts"] == 2).all()
    # a server that stopped answering (a crashed engine) is down after 3 failures in a row: the rest is not sent
    down = replace(run, out=tmp_path / "crashed", client=replace(run.client, down_after=3))
    frame = pd.concat(audit_workload(pair, w, down)["frames"].values())
    assert len(frame) == 10 and (frame["status"] == -1).all()
    sent = frame["attempts"] > 0
    assert 3 <= sent.sum() <= 3 + 1, frame  # at most one more in flight (concurrency 2) when the third failed
    assert frame.loc[~sent, "error"].str.startswith("not sent: the server stopped answering").all()


def error_frame(statuses: list[int]) -> pd.DataFrame:
    rows = [{"request": i, "choice": -1, "seed": i, "status": status, "error": "boom", "tokens": [], "text": "",
             "finish": "", "draft_n": -1, "draft_accepted": -1, "attempts": 1} for i, status in enumerate(statuses)]
    return pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()


def test_client_errors_are_refusals_server_errors_are_failures(pair):
    """Only a 4xx on every request is the engine refusing an option; a 5xx (a crashed engine) is the server failing."""
    w = parse_workload(PLANTED)
    laws, settings = LawBook(pair, "llama.cpp"), SuiteSettings(n_resamples=199)
    rng = np.random.default_rng(0)
    refused = judge_cell(w.cells[0], error_frame([400, 400]), laws, w, settings, False, rng)
    crashed = judge_cell(w.cells[0], error_frame([500, 500]), laws, w, settings, False, rng)
    assert refused.refused is not None and crashed.refused is None and crashed.errors == 2


def test_counter_drafting_claims_nothing_when_a_cell_asks_more_tokens():
    """A choice cell asks 4 tokens in a 2-token run: its later drafts mix into the counters, so no cell is charged."""
    cells = [CellResult(Cell("a", "x"), 10, 0, "", None, 10),
             CellResult(Cell("c", "y", choice=("ab", "cd")), 10, 0, "", None, 10)]
    counter_drafting(cells, {"a": 10, "c": 10}, {"verify_steps": 15, "accepted_first": 3}, 2, "uncapped")
    assert all(r.drafting.share is None and "cell c asks more than 2 tokens" in r.drafting.reason for r in cells)
    counter_drafting(cells[:1], {"a": 10}, {"verify_steps": 10, "accepted_first": 3}, 2, "uncapped")
    assert cells[0].drafting.share == 1.0


def test_counter_drafting_claims_nothing_when_the_counters_are_not_this_runs():
    cells = [CellResult(Cell("a", "x"), 10, 0, "", None, 10)]
    counter_drafting(cells, {"a": 10}, {"verify_steps": 11, "accepted_first": 3}, 2, "uncapped")  # 11 steps, 10 seqs
    assert cells[0].drafting.share is None and "not this run's" in cells[0].drafting.reason
    counter_drafting(cells, {"a": 10}, {"verify_steps": 10, "accepted_first": 3}, 3, "uncapped")  # outside L = 2
    assert cells[0].drafting.share is None and not cells[0].drafting.exercised


# ------------------------------------------------------------------------------------------ a real llama-server


def test_llama_server_default_workload_end_to_end(tmp_path):
    """`specdec-lab audit workload --serve-bundled llama-server` on the default workload (40 samples a cell):
    every cell answered, token 2 drafted in every n = 1 request (timings.draft_n), and each request's
    accepted draft is exactly the draft model's greedy proposal."""
    from specdec_lab.adapters import llamacpp_build

    try:
        llamacpp_build.engine_binary("llama-server")
        if not (llamacpp_build.converter_dir() / "convert_hf_to_gguf.py").exists():
            raise FileNotFoundError(f"llama.cpp's converter is not at {llamacpp_build.converter_dir()}")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "ls"
    done = subprocess.run([sys.executable, "-m", "specdec_lab.cli", "audit", "workload", "--serve-bundled",
                           "llama-server", "--samples", "40", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    # 40 samples a cell certify nothing: inconclusive cells exit 3 (never 0), a rejection or a failure 1
    record = json.loads((out / "results.json").read_text())
    assert done.returncode == record["exit_status"] != 0, done.stderr[-3000:]
    assert len(record["rows"]) == 17 and all(row["verdict"] != "equivalent" for row in record["rows"])
    assert "17 cells:" in done.stdout and "; 0 of" in (out / "summary.txt").read_text(), done.stdout[-3000:]
    table = pd.read_csv(out / "verdicts.csv")
    single = table[table["bounded"] == "tokens 1–2 + ending"]
    single = single[~single["settings"].str.contains("n=4")]
    assert (single["drafted share"] == "1.000 (token 2)").all(), table.to_string()
    pair = load_pair("bundled")
    w = load_workload()
    for cell in (c for c in w.cells if c.name in ("t1-short", "repetition", "long")):
        frame = pd.concat(pd.read_parquet(p) for p in sorted((out / "cells" / cell.name).glob("*.parquet")))
        ids = pair.encode(cell.prompt)
        for tokens, accepted in zip(frame["tokens"], frame["draft_accepted"]):
            with torch.no_grad():
                context = torch.cat([ids, torch.tensor([int(tokens[0])])])[None]
                proposal = int(pair.draft(context).logits[0, -1, : pair.vocab_size].argmax())
            assert (proposal == int(tokens[1])) == (accepted == 1)
    # the promises: this llama-server reports logprob 0.0 for every token its speculative step emits (token 2 here:
    # docs/audit-workload.md, docs/repro/llama_server_logprobs_speculative.py), and keeps the others
    promises = {row["promise"]: row for row in record["promises"]}
    assert promises["logprobs"]["status"] == "broken" and "position 1: 0, position 2:" in promises["logprobs"]["detail"]
    assert "returned 0.0" in promises["logprobs"]["first"], promises["logprobs"]
    assert promises["seeds under batching"]["status"] == "kept" and promises["greedy"]["status"] == "kept"
    assert promises["acceptance"]["status"] == "diagnostic" and promises["acceptance"]["checked"] >= 10
    assert table.set_index("cell").loc["choice", "endings"] == "choice 40"  # the grammar held


# ------------------------------------------------------------------------------------------ exit status, coupling, looks

TWO_CELLS = {"name": "two", "max_tokens": 3, "cells": [
    {"name": "t1", "prompt": "HAMLET."},
    {"name": "rep", "prompt": "ROMEO:\n", "repetition_penalty": 1.3, "temperature": 0.7}]}


def workload_file(tmp_path, spec: dict) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(spec))
    return path


def test_inconclusive_exits_3_never_0(pair, tmp_path):
    """A lossless server at 60 samples a cell: nothing rejected, nothing certified — exit 3, and results.json says so."""
    from specdec_lab.cli import main

    with served(pair, BatchServerConfig()) as server:
        code = main(["audit", "workload", "--base-url", server.base_url, "--workload",
                     str(workload_file(tmp_path, TWO_CELLS)), "--samples", "60", "--out", str(tmp_path / "out"),
                     "--quiet"])
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert code == 3 == record["exit_status"]
    assert [row["verdict"] for row in record["rows"]] == ["inconclusive"] * 2
    assert {"sampler", "m", "tv_upper", "verdict", "endings_counts", "confidence"} <= set(record["rows"][0])


def test_coupling_certifies_a_replaying_server_in_a_few_hundred_requests(pair, tmp_path):
    """Two lossless servers that replay a seed's sample: same-seed outcomes never differ, so 400 pairs per cell certify
    TV(server, reference) <= 0.02 by coupling (simultaneously over the two cells), exit 0; the exact-mode bounds at
    400 samples are far from it."""
    from specdec_lab.cli import main

    with served(pair, BatchServerConfig()) as server, served(pair, BatchServerConfig()) as reference:
        code = main(["audit", "workload", "--base-url", server.base_url, "--reference-url", reference.base_url,
                     "--workload", str(workload_file(tmp_path, TWO_CELLS)), "--samples", "400",
                     "--out", str(tmp_path / "out"), "--quiet"])
    two = pd.read_csv(tmp_path / "out" / "two-sample.csv")
    exact = pd.read_csv(tmp_path / "out" / "verdicts.csv")
    assert code == 0, two.to_string()
    assert (two["route"] == "coupling").all() and (two["mismatches"] == 0).all() and (two["pairs"] == 400).all()
    assert (two["TV upper"] <= 0.02).all() and (two["verdict"] == "equivalent").all()
    assert (exact["TV upper"] > 0.05).all()  # what the exact mode certifies from the same 400 samples


def test_coupling_never_certifies_a_server_that_differs(pair, tmp_path):
    """The leaky server against a lossless reference on a mixed group: its mixed cells mismatch their reference, the
    coupling bound stays above ε, and the exact mode rejects (exit 1)."""
    from specdec_lab.cli import main

    mixed = {"max_tokens": 3, "cells": [c for c in PLANTED["cells"] if c["name"] in ("mixed-t1", "mixed-t07")]}
    with served(pair, BatchServerConfig(leak_temperature=True)) as server, \
            served(pair, BatchServerConfig()) as reference:
        code = main(["audit", "workload", "--base-url", server.base_url, "--reference-url", reference.base_url,
                     "--workload", str(workload_file(tmp_path, mixed)), "--samples", "300",
                     "--out", str(tmp_path / "out"), "--quiet"])
    two = pd.read_csv(tmp_path / "out" / "two-sample.csv")
    assert code == 1
    assert (two["mismatches"] > 30).all() and (two["coupling TV upper"] > 0.02).all(), two.to_string()


def test_until_decided_stops_rejected_cells_early(pair, tmp_path):
    """The leaky server under --until-decided: its mixed cells are rejected by the e-process within a few rounds and
    get no more requests; a same-temperature cell goes on until the budget is spent."""
    w = parse_workload({"max_tokens": 3, "cells": [c for c in PLANTED["cells"] if c["name"] in MIXED | {"same-a"}]})
    # a 50 ms batching window: the mixed cells share batches even on a loaded machine (the leak needs them to)
    with served(pair, BatchServerConfig(leak_temperature=True, window=0.05)) as server:
        run = WorkloadRun(server.base_url, tmp_path / "seq", 100, speculative=False, round_requests=50,
                          client=ClientSettings(concurrency=8, progress=False), server_metrics=False)
        found = audit_workload(pair, w, run, budget=1200)
    results = {r.cell.name: r for r in found["results"]}
    # the greedy rows' T = 0 leaks into the T = 1 and T = 0.7 rows and theirs into the greedy rows (impossible outputs);
    # once a mixed cell stops, the others lose its rows as batch partners: the greedy cell (whose leaked outputs are
    # impossible) is caught early; the T = 1 and T = 0.7 cells are caught when their batches mixed enough
    rejected = [name for name in MIXED if results[name].verdict == "rejected"]
    assert "mixed-greedy" in rejected and results["mixed-greedy"].requests <= 100, found["table"].to_string()
    for name in rejected:
        assert results[name].rejected_by == "the e-process"
    assert results["same-a"].verdict != "rejected"  # alone in its group: no leak
    assert results["same-a"].requests > max(results[name].requests for name in rejected)  # the undecided cell kept going
    assert sum(r.requests for r in found["results"]) <= 1200
    looks = json.loads((tmp_path / "seq" / "looks.json").read_text())["looks"]
    assert looks["same-a"] > looks["mixed-greedy"] >= 1
    # the rounds after the mixed cells stopped kept same-a's own block of seeds (its place in the whole workload)
    rows = pd.concat(pd.read_parquet(p) for p in (tmp_path / "seq" / "cells" / "same-a").glob("part-*.parquet"))
    assert rows["request"].max() >= 100 and (rows["seed"] == [request_seed(0, 3, r) for r in rows["request"]]).all()


def test_spending_keeps_the_error_rate_under_resumption():
    """Σ_k α · 6/(π² k²) = α: a run looked at any number of times rejects a correct server with probability <= α
    (the union bound); the first look keeps 6/π² of it."""
    from specdec_lab.workload.sequential import LookLedger, spent

    assert sum(spent(0.01, k) for k in range(1, 10_000)) < 0.01
    assert spent(0.01, 1) == pytest.approx(0.01 * 6 / np.pi ** 2)
    with pytest.raises(ValueError):
        spent(0.01, 0)


def test_workload_bound_covers_under_stratified_sampling():
    """The workload-level bound at 99% under stratified draws (fixed shares per cell): on four cells, two of them
    off by TV 0.05, the bound misses the true mixture TV in at most 3 of 300 replicates, and it is far below what
    four per-cell bounds at δ/4 add up to."""
    from specdec_lab import stats
    from specdec_lab.workload.judge import workload_bound

    rng = np.random.default_rng(5)
    laws = [np.sort(rng.dirichlet(np.full(n, 0.3)))[::-1] for n in (40, 80, 120, 200)]
    served_laws = []
    for i, p in enumerate(laws):
        q = p.copy()
        if i % 2:  # move TV 0.05 from the top outcome to the tail
            q[0] -= 0.05
            q[len(q) // 2:] += 0.05 / (len(q) - len(q) // 2)
        served_laws.append(q)
    sizes = [1500, 1500, 1000, 1000]
    true_tv = sum(m * 0.5 * np.abs(q - p).sum() for m, q, p in zip(sizes, served_laws, laws)) / sum(sizes)
    misses, pooled, separate = 0, [], []
    for _ in range(300):
        per_cell = [(rng.multinomial(m, q), p) for m, q, p in zip(sizes, served_laws, laws)]
        found = workload_bound(per_cell, confidence=0.99)
        misses += found["tv_upper"] < true_tv
        pooled.append(found["tv_upper"])
    for m, (c, p) in zip(sizes, per_cell):
        separate.append(m * stats.tv_upper_bound(c, p, confidence=1 - 0.01 / 4).upper)
    assert misses <= 3, misses
    assert np.median(pooled) < sum(separate) / sum(sizes)


def test_workload_bound_with_impossible_outcomes_or_none():
    """Impossible outcomes make the workload-level bound 1 (no claim); no judged cell makes it NaN."""
    from specdec_lab.workload.judge import workload_bound

    found = workload_bound([(np.array([5, 5, 1]), np.array([0.5, 0.5, 0.0]))])
    assert found["tv_upper"] == 1.0 and found["m"] == 11 and "impossible" in found["route"]
    assert workload_bound([])["m"] == 0


def test_sequential_coupling_certifies_at_the_spent_level_and_stops(pair, tmp_path):
    """--until-decided with --reference-url: look 1 at 200 pairs a cell cannot certify 0.02 (its bound at the spent
    level is ~0.03), so rounds of 100 more follow on both servers until the pairs certify every cell — at look 4, 500
    pairs, with no request beyond it — and the run exits 0."""
    from specdec_lab.cli import main

    with served(pair, BatchServerConfig()) as server, served(pair, BatchServerConfig()) as reference:
        code = main(["audit", "workload", "--base-url", server.base_url, "--reference-url", reference.base_url,
                     "--workload", str(workload_file(tmp_path, TWO_CELLS)), "--samples", "200", "--until-decided",
                     "--budget", "3000", "--out", str(tmp_path / "out"), "--quiet"])
    two = pd.read_csv(tmp_path / "out" / "two-sample.csv")
    assert code == 0, two.to_string()
    assert (two["look"] == 4).all() and (two["pairs"] == 500).all() and (two["route"] == "coupling").all()
    assert (two["TV upper"] <= 0.02).all() and (two["TV upper"] > 0.015).all()
    for side in ("", "reference/"):  # nothing sent after the deciding look
        frame = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / side / "cells").glob("*/part-*.parquet"))
        assert frame["request"].max() == 499
