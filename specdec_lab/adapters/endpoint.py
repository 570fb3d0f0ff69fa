"""An OpenAI-compatible ``/v1/completions`` server as a sampler (vLLM, TensorRT-LLM, llama.cpp, ...).

The server holds the model; the audit holds a local copy of the same target and scores the
server's samples under the exact law p (:mod:`specdec_lab.audit`). Each request asks for
``max_tokens = L`` new tokens after the prompt text with the temperature / top-p (/ top-k) of the
:class:`~specdec_lab.sampling.SamplingConfig`, ``n`` choices, a ``seed`` drawn from the collection's
generator (distinct within a batch), ``logprobs`` when asked, and any ``extra`` fields — e.g.
:data:`LLAMA_CPP_NEUTRAL`, which switches llama.cpp's own sampler defaults (top-k 40, min-p 0.05,
repeat penalty 1.1) to neutral values; without it the audit (correctly) rejects the server.

Mapping completions back to token ids (the tokens must be the ones the server sampled):

1. the per-token entries of ``logprobs``: ``logprobs.content[i].id`` (llama.cpp's ``llama-server``
   answers in this chat-style form, with the token id) is taken as is; the pieces in
   ``logprobs.tokens`` — ``token_id:123`` entries (vLLM's ``return_tokens_as_token_ids``) are taken
   as ids; text pieces are looked up in the local vocabulary and used when every piece names
   exactly one token and they join to the text;
2. otherwise the completion text itself, accepted only when it splits into exactly L vocabulary
   tokens in exactly **one** way (counted by dynamic programming over the text).

Anything else — fewer than L tokens (an end-of-text token was sampled), an ambiguous or
unmappable text — is **refused**, counted in the stats (``refused_samples``) and replaced by a
new request. Refusals condition the law, so they are never dropped silently: the audit adds the refused share's
Clopper–Pearson bound to its TV bound (TV(Q, p) ≤ TV(Q | kept, p) + Q(refused): :func:`specdec_lab.audit.with_refusals`)
and the table reports their number; with the bundled byte-level tokenizer and plain-text output they do not occur.

Speculation counters: with ``server_metrics=True`` the server's Prometheus ``/metrics`` is read
before and after each batch and the differences of the counters vLLM and llama.cpp's ``llama-server``
both export (``*:spec_decode_num_drafts_total`` = verification steps, ``..._draft_tokens_total``,
``..._accepted_tokens_total``; llama.cpp's ``n_decode_total`` = target passes and
``tokens_predicted_total`` = emitted tokens) go into the batch's stats, so the audit table can say how
often the speculative path actually ran. The server must serve nothing else meanwhile. With a
``drafting_rule`` (:data:`specdec_lab.drafting.COUNTER_RULES`) the counters are also turned into the
samples whose token 2 was drafted (``drafted@2``, ``accepted@2``) where they attribute exactly; with
``drafting_rule="lookup-calls"`` (llama-cpp-python's prompt lookup served by
:mod:`specdec_lab.adapters.lookup_server`) the server's log of draft calls gives them per sample.

Transport: stdlib ``urllib``, a timeout per request, retries with exponential backoff on
connection errors, timeouts, HTTP 429 and 5xx, and at most ``max_rate`` requests per second.
Other HTTP errors (a bad parameter) fail at once with the server's message. Resuming is
:func:`specdec_lab.collect.collect`'s: finished batches are kept on disk.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from specdec_lab.adapters.seeds import distinct_seeds
from specdec_lab.drafting import COUNTER_RULES
from specdec_lab.sampling import SamplingConfig
from specdec_lab.samplers.protocol import SampleResult, check_request

# llama.cpp's sampler chain applies these unless told otherwise (llama-cpp-python server defaults:
# top_k 40, min_p 0.05, repeat_penalty 1.1); the neutral values leave the model's law untouched.
LLAMA_CPP_NEUTRAL = (("top_k", 0), ("min_p", 0.0), ("typical_p", 1.0), ("repeat_penalty", 1.0),
                     ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("mirostat_mode", 0))
# The same for llama.cpp's own llama-server, whose request fields are named differently (``mirostat``)
# and which also has DRY, XTC and top-n-sigma samplers (off by default; sent off explicitly).
LLAMA_SERVER_NEUTRAL = (("top_k", 0), ("min_p", 0.0), ("typical_p", 1.0), ("repeat_penalty", 1.0),
                        ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("mirostat", 0),
                        ("dry_multiplier", 0.0), ("xtc_probability", 0.0), ("top_n_sigma", -1.0))
# Prometheus counters (name suffix -> stats key); vLLM and llama.cpp share the spec_decode_* names
SERVER_COUNTERS = {"spec_decode_num_drafts_total": "verify_steps",
                   'spec_decode_num_accepted_tokens_per_pos_total{position="0"}': "accepted_first",
                   "spec_decode_num_draft_tokens_total": "draft_tokens",
                   "spec_decode_num_accepted_tokens_total": "accepted_tokens",
                   "n_decode_total": "target_passes", "tokens_predicted_total": "emitted_tokens"}
RETRY_STATUS = (429, 500, 502, 503, 504)
SEED_RANGE = 2**32 - 1  # llama.cpp seeds are uint32; 0xFFFFFFFF means "random" there


class EndpointError(RuntimeError):
    """The server failed or answered something the audit cannot use."""


@dataclass(frozen=True)
class EndpointConfig:
    """Settings of one endpoint audit.

    base_url: e.g. ``http://127.0.0.1:8080`` (``/v1/completions`` is appended); not recorded in the
        sample file's metadata, so a restarted server on another port resumes the same collection.
    model: the ``model`` field of each request.
    sampling: temperature / top-k / top-p sent to the server (and, by default, the law scored).
    extra: further request fields as (name, value) pairs, e.g. :data:`LLAMA_CPP_NEUTRAL`.
    n_per_request: OpenAI's ``n`` (choices per request); some servers ignore it (counted).
    logprobs: ask for this many logprobs per token (the per-token pieces map text to ids); None: don't.
    server: a label for reports, e.g. "llama-cpp-python 0.3.36 (prompt lookup)".
    server_metrics: read the server's ``/metrics`` counters around each batch (see the module docstring).
    timeout, retries, backoff: seconds per request, retries after the first try, first backoff
        (doubling each retry).
    max_rate: at most this many requests per second.
    seed_high, seed_step: request seeds are distinct multiples of ``seed_step`` below ``seed_high``
        (vLLM derives the n completions' seeds as s, s + 1, ..., s + n − 1: step n keeps requests'
        streams apart; llama.cpp's seeds are uint32, the default range).
    concurrency: requests in flight at once (bounded), so a larger server is kept busy.
    min_tokens: also send ``min_tokens = max_tokens`` (vLLM), so no completion stops early.
    """

    base_url: str
    model: str
    sampling: SamplingConfig = SamplingConfig()
    extra: tuple = ()
    n_per_request: int = 1
    logprobs: int | None = 1
    server: str | None = None
    server_metrics: bool = False
    timeout: float = 30.0
    retries: int = 5
    backoff: float = 0.5
    max_rate: float = 200.0
    seed_high: int = SEED_RANGE
    seed_step: int = 1
    concurrency: int = 1
    min_tokens: bool = False
    progress: bool = True
    speculative: bool | None = None  # does the server speculate? None: unknown (judged as speculative)
    drafting_rule: str | None = None  # how its counters attribute drafts to token 2 (see the module docstring)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.seed_step < 1 or self.concurrency < 1 or self.seed_high <= self.seed_step:
            raise ValueError("need seed_step >= 1, concurrency >= 1 and seed_high > seed_step")
        if self.n_per_request < 1 or self.retries < 0 or self.timeout <= 0 or self.max_rate <= 0:
            raise ValueError("need n_per_request >= 1, retries >= 0, timeout > 0 and max_rate > 0")
        if self.sampling.greedy:
            raise ValueError("temperature 0 is a deterministic law; audit a sampling temperature > 0")
        from specdec_lab.drafting import COUNTER_RULES

        if self.drafting_rule not in (None, "lookup-calls", *COUNTER_RULES):
            raise ValueError(f"unknown drafting_rule {self.drafting_rule!r}; valid: lookup-calls, "
                             f"{', '.join(COUNTER_RULES)}")

    def describe(self) -> dict:
        return {"sampler": "endpoint", "model": self.model, "server": self.server,
                "n_per_request": self.n_per_request, "logprobs": self.logprobs,
                "extra": {k: v for k, v in self.extra}, "speculative": self.speculative,
                "drafting_rule": self.drafting_rule, **self.sampling.describe()}

    def draw(self, pair, prompt, n, length, generator) -> SampleResult:
        return sample_endpoint(pair, prompt, n, length, self, generator)

    def request_body(self, prompt_text: str, length: int, seed: int) -> dict:
        """The JSON body of one completion request.

        >>> body = EndpointConfig("http://localhost:1", "m", extra=(("min_p", 0.0),)).request_body("Hi", 3, 7)
        >>> body["max_tokens"], body["seed"], body["temperature"], body["top_p"], body["min_p"]
        (3, 7, 1.0, 1.0, 0.0)
        """
        s = self.sampling
        body = {"model": self.model, "prompt": prompt_text, "max_tokens": length, "temperature": s.temperature,
                "top_p": s.top_p, "n": self.n_per_request, "seed": seed, "stream": False}
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        if self.min_tokens:
            body["min_tokens"] = length
        body.update(dict(self.extra))
        if s.top_k is not None:
            body["top_k"] = s.top_k
        return body


class EndpointClient:
    """POSTs JSON with a timeout, retries with exponential backoff and a bounded request rate."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config, self.requests, self.retried, self._last = config, 0, 0, 0.0
        self._lock = threading.Lock()

    def post(self, route: str, body: dict) -> dict:
        c = self.config
        url = c.base_url.rstrip("/") + route
        data = json.dumps(body).encode()
        for attempt in range(c.retries + 1):
            self._wait_for_rate()
            try:
                request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=c.timeout) as response:
                    answer = json.loads(response.read())
                with self._lock:
                    self.requests += 1
                return answer
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                if exc.code not in RETRY_STATUS or attempt == c.retries:
                    raise EndpointError(f"{url} answered HTTP {exc.code}: {detail}") from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == c.retries:
                    raise EndpointError(f"{url} unreachable after {c.retries + 1} tries: {exc}") from exc
            with self._lock:
                self.retried += 1
            time.sleep(c.backoff * 2**attempt)
        raise AssertionError("unreachable")

    def get(self, route: str) -> dict:
        return json.loads(self.get_text(route))

    def get_text(self, route: str) -> str:
        url = self.config.base_url.rstrip("/") + route
        with urllib.request.urlopen(url, timeout=self.config.timeout) as response:
            return response.read().decode()

    def _wait_for_rate(self) -> None:
        with self._lock:  # one request start per 1 / max_rate seconds, across threads
            gap = 1.0 / self.config.max_rate - (time.monotonic() - self._last)
            if gap > 0:
                time.sleep(gap)
            self._last = time.monotonic()


class TokenMap:
    """Completion text → local token ids, refusing anything that is not unambiguous."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        self.by_text: dict[str, list[int]] = {}
        for i in range(vocab_size):
            text = tokenizer.decode([i])
            if text and "\ufffd" not in text:  # pieces of a multi-byte character cannot be matched as text
                self.by_text.setdefault(text, []).append(i)
        self.longest = max(map(len, self.by_text))

    def from_pieces(self, pieces: list[str], text: str) -> list[int] | None:
        """Ids from per-token pieces, or None when a piece is not exactly one token."""
        if all(p.startswith("token_id:") for p in pieces):
            return [int(p.removeprefix("token_id:")) for p in pieces]
        if "".join(pieces) != text:
            return None
        ids = [self.by_text.get(p, []) for p in pieces]
        return [c[0] for c in ids] if all(len(c) == 1 for c in ids) else None

    def from_text(self, text: str, length: int) -> list[int] | None:
        """The one way ``text`` splits into ``length`` vocabulary tokens, or None (none, or several).

        >>> from specdec_lab.models import load_pair
        >>> tm = TokenMap(load_pair("bundled").tokenizer, 512)
        >>> tm.from_text("a", 1) is not None, tm.from_text("a", 2)
        (True, None)
        """
        # ways[i][t] = (number of splits of text[i:] into t tokens, capped at 2; one such split)
        T = len(text)
        ways = [[(0, None)] * (length + 1) for _ in range(T + 1)]
        ways[T][0] = (1, [])
        for i in range(T - 1, -1, -1):
            for j in range(i + 1, min(T, i + self.longest) + 1):
                for token in self.by_text.get(text[i:j], []):
                    for t in range(1, length + 1):
                        count, split = ways[j][t - 1]
                        if count:
                            total = min(2, ways[i][t][0] + count)
                            ways[i][t] = (total, ways[i][t][1] or [token] + split)
        count, split = ways[0][length]
        return split if count == 1 else None


def sample_endpoint(pair, prompt: torch.Tensor, n: int, length: int, config: EndpointConfig,
                    generator: torch.Generator) -> SampleResult:
    """Draw ``n`` completions of exactly ``length`` tokens from the server, refusing unmappable ones."""
    check_request(prompt, n, length)
    text = pair.decode(prompt.tolist())
    if pair.encode(text).tolist() != prompt.tolist():
        raise ValueError("the prompt ids do not survive decode → encode; give the prompt as text")
    client, token_map = EndpointClient(config), TokenMap(pair.tokenizer, pair.vocab_size)
    rows, counts = [], {"requests": 0, "refused_samples": 0, "stopped_early": 0, "missing_choices": 0}
    before = server_counters(client.get_text("/metrics")) if config.server_metrics else {}
    lookup = config.drafting_rule == "lookup-calls"
    calls_before = len(client.get(LOOKUP_ROUTE)["calls"]) if lookup else 0
    outcomes = []  # per request, in order: the sample's token 2, or None when refused (lookup-calls)
    bar = tqdm(total=n, desc=f"endpoint {config.model}", unit="samples", leave=False, disable=not config.progress)
    post = lambda seed: client.post("/v1/completions", config.request_body(text, length, seed))  # noqa: E731
    with ThreadPoolExecutor(config.concurrency) as pool:
        while len(rows) < n:
            seeds = distinct_seeds(generator, -(-(n - len(rows)) // config.n_per_request), config.seed_high,
                                   config.seed_step)
            for reply in pool.map(post, seeds):  # in seed order: the result does not depend on timing
                check_prompt_length(reply, len(prompt))
                choices = reply.get("choices") or []
                counts["missing_choices"] += config.n_per_request - len(choices)
                for choice in choices:
                    stopped = choice.get("finish_reason") not in (None, "length")  # an end-of-text token
                    ids = None if stopped else choice_tokens(choice, token_map, length)
                    if ids is None or len(ids) != length:
                        counts["refused_samples"] += 1
                        counts["stopped_early"] += int(stopped)
                        outcomes.append(None)
                    elif len(rows) < n:
                        rows.append(ids)
                        outcomes.append(ids)
                        bar.update(1)
                    else:
                        outcomes.append(None)
    bar.close()
    counts.update(requests=client.requests, retries=client.retried)
    if config.server_metrics:
        after = server_counters(client.get_text("/metrics"))
        counts.update({key: int(round(after[key] - before.get(key, 0.0))) for key in after})
    if config.drafting_rule in COUNTER_RULES:
        from specdec_lab.drafting import position_two_from_counters

        counts.update(position_two_from_counters(counts, length, config.drafting_rule), sequences=len(outcomes))
    if lookup:
        calls = client.get(LOOKUP_ROUTE)["calls"][calls_before:]
        counts.update(lookup_positions(calls, outcomes, len(prompt), length),
                      draft_calls=len(calls), draft_calls_drafting=sum(1 for _, draft in calls if len(draft)))
    return SampleResult(torch.tensor(rows, dtype=torch.long), None, counts)


LOOKUP_ROUTE = "/specdec-lab/draft-calls"  # served by specdec_lab.adapters.lookup_server


def lookup_positions(calls: list, outcomes: list, prompt_length: int, length: int) -> dict:
    """``drafted@t`` / ``accepted@t`` of llama-cpp-python's prompt lookup from its draft calls.

    ``calls``: the server's draft calls in order, each ``[input length, draft token ids]``; one request is
    served at a time, so a request's calls are consecutive and its first call has input length P + 1 (the
    prompt and token 1: llama-cpp-python samples token 1 from the prompt's pass, then asks for a draft).
    A call with input length P + j drafts positions j + 1, j + 2, …; its draft token for position t was
    accepted when the sample's token t equals it (the point-mass rule keeps a draft token while the
    target's own sample equals it). ``outcomes``: per request in the same order, the sample's token ids,
    or None for a refused or surplus sample (not counted).

    >>> lookup_positions([[4, [7, 8]], [6, []], [4, []], [5, [9]]], [[1, 7, 5], [2, 9, 9]], 3, 3)
    {'drafted@1': 0, 'accepted@1': 0, 'drafted@2': 1, 'accepted@2': 1, 'drafted@3': 2, 'accepted@3': 1}
    """
    from specdec_lab.drafting import add_positions

    requests, current = [], None
    for input_length, draft in calls:
        if input_length == prompt_length + 1:  # a new request's first call
            current = []
            requests.append(current)
        if current is not None:
            current.append((input_length, list(draft)))
    if len(requests) != len(outcomes):
        raise EndpointError(f"{len(requests)} requests in the server's draft-call log, {len(outcomes)} answered: "
                            "the lookup server must serve only this audit, one request at a time")
    positions = {f"{key}@{t}": 0 for t in range(1, length + 1) for key in ("drafted", "accepted")}
    for request, ids in zip(requests, outcomes):
        if ids is None:
            continue
        drafted, accepted = [0] * length, [0] * length
        for input_length, draft in request:
            first = input_length - prompt_length  # 0-based index of the first drafted position
            for j, token in enumerate(draft):  # verified in order until the first mismatch; the rest discarded
                if first + j >= length:
                    break
                drafted[first + j] = 1
                accepted[first + j] = int(ids[first + j] == token)
                if not accepted[first + j]:
                    break
        add_positions(positions, drafted, accepted)
    return positions


def server_counters(text: str) -> dict:
    """The :data:`SERVER_COUNTERS` found in a Prometheus text exposition, by stats key.

    >>> server_counters("# HELP x\\nllamacpp:n_decode_total 12\\nllamacpp:spec_decode_num_drafts_total 3")
    {'target_passes': 12.0, 'verify_steps': 3.0}
    """
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0]
        for suffix, key in SERVER_COUNTERS.items():
            if "{" in suffix:  # one label of a labelled counter (vLLM's acceptance per draft position)
                counter, label = suffix.split("{", 1)
                hit = base.endswith(":" + counter) and label.rstrip("}") in name
            else:
                hit = base.endswith(":" + suffix) or base == suffix
            if hit:
                found[key] = found.get(key, 0.0) + float(value)
    return found


def speculation_summary(stats: dict) -> dict:
    """How often the server speculated, from :func:`server_counters` differences (empty without them).

    Every request's first token comes from the prompt's pass; each later target pass either verifies a
    draft (a *verification step*) or samples one token without one.

    >>> speculation_summary({"requests": 10, "target_passes": 30, "verify_steps": 15, "draft_tokens": 45,
    ...                      "accepted_tokens": 20})
    {'speculative steps': 0.75, 'drafted/step': 3.0, 'accepted/step': 1.3333333333333333}
    """
    if "requests" not in stats or "target_passes" not in stats:
        return {}  # no server counters (e.g. an in-process HF run, which reports its own passes)
    steps = stats["target_passes"] - stats["requests"]
    verify = stats.get("verify_steps", 0)
    return {"speculative steps": verify / steps if steps else float("nan"),
            "drafted/step": stats.get("draft_tokens", 0) / verify if verify else 0.0,
            "accepted/step": stats.get("accepted_tokens", 0) / verify if verify else 0.0}


def check_prompt_length(reply: dict, expected: int) -> None:
    """Refuse a server that tokenized the prompt differently (e.g. added a BOS token)."""
    used = (reply.get("usage") or {}).get("prompt_tokens")
    if used is not None and used != expected:
        raise EndpointError(f"the server read the prompt as {used} tokens, the local tokenizer as {expected}: "
                            "the two do not see the same prompt (an added BOS token?), so p would differ")


def choice_logprobs(choice: dict) -> list[float] | None:
    """The log-probability the server reports for each returned token of one choice (llama-server:
    ``logprobs.content[i].logprob``; OpenAI's legacy form, vLLM: ``logprobs.token_logprobs``), or None.

    >>> choice_logprobs({"logprobs": {"content": [{"id": 5, "logprob": -1.5}]}}), choice_logprobs({"text": "a"})
    ([-1.5], None)
    """
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content")
    if content and all("logprob" in entry for entry in content):
        return [float(entry["logprob"]) for entry in content]
    values = logprobs.get("token_logprobs")
    if values and all(v is not None for v in values):
        return [float(v) for v in values]
    return None


def choice_tokens(choice: dict, token_map: TokenMap, length: int) -> list[int] | None:
    """Token ids of one choice (see the module docstring), or None."""
    if choice.get("token_ids") is not None:  # servers that return ids directly
        return [int(t) for t in choice["token_ids"]]
    content = (choice.get("logprobs") or {}).get("content")
    if content and all("id" in entry for entry in content):  # llama-server: chat-style logprobs with ids
        return [int(entry["id"]) for entry in content]
    pieces = (choice.get("logprobs") or {}).get("tokens")
    text = choice.get("text", "")
    if pieces:
        ids = token_map.from_pieces(list(pieces), text)
        if ids is not None:
            return ids
    return token_map.from_text(text, length)
