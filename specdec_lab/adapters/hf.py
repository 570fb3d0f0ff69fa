"""Hugging Face ``model.generate`` as a sampler: assisted generation, prompt lookup, plain sampling.

p = target, q = draft. What transformers 5.24 does (read from ``transformers/generation/utils.py``
and ``candidate_generator.py``):

- ``assisted`` — ``target.generate(assistant_model=draft, do_sample=True)``. An
  ``AssistedCandidateGenerator`` runs ``draft.generate`` for up to ``num_assistant_tokens`` tokens
  with the target's own logits processors (temperature, top-k, top-p), so q is the processed draft
  law the candidates were sampled from; the draft also stops early once its own probability of a
  drafted token falls below ``assistant_confidence_threshold`` (default 0.4). The target scores all
  candidates in one pass and ``_speculative_sampling`` applies Leviathan et al.'s Algorithm 1:
  accept while U ≤ p/q, on rejection sample norm((p − q)+), after K accepts a bonus token from p.
  The number of candidates is capped at ``max_length − current length − 1``, so with L new tokens
  the first step drafts at most L − 1 of them.
- ``prompt_lookup`` — ``generate(prompt_lookup_num_tokens=K, do_sample=True)``: candidates are
  copied from the prompt after the latest earlier occurrence of its last 1–2 tokens; there is no q,
  so the target samples every position from p and keeps candidates while its sample equals them
  (the point-mass rule, lossless).
- ``plain`` — ``generate(do_sample=True)`` without an assistant: HF's own sampler, the baseline.

Assisted generation is batch-1 only upstream ("assisted generate is only supported for
batch_size = 1"), so :func:`sample_hf` loops over samples, one ``generate`` call each, with a progress bar.

Settings the adapter forces, each because HF would otherwise not sample from the law asked for:
exactly L new tokens (``max_new_tokens = min_new_tokens = L`` and ``eos_token_id=None``, so an
end-of-text token is an ordinary token and never stops or truncates a sample); ``top_k=0`` when no
top-k is asked (HF's global default is top-k 50); ``top_p``, ``temperature`` from the
:class:`~specdec_lab.sampling.SamplingConfig`; and the other warpers and penalties that a model's
``generation_config.json`` may switch on (min-p, typical-p, ε/η cutoffs, top-h, repetition penalty,
n-gram blocking) set to their neutral values.

Randomness: HF draws from torch's *global* generator (``torch.multinomial`` and
``torch.rand_like`` without a ``generator=`` argument); its API offers no other way. So each
sample gets a seed drawn from the ``torch.Generator`` passed in, and the global generator is seeded
with it inside ``torch.random.fork_rng``, which restores the caller's global RNG state afterwards.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request

MODES = {
    "assisted": "generate(assistant_model=draft, do_sample=True): Leviathan/Chen rejection sampling",
    "prompt_lookup": "generate(prompt_lookup_num_tokens=K, do_sample=True): n-gram candidates, point-mass rule",
    "plain": "generate(do_sample=True): HF's own sampler, no speculation",
}
SCHEDULES = ("constant", "heuristic", "heuristic_transient")  # HF's num_assistant_tokens_schedule values

# Neutral values for every logits warper / penalty a model's generation_config could switch on.
NEUTRAL = {"min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None,
           "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
           "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None}


def transformers_version() -> str:
    import transformers

    return transformers.__version__


@dataclass(frozen=True)
class HFGenerateConfig:
    """Settings of one HF ``generate`` audit.

    mode: one of :data:`MODES`.
    sampling: the temperature / top-k / top-p passed to HF (and, by default, the law it is scored against).
    k: draft tokens per target pass — ``num_assistant_tokens`` (assisted) or
       ``prompt_lookup_num_tokens`` (prompt lookup); 4 like :mod:`specdec_lab.verify` (HF's own default is 20).
    schedule: HF's ``num_assistant_tokens_schedule``; "constant" keeps K fixed.
    confidence_threshold: HF's ``assistant_confidence_threshold`` (its default 0.4; 0 disables it).
    progress: show a per-sample progress bar (not part of the recorded settings).
    """

    mode: str = "assisted"
    sampling: SamplingConfig = SamplingConfig()
    k: int = 4
    schedule: str = "constant"
    confidence_threshold: float = 0.4
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown HF mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (draft tokens per target pass) must be an integer >= 1, got {self.k!r}")
        if not 0.0 <= self.confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must lie in [0, 1), got {self.confidence_threshold!r}")

    def describe(self) -> dict:
        described = {"sampler": "hf_generate", "mode": self.mode, "transformers_version": transformers_version(),
                     "torch_version": torch.__version__, **self.sampling.describe()}
        if self.mode == "assisted":
            described.update(k=self.k, schedule=self.schedule, confidence_threshold=self.confidence_threshold)
        elif self.mode == "prompt_lookup":
            described.update(k=self.k)
        return described

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_hf(pair, prompt, n, length, self, generator)


def generate_kwargs(pair, config: HFGenerateConfig, length: int) -> dict:
    """Keyword arguments for ``target.generate`` that ask for exactly ``config`` and L new tokens.

    >>> from specdec_lab.models import load_pair
    >>> kw = generate_kwargs(load_pair("bundled"), HFGenerateConfig(mode="plain"), 3)
    >>> kw["top_k"], kw["max_new_tokens"], kw["min_new_tokens"], kw["eos_token_id"]
    (0, 3, 3, None)
    """
    s = config.sampling
    pad = pair.target.generation_config.pad_token_id
    kwargs = {"max_new_tokens": length, "min_new_tokens": length, "eos_token_id": None,
              "pad_token_id": 0 if pad is None else pad, "do_sample": not s.greedy, **NEUTRAL}
    if not s.greedy:
        kwargs.update(temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p)
    if config.mode == "assisted":
        kwargs["assistant_model"] = pair.draft
    elif config.mode == "prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = config.k
    return kwargs


@contextlib.contextmanager
def assistant_settings(draft, config: HFGenerateConfig):
    """Set K, the schedule and the confidence threshold on the draft's generation_config (where HF
    reads them); restore the old values on exit."""
    names = {"num_assistant_tokens": config.k, "num_assistant_tokens_schedule": config.schedule,
             "assistant_confidence_threshold": config.confidence_threshold}
    generation_config = draft.generation_config
    saved = {name: getattr(generation_config, name, None) for name in names}
    try:
        yield lambda: [setattr(generation_config, name, value) for name, value in names.items()]
    finally:
        for name, value in saved.items():
            setattr(generation_config, name, value)


class StepRecorder(contextlib.AbstractContextManager):
    """Records HF's speculative steps: wraps the candidate generator that ``generate`` builds, so each step's
    (sequence length before it, candidates proposed, candidates accepted) is kept (HF's own ``candidate_length``
    and ``n_matches``, read where ``_assisted_decoding`` hands them to the generator)."""

    def __init__(self, model) -> None:
        self.model, self.steps = model, []

    def __enter__(self) -> "StepRecorder":
        original = self.model._get_candidate_generator  # bound method of the model's class
        steps = self.steps

        def wrapped(*args, **kwargs):
            generator = original(*args, **kwargs)
            get_candidates, update = generator.get_candidates, generator.update_candidate_strategy
            pending = {}

            def candidates(input_ids, *a, **kw):
                out = get_candidates(input_ids, *a, **kw)
                pending.update(cur_len=input_ids.shape[1], proposed=out[0].shape[1] - input_ids.shape[1])
                return out

            def update_strategy(input_ids, scores, num_matches):
                steps.append((pending["cur_len"], pending["proposed"], int(num_matches)))
                return update(input_ids, scores, num_matches)

            generator.get_candidates, generator.update_candidate_strategy = candidates, update_strategy
            return generator

        self.model._get_candidate_generator = wrapped  # an instance attribute shadows the class's method
        return self

    def take(self) -> list:
        steps, self.steps[:] = list(self.steps), []
        return steps

    def __exit__(self, *exc) -> None:
        del self.model._get_candidate_generator


class PassCounter(contextlib.AbstractContextManager):
    """Counts forward calls of a module (one per target pass) through a forward hook."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.count, self._handle = module, 0, None

    def __enter__(self) -> "PassCounter":
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def _hook(self, *_) -> None:
        self.count += 1

    def __exit__(self, *exc) -> None:
        self._handle.remove()


@torch.no_grad()
def sample_hf(pair, prompt: torch.Tensor, n: int, length: int, config: HFGenerateConfig,
              generator: torch.Generator) -> SampleResult:
    """Draw ``n`` continuations of exactly ``length`` tokens from HF ``generate``, one call each.

    Returns tokens (n, L) and stats: target and draft forward passes and emitted tokens (so
    tokens per target pass = emitted_tokens / target_passes; the first pass of each call also
    reads the prompt), and per position t the samples whose token t was a verified draft token
    (``drafted@t``) and an accepted one (``accepted@t``), from HF's candidate lengths and matches per
    step (:class:`StepRecorder`, :mod:`specdec_lab.drafting`).
    """
    from specdec_lab.drafting import add_positions, positions_from_steps

    check_request(prompt, n, length)
    seeds = torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()
    ids = prompt[None].to(pair.device)  # (1, P)
    kwargs = generate_kwargs(pair, config, length)
    tokens = torch.empty(n, length, dtype=torch.long)
    devices = [] if pair.device.type == "cpu" else [pair.device]
    positions: dict = {}
    with assistant_settings(pair.draft, config) as reset_assistant, PassCounter(pair.target) as target, \
            PassCounter(pair.draft) as draft, StepRecorder(pair.target) as recorder, \
            torch.random.fork_rng(devices=devices):
        for i in tqdm(range(n), desc=f"HF {config.mode}", unit="samples", leave=False, disable=not config.progress):
            reset_assistant()  # the heuristic schedule writes its adapted K back after every call
            torch.manual_seed(seeds[i])  # HF samples from the global RNG: forced by its API
            out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)  # (1, P + L)
            new = out[0, ids.shape[1]:]
            if new.numel() != length:
                raise RuntimeError(f"HF generate returned {new.numel()} new tokens, asked for exactly {length}")
            tokens[i] = new.cpu()
            add_positions(positions, *positions_from_steps(recorder.take(), ids.shape[1], length))
    return SampleResult(tokens, None, {"target_passes": target.count, "draft_passes": draft.count,
                                       "emitted_tokens": n * length, **positions})
