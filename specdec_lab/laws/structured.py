"""The exact law of structured output: a choice list the engine enforces with a grammar.

The documented convention of llama.cpp's grammar sampler and of vLLM's structured outputs (xgrammar): at each step
the tokens that would take the text out of the language are masked, the others keep their law, renormalised; once
the text is a complete choice, end-of-text is allowed (and continuing, where a longer choice extends it). With a
temperature-only chain, masking before or after the temperature gives the same law, and llama.cpp's "sample, check,
resample with the mask" (``common_sampler_sample``) draws from it too: P(t) = p(t) + (1 − P(allowed)) · p(t) /
P(allowed) = p(t) / P(allowed) for an allowed t. At T = 0 the step takes the allowed token of largest logit.

The law of the completed **text** sums over every tokenization that spells it (a grammar admits any token whose
text keeps the string a prefix of a choice, not only the tokenizer's own split): a walk over the tree of allowed
token sequences, one target forward per node.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def next_logits(pair, contexts: list[list[int]]) -> torch.Tensor:
    """(B, V) float64: the target's logits after each of ``contexts`` (token ids, all of one length)."""
    ids = torch.tensor(contexts, dtype=torch.long, device=pair.device)  # (B, T)
    return pair.target(ids).logits[:, -1, : pair.vocab_size].double().cpu()


def allowed_tokens(text: str, choices: tuple, pieces: list[str], eos: int | None) -> list[int]:
    """The token ids a choice-list grammar allows after ``text``: those whose piece keeps it a prefix of a choice,
    and end-of-text once it is one.

    >>> allowed_tokens("a", ("ab", "a", "b"), ["<eos>", "a", "b", "ab"], 0)
    [0, 2]
    """
    found = [t for t, piece in enumerate(pieces)
             if t != eos and piece and any(c.startswith(text + piece) for c in choices)]
    if eos is not None and text in choices:
        found = sorted(found + [eos])
    return found


def step_law(logits: torch.Tensor, allowed: list[int], temperature: float) -> dict[int, float]:
    """token -> probability of one masked, renormalised step (T = 0: the allowed token of largest logit)."""
    index = torch.tensor(allowed, dtype=torch.long)
    chosen = logits[index]  # (len(allowed),)
    if temperature == 0:
        return {allowed[int(chosen.argmax())]: 1.0}
    probs = torch.softmax(chosen / temperature, dim=-1)
    return {t: float(p) for t, p in zip(allowed, probs)}


def choice_law(pair, prompt_ids: list[int], choices: tuple, temperature: float) -> dict[str, float]:
    """text -> probability of each choice being the completed output (sums to 1).

    Raises ValueError when a choice cannot be spelled by the vocabulary's tokens."""
    pieces = [pair.decode([t]) for t in range(pair.vocab_size)]
    eos = pair.tokenizer.eos_token_id
    if eos is None:
        raise ValueError("a choice cell needs a tokenizer with an end-of-text token (the completion must end)")
    law: dict[str, float] = {}
    frontier = [([], "", 1.0)]  # (generated ids, their text, probability of reaching them): one depth at a time
    while frontier:
        logits = next_logits(pair, [prompt_ids + generated for generated, _, _ in frontier])  # (B, V)
        deeper = []
        for (generated, text, mass), row in zip(frontier, logits):
            allowed = allowed_tokens(text, choices, pieces, eos)
            if not allowed:
                raise ValueError(f"no token continues {text!r} towards a choice of {list(choices)}")
            for token, p in step_law(row, allowed, temperature).items():
                if p == 0.0:
                    continue
                if token == eos:
                    law[text] = law.get(text, 0.0) + mass * p
                else:
                    deeper.append((generated + [token], text + pieces[token], mass * p))
        frontier = deeper
    return law
