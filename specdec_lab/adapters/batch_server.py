"""A small batching server of our own: the controls of the workload audit (``specdec-lab audit workload``).

It speaks llama-server's dialect of ``POST /v1/completions`` (the fields of
:data:`specdec_lab.workload.ENGINES`' ``llama.cpp`` profile: ``temperature``, ``top_k`` (0: off), ``top_p``,
``min_p``, ``presence_penalty``, ``frequency_penalty``, ``repeat_penalty``, ``repeat_last_n``, ``n``, ``seed``,
``logprobs`` (answered as llama-server does, ``logprobs.content[i].id``), ``stop``, ``max_tokens``) and serves
the bundled target with continuous batching of a simple kind: a batcher thread takes every request waiting
(up to ``max_rows`` rows, after a ``window`` of a few milliseconds), runs them as one batch step by step, and
answers them. Each row's law is :func:`specdec_lab.sampling.chain_probs` with its own settings in llama.cpp's
order, drawn with its own generator (seeded from the request's ``seed``, else from the OS): **lossless** by
construction.

With ``leak_temperature=True`` it is exact *except under one production condition*: the temperature of the
batch's first row is applied to every row of the batch (the shape of vLLM #9441/#14301 and TensorRT-LLM
#19390: one request's sampling parameter applied to another row). A request batched only with requests of its
own temperature is untouched, so the audit must reject exactly the cells that share batches with other
temperatures, and no others. With ``end_early=s`` it ends a share s of its completions right after token 1 with
``finish_reason: "stop"`` — no EOS, no stop string: a law the exact model cannot produce, which the audit must
reject (every outcome counted) rather than drop.

It answers ``logprobs`` with each sampled token's log-probability under the **raw** model law (the log-softmax of
the target's logits, before temperature, penalties and filters: llama-server's default, ``post_sampling_probs``
false) and honours a choice-list ``grammar`` (``root ::= "a" | "b"``, the form
:func:`specdec_lab.workload.requests.choice_grammar` writes): each step's law is the sampler chain's, masked to the
tokens that keep the text a prefix of a choice (end-of-text once it is one) and renormalised. Three more planted
faults break a promise a server makes (:mod:`specdec_lab.workload.promises`) while keeping every law exact:
``zero_logprobs`` answers logprob 0.0 for every token (llama.cpp #27972's shape); ``batch_seeds`` makes a seeded row
batched with an unseeded one draw from fresh randomness instead of its seed (vLLM #51226's shape on CPU); ``grammar_gap`` leaves the grammar mask off the second token (vLLM #44297's shape).

Logits come from one target forward per distinct context (cached), in fp64 after the forward.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import queue
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from specdec_lab.sampling import ChainConfig, SamplingConfig, chain_probs, make_generator, sample


@dataclass(frozen=True)
class BatchServerConfig:
    """leak_temperature, end_early: the planted faults (see the module docstring); window: seconds the batcher waits for
    more requests after the first; max_rows: rows (request × choice) per batch; cache_size: contexts whose
    logits are kept."""

    leak_temperature: bool = False
    end_early: float = 0.0  # planted: this share of completions ends after token 1 with finish "stop" (no EOS, no stop)
    zero_logprobs: bool = False  # planted: every returned logprob is 0.0
    batch_seeds: bool = False  # planted: a seeded row batched with an unseeded one ignores its seed
    grammar_gap: bool = False  # planted: the grammar mask is not applied at the second token
    window: float = 0.005
    max_rows: int = 32
    cache_size: int = 20_000


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400)."""


@dataclass
class _Row:
    prompt: list
    chain: ChainConfig
    generator: torch.Generator
    stop: tuple
    generated: list
    finish: str = ""
    seed: int | None = None
    choices: tuple = ()  # the choice-list grammar's strings (empty: no grammar)
    logprobs: list = field(default_factory=list)  # raw-law log-probability of each generated token


_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string literal


def parse_choice_grammar(grammar: str) -> tuple[str, ...]:
    """The strings of a choice-list GBNF grammar ``root ::= "a" | "b"`` (JSON string escapes); raises BadRequest.

    >>> parse_choice_grammar('root ::= " ay" | "no" | "my \\\\"lord\\\\""')
    (' ay', 'no', 'my "lord"')
    """
    head, sep, rest = grammar.partition("::=")
    literals = _LITERAL.findall(rest)
    if head.strip() != "root" or not sep or not literals or _LITERAL.sub("", rest).replace("|", "").strip():
        raise BadRequest(f"grammar: only a choice list root ::= \"a\" | \"b\" is served here, got {grammar[:80]!r}")
    choices = tuple(json.loads(literal) for literal in literals)
    if not all(choices):
        raise BadRequest("grammar: a choice is empty")
    return choices


def _chain(body: dict) -> ChainConfig:
    try:
        top_k = int(body.get("top_k", 40))
        sampling = SamplingConfig(temperature=float(body.get("temperature", 0.8)), top_k=top_k if top_k > 0 else None,
                                  top_p=float(body.get("top_p", 0.95)))
        return ChainConfig(sampling, min_p=float(body.get("min_p", 0.05)),
                           presence_penalty=float(body.get("presence_penalty", 0.0)),
                           frequency_penalty=float(body.get("frequency_penalty", 0.0)),
                           repetition_penalty=float(body.get("repeat_penalty", 1.0)), order="llama.cpp",
                           penalty_last_n=int(body.get("repeat_last_n", 64)))
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc


class BatchEngine:
    """The model side: batches of rows, one step at a time."""

    def __init__(self, pair, config: BatchServerConfig) -> None:
        self.pair, self.config = pair, config
        self.eos = pair.tokenizer.eos_token_id
        self.texts = [pair.decode([i]) for i in range(pair.vocab_size)]
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self.batches = 0
        self.mixed_batches = 0  # batches whose rows had more than one temperature

    @torch.no_grad()
    def logits(self, context: tuple) -> torch.Tensor:
        if context in self._cache:
            self._cache.move_to_end(context)
            return self._cache[context]
        ids = torch.tensor(context, dtype=torch.long, device=self.pair.device)[None]
        out = self.pair.target(ids).logits[0, -1, : self.pair.vocab_size].double().cpu()  # (V,)
        self._cache[context] = out
        if len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)
        return out

    def rows_of(self, body: dict) -> list[_Row]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt: required, a non-empty string")
        n = body.get("n", 1)
        if not isinstance(n, int) or not 1 <= n <= 16:
            raise BadRequest(f"n: must be an integer in [1, 16], got {n!r}")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        chain = _chain(body)
        seed = body.get("seed")
        seed = None if seed is None or int(seed) < 0 else int(seed)
        generator = make_generator(secrets.randbits(63) if seed is None else seed)
        choices = parse_choice_grammar(body["grammar"]) if body.get("grammar") else ()
        ids = self.pair.encode(prompt).tolist()
        return [_Row(ids, chain, generator, stop, [], seed=seed, choices=choices) for _ in range(n)]

    def allowed(self, row: _Row, position: int) -> torch.Tensor | None:
        """(V,) bool: the tokens the row's choice-list grammar allows next (None: no grammar, or the planted gap)."""
        if not row.choices or (self.config.grammar_gap and position == 1):
            return None
        text = self.pair.decode(row.generated)
        mask = torch.zeros(self.pair.vocab_size, dtype=torch.bool)
        for token, piece in enumerate(self.texts):
            mask[token] = bool(piece) and token != self.eos and any(c.startswith(text + piece) for c in row.choices)
        if self.eos is not None and text in row.choices:
            mask[self.eos] = True
        return mask

    def run(self, rows: list[_Row], max_tokens: int) -> None:
        """Generate for every row of one batch, step by step (the fault, when planted, applies here)."""
        self.batches += 1
        temperatures = {r.chain.sampling.temperature for r in rows}
        self.mixed_batches += len(temperatures) > 1
        if self.config.leak_temperature and len(temperatures) > 1:  # the first row's temperature for every row
            leaked = rows[0].chain.sampling.temperature
            for r in rows:
                r.chain = replace(r.chain, sampling=replace(r.chain.sampling, temperature=leaked))
        if self.config.batch_seeds and any(r.seed is None for r in rows):  # planted: an unseeded row in the batch
            for r in rows:  # and every seeded row draws from fresh OS randomness instead of its seed
                if r.seed is not None and not r.generated:
                    r.generator = make_generator(secrets.randbits(63))
        V = self.pair.vocab_size
        for position in range(max_tokens):
            for r in (r for r in rows if not r.finish):
                logits = self.logits(tuple(r.prompt + r.generated))  # (V,)
                probs = chain_probs(logits, r.chain, *r.chain.counts(r.prompt, r.generated, V))
                mask = self.allowed(r, position)
                if mask is not None:  # the grammar: mask, renormalise
                    probs = torch.where(mask, probs, torch.zeros_like(probs))
                    if r.chain.sampling.temperature == 0 or float(probs.sum()) <= 0:
                        masked = torch.where(mask, logits, torch.full_like(logits, -torch.inf))
                        probs = torch.nn.functional.one_hot(masked.argmax(), V).double()
                    probs = probs / probs.sum()
                token = int(sample(probs, r.generator))
                r.logprobs.append(0.0 if self.config.zero_logprobs else float(torch.log_softmax(logits, -1)[token]))
                if token == self.eos:
                    r.finish = "stop"
                    continue
                r.generated.append(token)
                if r.stop and any(s in self.pair.decode(r.generated) for s in r.stop):
                    r.finish = "stop"
                elif (self.config.end_early and len(r.generated) == 1
                      and float(torch.rand(1, generator=r.generator, dtype=torch.float64)) < self.config.end_early):
                    r.finish = "stop"  # the planted early ending
        for r in rows:
            r.finish = r.finish or "length"

    def reply(self, body: dict, rows: list[_Row]) -> dict:
        choices = []
        for index, r in enumerate(rows):
            text = self.pair.decode(r.generated)
            for s in r.stop:
                text = text.split(s, 1)[0]
            choice = {"index": index, "text": text, "finish_reason": r.finish}
            if body.get("logprobs"):  # as llama-server: the generated tokens, not an end-of-text token
                choice["logprobs"] = {"content": [{"id": t, "token": self.pair.decode([t]), "logprob": lp}
                                                  for t, lp in zip(r.generated, r.logprobs)]}
            choices.append(choice)
        return {"object": "text_completion", "model": body.get("model", "target"), "choices": choices,
                "usage": {"prompt_tokens": len(rows[0].prompt), "completion_tokens": len(rows[0].generated)}}


class _Pending:
    def __init__(self, body: dict, rows: list[_Row]) -> None:
        self.body, self.rows, self.done, self.answer, self.error = body, rows, threading.Event(), None, None


class BatchServer:
    """The HTTP front and the batcher thread; ``base_url`` once started."""

    def __init__(self, pair, config: BatchServerConfig = BatchServerConfig(), port: int = 0) -> None:
        self.engine = BatchEngine(pair, config)
        self.config = config
        self.waiting: queue.Queue = queue.Queue()
        self.http = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.http.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self.http.serve_forever, daemon=True),
                         threading.Thread(target=self._batcher, daemon=True)]

    def start(self) -> "BatchServer":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.http.shutdown()
        self.http.server_close()

    def _batcher(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.waiting.get(timeout=0.1)
            except queue.Empty:
                continue
            batch, rows = [first], len(first.rows)
            deadline = time.monotonic() + self.config.window
            while rows < self.config.max_rows:
                try:
                    item = self.waiting.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                batch.append(item)
                rows += len(item.rows)
            try:
                by_length: dict[int, list[_Pending]] = {}
                for item in batch:  # rows asking for the same max_tokens step together
                    by_length.setdefault(int(item.body.get("max_tokens", 16)), []).append(item)
                for length, items in by_length.items():
                    self.engine.run([r for item in items for r in item.rows], length)
                for item in batch:
                    item.answer = self.engine.reply(item.body, item.rows)
            except Exception as exc:  # noqa: BLE001 - an engine failure is answered as HTTP 500
                for item in batch:
                    item.error = f"{type(exc).__name__}: {exc}"
            for item in batch:
                item.done.set()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path in ("/health", "/v1/models"):
                    self._send(200, {"status": "ok", "data": [{"id": "target"}]})
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                if self.path != "/v1/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                try:
                    body = json.loads(raw)
                    pending = _Pending(body, server.engine.rows_of(body))
                except (ValueError, BadRequest) as exc:
                    return self._send(400, {"error": str(exc)})
                server.waiting.put(pending)
                pending.done.wait()
                if pending.error:
                    return self._send(500, {"error": pending.error})
                self._send(200, pending.answer)

        return Handler


@contextlib.contextmanager
def served(pair, config: BatchServerConfig = BatchServerConfig()):
    """Serve in this process (threads) on a free loopback port; yield the :class:`BatchServer`; stop it."""
    server = BatchServer(pair, config).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_lab.adapters.batch_server")
    parser.add_argument("--leak-temperature", action="store_true", help="plant the fault (see the module docstring)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--url-file", type=Path, default=None)
    args = parser.parse_args(argv)
    from specdec_lab.models import load_pair

    server = BatchServer(load_pair("bundled"), BatchServerConfig(leak_temperature=args.leak_temperature),
                         args.port).start()
    if args.url_file:
        args.url_file.write_text(server.base_url)
    print(f"serving the bundled target at {server.base_url} (leak_temperature={args.leak_temperature})", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
