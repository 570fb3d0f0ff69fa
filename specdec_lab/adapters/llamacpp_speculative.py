"""llama.cpp's ``llama-speculative`` example as a sampler, and the law its stochastic rule samples.

:class:`SpeculativeTool` runs the built ``llama-speculative`` (:mod:`specdec_lab.adapters.llamacpp_build`) once
per sample on f32 GGUF files of the bundled pair and reads the token ids and per-position drafted/accepted flags
from its debug log (:func:`spec_log_positions`); RuntimeError when the tool fails or reads the prompt differently.
:func:`speculative_example_law` is the exact law of one drafted position under the example's rule (it drafts the
draft model's most probable token, not a sample of q), the law such an audit finds instead of p.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

import torch

from specdec_lab.adapters.llamacpp import DRAFT_TOKENS
from specdec_lab.adapters.llamacpp_build import VERSION, engine_binary
from specdec_lab.sampling import SamplingConfig

# In its debug log (-v) every emitted token appears once, in order: an accepted draft token, or the token
# that ends a verification round (a residual sample after a rejection, the bonus token, or the first token).
_SPEC_TOKEN = re.compile(r"draft token \d+ of sequence \d+ \((-?\d+), '.*?'\) (accepted|rejected)"
                         r"|the sampled target token \((-?\d+), ", re.S)
_SPEC_ENCODED = re.compile(r"encoded\s+(\d+) tokens")


@dataclass(frozen=True)
class SpeculativeTool:
    """llama.cpp's ``llama-speculative`` example (stochastic verification at T > 0) as a sampler.

    One process per sample (the tool generates one sequence per run), seeded from the collection's
    generator; the token ids are read from its debug log. ``target``/``draft`` are GGUF files
    (:func:`convert_to_gguf`). It runs at ``-n length``, stops after the verification round that
    passes ``length`` tokens, and the first ``length`` tokens are kept.
    """

    target: str
    draft: str
    sampling: SamplingConfig = SamplingConfig()
    k: int = DRAFT_TOKENS
    threads: int = 1
    progress: bool = True

    def describe(self) -> dict:
        return {"sampler": f"llama.cpp llama-speculative (vendored in llama-cpp-python {VERSION}) K={self.k}",
                "k": self.k, **self.sampling.describe()}

    def command(self, prompt_text: str, length: int, seed: int) -> list[str]:
        s = self.sampling
        top_k = 0 if s.top_k is None else s.top_k
        return [str(engine_binary("llama-speculative")), "-m", self.target, "-md", self.draft, "-p", prompt_text,
                "-n", str(length), "-s", str(seed), "--temp", f"{s.temperature:g}", "--top-k", str(top_k),
                "--top-p", f"{s.top_p:g}", "--min-p", "0", "--repeat-penalty", "1", "-c", "256", "-np", "1",
                "-t", str(self.threads), "-td", str(self.threads), "-ctk", "f32", "-ctv", "f32", "-ctkd", "f32",
                "-ctvd", "f32", "--spec-draft-n-max", str(self.k), "--spec-draft-p-min", "0", "-v"]

    def draw(self, pair, prompt, n, length, generator):
        from tqdm.auto import tqdm

        from specdec_lab.adapters.endpoint import SEED_RANGE
        from specdec_lab.adapters.seeds import distinct_seeds
        from specdec_lab.drafting import add_positions
        from specdec_lab.samplers.protocol import SampleResult, check_request

        check_request(prompt, n, length)
        text = pair.decode(prompt.tolist())
        rows, counts = [], {"processes": 0, "refused_samples": 0, "stopped_early": 0, "reruns": 0}
        counts.update({f"{key}@{t}": 0 for t in range(1, length + 1) for key in ("drafted", "accepted")})
        bar = tqdm(total=n, desc="llama-speculative", leave=False, disable=not self.progress)
        while len(rows) < n:
            for seed in distinct_seeds(generator, n - len(rows), SEED_RANGE):
                found = self._run(pair, text, len(prompt), length, seed, counts)
                if found is None:  # an end-of-text token before `length` tokens: refused, as the endpoint does
                    counts["refused_samples"] += 1
                    counts["stopped_early"] += 1
                else:
                    ids, drafted, accepted = found
                    rows.append(ids[:length])
                    add_positions(counts, drafted[:length], accepted[:length])
                    bar.update(1)
        bar.close()
        return SampleResult(torch.tensor(rows, dtype=torch.long), None, counts)

    def _run(self, pair, text: str, prompt_tokens: int, length: int, seed: int, counts: dict) -> tuple | None:
        """One sample: the token ids of one process, checked against the text it printed, and per position
        whether a draft token was verified there and accepted (:func:`spec_log_positions`).

        The tool's logger is asynchronous and loses the tail of its output now and then when the process
        exits; a run whose ids do not decode to its printed text, or that has fewer than ``length`` ids, is
        run again with the same seed (the same sample), up to 3 times. Still short after that: an
        end-of-text token, refused (None).
        """
        ids: list[int] = []
        for _ in range(3):
            counts["processes"] += 1
            done = subprocess.run(self.command(text, length, seed), capture_output=True, text=True, errors="replace",
                                  env={**os.environ, "OMP_NUM_THREADS": str(self.threads)})
            log = done.stdout + done.stderr
            if done.returncode != 0:
                raise RuntimeError(f"llama-speculative failed (exit {done.returncode}):\n{log[-3000:]}")
            encoded = _SPEC_ENCODED.search(log)
            if encoded is not None and int(encoded.group(1)) != prompt_tokens:
                raise RuntimeError(f"llama-speculative read the prompt as {encoded.group(1)} tokens, the local "
                                   f"tokenizer as {prompt_tokens} (an added BOS token?)")
            ids, drafted, accepted = spec_log_positions(_SPEC_TOKEN.findall(log))
            printed = done.stdout.strip("\n")
            if printed.startswith(text) and pair.decode(ids) == printed[len(text):] and len(ids) >= length:
                return ids, drafted, accepted
            counts["reruns"] += 1
        return None


def spec_log_positions(entries) -> tuple[list[int], list[int], list[int]]:
    """Emitted ids and per-position drafted/accepted flags from ``llama-speculative``'s log entries
    (``_SPEC_TOKEN`` matches, in order: ``(draft id, "accepted" | "rejected", "")`` or ``("", "", target id)``).

    A position is drafted when a draft token was checked there: an accepted draft emits it; a rejected
    one is followed by the verifier's own token for the same position (the residual sample). A target
    token not preceded by a rejection is the first token or a bonus token: not drafted.

    >>> spec_log_positions([("", "", "5"), ("7", "accepted", ""), ("8", "rejected", ""), ("", "", "9"), ("", "", "4")])
    ([5, 7, 9, 4], [0, 1, 1, 0], [0, 1, 0, 0])
    """
    ids, drafted, accepted, rejected_here = [], [], [], False
    for draft_id, verdict, target_id in entries:
        if verdict == "rejected":
            rejected_here = True
            continue
        ids.append(int(draft_id or target_id))
        drafted.append(int(verdict == "accepted" or rejected_here))
        accepted.append(int(verdict == "accepted"))
        rejected_here = False
    return ids, drafted, accepted


def speculative_example_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law of one drafted position under ``llama-speculative``'s stochastic rule (one draft sequence).

    The example drafts the *most probable* draft token x* (``cur_p->data[0]`` after sorting) instead of
    a sample of q, then accepts it with probability min(1, p(x*)/q(x*)) and otherwise samples the residual
    (p − q)₊ / Σ(p − q)₊ — modified rejection sampling, which is exact only for a draft token drawn from q.
    Output law: a·δ(x*) + (1 − a)·residual with a = min(1, p(x*)/q(x*)). ``p``, ``q``: (V,) laws after the
    sampler chain.

    >>> law = speculative_example_law(torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1]))
    >>> [round(v, 3) for v in law.tolist()]   # p is (0.5, 0.5); the example gives 5/9 to the draft's favourite
    [0.556, 0.444]
    """
    x = int(torch.argmax(q))
    accept = min(1.0, float(p[x] / q[x]))
    residual = torch.clamp(p - q, min=0)
    law = (1 - accept) * residual / residual.sum() if residual.sum() > 0 else torch.zeros_like(p)
    law[x] += accept
    return law
