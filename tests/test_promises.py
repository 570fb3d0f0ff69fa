"""The exact promises of ``audit workload`` (:mod:`specdec_lab.workload.promises`) against our own batching server:
a lossless one breaks none; each planted fault — logprobs of 0.0, a seeded request losing its seed beside an
unseeded one, a grammar mask missing at one position — is caught (exit 1) at 200 samples a cell, and the promises add at most 10 % requests."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specdec_lab.adapters.batch_server import BatchServerConfig, served
from specdec_lab.models import load_pair
from specdec_lab.workload.cells import Cell, WorkloadError, parse_workload
from specdec_lab.laws.structured import choice_law

CHOICE = [" ay", " no", " sir"]
WORKLOAD = {"name": "promises", "max_tokens": 3, "cells": [
    {"name": "t1", "prompt": "HAMLET."},
    {"name": "greedy", "prompt": "ROMEO:\n", "temperature": 0.0},
    {"name": "unseeded", "prompt": "JULIET:\n", "seeded": False},
    {"name": "choice", "prompt": "ROMEO:\nShall I go? Answer:", "choice": CHOICE},
]}


@pytest.fixture(scope="module")
def pair():
    return load_pair("bundled")


def audit(pair, tmp_path, config: BatchServerConfig, samples: int = 200) -> tuple[int, dict, pd.DataFrame]:
    from specdec_lab.cli import main

    path = tmp_path / "w.json"
    path.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "out"
    with served(pair, config) as server:
        code = main(["audit", "workload", "--base-url", server.base_url, "--workload", str(path), "--samples",
                     str(samples), "--out", str(out), "--quiet"])
    record = json.loads((out / "results.json").read_text())
    promises = {row["promise"]: row for row in record["promises"]}
    return code, promises, pd.read_csv(out / "verdicts.csv")


def test_lossless_server_keeps_every_promise(pair, tmp_path):
    code, promises, table = audit(pair, tmp_path, BatchServerConfig())
    assert code == 3, table.to_string()  # nothing rejected, nothing broken; 200 samples certify nothing
    assert promises["logprobs"]["status"] == "kept" and promises["logprobs"]["checked"] >= 3 * 200
    assert promises["seeds under batching"]["status"] == "kept"
    assert promises["seeds under batching"]["checked"] == 2 * 3 * 5  # alone and mixed, 5 of 200 in each seeded cell
    assert promises["greedy"]["status"] == "kept" and promises["greedy"]["checked"] == 200
    choice = table.set_index("cell").loc["choice"]
    assert choice["verdict"] != "rejected" and choice["endings"] == "choice 200"
    # the extra requests: each seeded cell resends 5 of its 200 alone and 5 more beside 5 fillers: 45 of 800
    assert promises["seeds under batching"]["checked"] * 1.5 / (4 * 200) <= 0.10


def test_planted_broken_promises_each_flagged(pair, tmp_path):
    """One server with three planted faults, each breaking one promise while every sampled law stays exact: logprobs
    of 0.0 (flagged from the first request), a seeded request batched with an unseeded one losing its seed (resent
    requests differ), and the grammar mask missing at the second token (the choice cell rejected: texts no choice
    spells)."""
    code, promises, table = audit(pair, tmp_path, BatchServerConfig(zero_logprobs=True, batch_seeds=True,
                                                                    grammar_gap=True, window=0.05))
    assert code == 1
    logprobs, seeds = promises["logprobs"], promises["seeds under batching"]
    assert logprobs["status"] == "broken" and logprobs["broken"] >= 0.5 * logprobs["checked"], logprobs
    assert "returned 0.0" in logprobs["first"]
    assert seeds["status"] == "broken" and seeds["broken"] >= 3, seeds
    verdicts = table.set_index("cell")["verdict"]
    assert verdicts["choice"] == "rejected" and "impossible text" in table.set_index("cell").loc["choice", "endings"]
    assert not (verdicts.drop("choice") == "rejected").any(), table.to_string()  # the other laws are exact


def test_choice_law_sums_over_tokenizations(pair):
    """The law of the completed choice is a law, greedy is a point mass, and a choice cell refuses filters."""
    ids = pair.encode("ROMEO:\nShall I go? Answer:").tolist()
    law = choice_law(pair, ids, tuple(CHOICE), 1.0)
    assert set(law) == set(CHOICE) and abs(sum(law.values()) - 1) < 1e-12 and min(law.values()) > 0.01
    assert list(choice_law(pair, ids, tuple(CHOICE), 0.0).values()) == [1.0]
    with pytest.raises(WorkloadError, match="temperature only"):
        parse_workload({"cells": [{"name": "c", "prompt": "x", "choice": ["a", "b"], "top_k": 5}]})
    assert Cell("c", "x", choice=("ab", "c")).request_tokens(3) == 3


def test_greedy_comparison_tells_near_ties_from_divergences(pair):
    """Two greedy completions of one request: equal, or differing at a token whose logit is far below the largest (a
    real divergence, naming the side off the argmax), or within the numerics of it (a near tie)."""
    from specdec_lab.workload.promises import GreedyOracle, compare_greedy

    cell = Cell("g", "ROMEO:\n", temperature=0.0)
    prompt = pair.encode(cell.prompt).tolist()
    oracle = GreedyOracle(pair, "llama.cpp")
    first = int(oracle.logits(cell, prompt, []).argmax())
    logits = oracle.logits(cell, prompt, [first])
    best, worst = int(logits.argmax()), int(logits.argmin())
    assert compare_greedy(oracle, cell, prompt, [first, best], [first, best], 0.01)[0] == "same"
    kind, found = compare_greedy(oracle, cell, prompt, [first, worst], [first, best], 0.01)
    assert kind == "divergence" and found["position"] == 2 and found["off the argmax"] == "server"
    gap = float(logits[best] - logits[worst])
    assert compare_greedy(oracle, cell, prompt, [first, worst], [first, best], gap + 1)[0] == "near tie"
    assert oracle.classify(cell, prompt, [first, best], 0.01) == ("argmax", -1, 0.0)


def test_resent_requests_carry_the_seeds_on_record():
    """A resent request is the first one again: the seed its rows record (a sequential round may have sent another
    block than a recomputation would give), its cell's body."""
    import pandas as pd

    from specdec_lab.workload.cells import Workload
    from specdec_lab.workload.promises import resend_jobs

    frame = pd.DataFrame({"request": range(100), "choice": 0, "status": 200, "seed": [1000 + 7 * r for r in range(100)]})
    jobs = resend_jobs(Workload("w", (Cell("a", "HAMLET.", temperature=0.7),)), {"a": frame}, "llama.cpp", "m")
    assert [(j.key, j.index, j.body["seed"], j.body["temperature"]) for j in jobs] == [
        ("a", 0, 1000, 0.7), ("a", 33, 1231, 0.7), ("a", 66, 1462, 0.7)]
