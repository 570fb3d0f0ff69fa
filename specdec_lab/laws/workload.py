"""Exact laws of a workload's cells: tokens 1–2 under a cell's whole sampler chain (penalties, min-p, in the
engine's order), the client-visible outcomes of text cells, and the completed text of choice cells.

A cell is anything with ``prompt``, ``stop`` and ``chain(order)`` (:class:`specdec_lab.workload.cells.Cell`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from specdec_lab.laws.structured import choice_law
from specdec_lab.laws.target import two_token_logits
from specdec_lab.sampling import ChainConfig, chain_probs


class Cell(Protocol):
    """What a law needs of a workload cell (:class:`specdec_lab.workload.cells.Cell`)."""

    prompt: str
    stop: tuple
    choice: tuple

    def chain(self, order: str) -> ChainConfig: ...


class LawBook:
    """Exact laws of the cells: the target's logits after each prompt are computed once (V + 1 chains) and shared
    by the cells that use the prompt."""

    def __init__(self, pair, order: str) -> None:
        self.pair, self.order = pair, order
        self._logits: dict[str, torch.Tensor] = {}
        self._choices: dict[tuple, tuple[dict, np.ndarray]] = {}
        self.texts = [pair.decode([i]) for i in range(pair.vocab_size)]

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        ids = self.pair.encode(prompt)
        if self.pair.encode(self.pair.decode(ids.tolist())).tolist() != ids.tolist():
            raise ValueError(f"prompt {prompt[:40]!r}... does not survive decode → encode; the server would see "
                             "other tokens")
        return ids

    def logits(self, prompt: str) -> torch.Tensor:
        if prompt not in self._logits:
            logits, _ = two_token_logits(self.pair, self.prompt_ids(prompt))
            self._logits[prompt] = logits.cpu()  # (V, 2, V)
        return self._logits[prompt]

    def joint(self, cell: Cell) -> np.ndarray:
        """The exact joint law (V * V,) of tokens 1–2 under ``cell``'s sampler chain, cell x1 * V + x2."""
        V = self.pair.vocab_size
        chain = cell.chain(self.order)
        prompt = self.prompt_ids(cell.prompt).tolist()
        logits = self.logits(cell.prompt)
        first = chain_probs(logits[0, 0], chain, *chain.counts(prompt, [], V))  # (V,)
        if chain.penalised:  # position 2 counts the prompt and x1, for each x1
            counts = [chain.counts(prompt, [x1], V) for x1 in range(V)]
            context = torch.stack([c for c, _ in counts])  # (V, V)
            output = torch.stack([o for _, o in counts])  # (V, V)
            cond = chain_probs(logits[:, 1], chain, context, output)
        else:
            cond = chain_probs(logits[:, 1], chain)  # (V, V) row x1
        return (first[:, None] * cond).reshape(-1).numpy()

    def stop_outcomes(self, cell: Cell) -> tuple[dict, np.ndarray]:
        """The client-visible outcomes of a text cell (text of tokens 1–2 cut before the first stop string, if any,
        or an end-of-text token, and whether it stopped) → index, and their exact law (push-forward of
        :meth:`joint`)."""
        V, eos = self.pair.vocab_size, self.pair.tokenizer.eos_token_id
        joint = self.joint(cell)
        index: dict = {}
        law: list[float] = []
        for cell_id in np.flatnonzero(joint > 0):
            x1, x2 = divmod(int(cell_id), V)
            key = stop_outcome([x1, x2], self.texts, cell.stop, eos)
            if key not in index:
                index[key] = len(law)
                law.append(0.0)
            law[index[key]] += float(joint[cell_id])
        return index, np.array(law)

    def choice_outcomes(self, cell: Cell) -> tuple[dict, np.ndarray]:
        """The outcomes of a choice cell — (completed text, stopped) for each choice — → index, and their exact law
        (:func:`specdec_lab.laws.structured.choice_law`, computed once per prompt, choices and temperature)."""
        key = (cell.prompt, tuple(cell.choice), cell.chain(self.order).sampling.temperature)
        if key not in self._choices:
            law = choice_law(self.pair, self.prompt_ids(cell.prompt).tolist(), key[1], key[2])
            self._choices[key] = ({(text, True): i for i, text in enumerate(law)}, np.array(list(law.values())))
        return self._choices[key]


def stop_outcome(tokens: list[int], texts: list[str], stop: tuple, eos: int | None) -> tuple[str, bool]:
    """(text shown, stopped) of generated tokens under stop strings: the text up to the first stop string or
    end-of-text token.

    >>> stop_outcome([0, 1], ["a,", "b"], (",",), None), stop_outcome([1, 2], ["a", "b", "c"], (",",), 2)
    (('a', True), ('b', True))
    """
    text = ""
    for token in tokens:
        if eos is not None and token == eos:
            return text, True
        text += texts[token]
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return text[: min(hits)], True
    return text, False
