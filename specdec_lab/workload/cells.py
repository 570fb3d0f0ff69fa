"""The workload file format: cells (prompt × sampler chain × request options), validated with errors that
name the field."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from specdec_lab.sampling import ChainConfig, SamplingConfig

DEFAULT_WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "default.yaml"
BOUNDED_LENGTH = 2  # tokens 1–2: the positions every verdict bounds


class WorkloadError(ValueError):
    """A malformed workload file; the message names the field."""


@dataclass(frozen=True)
class Cell:
    """One cell: a prompt, its sampling settings and its request options.

    name: unique, a file name (letters, digits, ``-``, ``_``).
    group: cells of one group run concurrently, interleaved request by request; groups run one after another.
    prompt: the prompt text (it must survive the local tokenizer's encode → decode).
    temperature, top_k (None: off), top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty:
        the sampler chain (:class:`specdec_lab.sampling.ChainConfig`).
    seeded: send a distinct ``seed`` with every request (False: no seed field, the engine's own randomness).
    n: completions per request (OpenAI's ``n``).
    logprobs: ask for logprobs (the token ids then come from them; else from the text, split unambiguously).
    stop: stop strings (the cell then bounds the text of tokens 1–2 cut at the stop, see the module docstring).
    choice: structured output, a choice list the engine enforces (llama-server's ``grammar``, vLLM's
        ``structured_outputs.choice``): the cell bounds the law of the completed text, each step's law masked to
        the tokens that keep the text a prefix of a choice (end-of-text once it is one) and renormalised
        (:mod:`specdec_lab.laws.structured`); temperature only (no filters or penalties, whose order against the
        mask engines do not document alike), no stop strings.
    """

    name: str
    prompt: str
    group: str = "mixed"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seeded: bool = True
    n: int = 1
    logprobs: bool = True
    stop: tuple = ()
    choice: tuple = ()

    def chain(self, order: str) -> ChainConfig:
        return ChainConfig(SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p),
                           min_p=self.min_p, presence_penalty=self.presence_penalty,
                           frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                           order=order)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def structured(self) -> bool:
        """A choice-list cell: it bounds the law of the completed text."""
        return bool(self.choice)

    @property
    def observes_text(self) -> bool:
        """A stop string, or no logprobs (so no token ids): the cell bounds the text of tokens 1–2."""
        return not self.structured and (bool(self.stop) or not self.logprobs)

    def request_tokens(self, max_tokens: int) -> int:
        """Tokens asked per request: 2 for a text cell (its law is that of tokens 1–2); a choice cell enough to
        spell its longest choice and end (every token spells at least one character); else the workload's."""
        if self.structured:
            return max(len(c) for c in self.choice) + 1
        return BOUNDED_LENGTH if self.observes_text else max_tokens

    def describe(self) -> dict:
        return {**asdict(self), "stop": list(self.stop), "choice": list(self.choice)}

    def label(self) -> str:
        """Short text of the settings that differ from plain T = 1 sampling.

        >>> Cell("a", "x", temperature=0.7, min_p=0.1, n=4, seeded=False).label()
        'T=0.7 min-p=0.1 n=4 unseeded'
        """
        parts = [f"T={self.temperature:g}"]
        for name, value, neutral, text in (("top_k", self.top_k, None, "top-k"), ("top_p", self.top_p, 1.0, "top-p"),
                                           ("min_p", self.min_p, 0.0, "min-p"),
                                           ("presence", self.presence_penalty, 0.0, "presence"),
                                           ("frequency", self.frequency_penalty, 0.0, "frequency"),
                                           ("repetition", self.repetition_penalty, 1.0, "repetition")):
            if value != neutral:
                parts.append(f"{text}={value:g}")
        if self.n != 1:
            parts.append(f"n={self.n}")
        if not self.seeded:
            parts.append("unseeded")
        if not self.logprobs:
            parts.append("no logprobs")
        if self.stop:
            parts.append("stop=" + "|".join(json.dumps(s) for s in self.stop))
        if self.choice:
            parts.append("choice=" + "|".join(json.dumps(c) for c in self.choice))
        return " ".join(parts)


@dataclass(frozen=True)
class Workload:
    """A named list of cells; ``max_tokens``: new tokens per request (3: llama-server drafts token 2)."""

    name: str
    cells: tuple
    max_tokens: int = 3

    def groups(self) -> dict[str, list[Cell]]:
        found: dict[str, list[Cell]] = {}
        for cell in self.cells:
            found.setdefault(cell.group, []).append(cell)
        return found

    def describe(self) -> dict:
        return {"name": self.name, "max_tokens": self.max_tokens, "cells": [c.describe() for c in self.cells]}


CELL_FIELDS = {f.name: f for f in fields(Cell)}
_NUMBER_RULES = {  # field -> (check, what it must be)
    "temperature": (lambda v: 0 <= v < math.inf, "a number >= 0"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "repetition_penalty": (lambda v: 0 < v <= 10, "a number in (0, 10]"),
}


def _check_cell(raw, where: str) -> Cell:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: must be a mapping of fields, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(CELL_FIELDS))
    if unknown:
        raise WorkloadError(f"{where}.{unknown[0]}: unknown field; valid: {', '.join(CELL_FIELDS)}")
    for required in ("name", "prompt"):
        if not isinstance(raw.get(required), str) or not raw[required]:
            raise WorkloadError(f"{where}.{required}: required, a non-empty string")
    name = raw["name"]
    if not all(ch.isalnum() or ch in "-_" for ch in name):
        raise WorkloadError(f"{where}.name: {name!r} must use only letters, digits, '-' and '_' (it names a file)")
    values = dict(raw)
    for key, (check, what) in _NUMBER_RULES.items():
        if key in values:
            v = values[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not check(v):
                raise WorkloadError(f"{where}.{key}: must be {what}, got {v!r}")
            values[key] = float(v)
    if "top_k" in values and values["top_k"] is not None:
        v = values["top_k"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise WorkloadError(f"{where}.top_k: must be an integer >= 1 (0 or null: off), got {v!r}")
        values["top_k"] = v or None
    for key in ("seeded", "logprobs"):
        if key in values and not isinstance(values[key], bool):
            raise WorkloadError(f"{where}.{key}: must be true or false, got {values[key]!r}")
    n = values.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise WorkloadError(f"{where}.n: must be an integer in [1, 64], got {n!r}")
    if "group" in values and (not isinstance(values["group"], str) or not values["group"]):
        raise WorkloadError(f"{where}.group: must be a non-empty string, got {values['group']!r}")
    if "stop" in values:
        stop = values["stop"]
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise WorkloadError(f"{where}.stop: must be a non-empty string or a list of at most 4, "
                                f"got {values['stop']!r}")
        values["stop"] = tuple(stop)
    if "choice" in values:
        values["choice"] = _check_choice(values, where)
    return Cell(**values)


MAX_CHOICE_CHARS = 15  # a choice cell asks for len(longest) + 1 <= 16 tokens


def _check_choice(values: dict, where: str) -> tuple:
    choice = values["choice"]
    if (not isinstance(choice, list) or not 2 <= len(choice) <= 16 or len(set(choice)) != len(choice)
            or not all(isinstance(c, str) and 0 < len(c) <= MAX_CHOICE_CHARS for c in choice)):
        raise WorkloadError(f"{where}.choice: must be a list of 2 to 16 distinct strings of 1 to {MAX_CHOICE_CHARS} "
                            f"characters, got {choice!r}")
    chained = [k for k, neutral in (("top_k", None), ("top_p", 1.0), ("min_p", 0.0), ("presence_penalty", 0.0),
                                    ("frequency_penalty", 0.0), ("repetition_penalty", 1.0))
               if values.get(k, neutral) != neutral]
    if chained or values.get("stop"):
        raise WorkloadError(f"{where}.choice: a choice cell takes a temperature only (its law masks and renormalises "
                            f"each step's law), not {', '.join(chained) or 'stop'}")
    return tuple(choice)


def parse_workload(raw, source: str = "workload") -> Workload:
    """A validated :class:`Workload` from plain data (a parsed YAML/JSON document)."""
    if not isinstance(raw, dict):
        raise WorkloadError(f"{source}: the top level must be a mapping with 'cells', got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"name", "cells", "max_tokens"})
    if unknown:
        raise WorkloadError(f"{source}: {unknown[0]}: unknown field; valid: name, cells, max_tokens")
    cells = raw.get("cells")
    if not isinstance(cells, list) or not cells:
        raise WorkloadError(f"{source}: cells: required, a non-empty list of cells")
    max_tokens = raw.get("max_tokens", 3)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 2 <= max_tokens <= 16:
        raise WorkloadError(f"{source}: max_tokens: must be an integer in [2, 16], got {max_tokens!r}")
    checked = tuple(_check_cell(c, f"cells[{i}]") for i, c in enumerate(cells))
    seen = set()
    for i, cell in enumerate(checked):
        if cell.name in seen:
            raise WorkloadError(f"cells[{i}].name: {cell.name!r} is used twice")
        seen.add(cell.name)
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise WorkloadError(f"{source}: name: must be a string, got {name!r}")
    return Workload(name, checked, max_tokens)


def load_workload(path: str | Path | None = None) -> Workload:
    """Read and validate a workload file (``.yaml``/``.yml`` or ``.json``); None: the bundled default."""
    path = Path(path) if path is not None else DEFAULT_WORKLOAD
    if not path.exists():
        raise WorkloadError(f"{path}: no such workload file")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise WorkloadError(f"{path}: a workload is a .yaml, .yml or .json file")
    except (ValueError, ImportError) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    except Exception as exc:  # yaml.YAMLError
        raise WorkloadError(f"{path}: not valid YAML: {exc}") from exc
    return parse_workload(raw, str(path))
