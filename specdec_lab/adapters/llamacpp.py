"""A real llama.cpp server on loopback serving the bundled target: start, query, stop.

Used by the endpoint tests' fixture, by ``.ci/run`` and by ``specdec-lab audit endpoint --serve-bundled``, so all
three run the same thing. The models are the bundled pair converted to f32 GGUF and the programs llama.cpp's own
build (:mod:`specdec_lab.adapters.llamacpp_build`); llama.cpp's ``llama-speculative`` example as a sampler is
:mod:`specdec_lab.adapters.llamacpp_speculative`.

- :func:`start_server` runs ``python -m llama_cpp.server`` (through :mod:`specdec_lab.adapters.lookup_server`,
  which adds a log of the prompt-lookup draft calls) with a config file serving two model aliases from the one
  GGUF: ``target`` (plain sampling) and ``target-lookup`` (llama-cpp-python's only speculative option,
  ``draft_model=prompt-lookup-decoding``, K tokens per pass), on a free loopback port, and waits until
  ``/v1/models`` answers.
- :func:`start_llama_server` serves the bundled target with llama.cpp's own ``llama-server``, with
  (``target-draft``: ``-md draft.gguf``, draft-model speculative decoding, K tokens per pass,
  ``--spec-draft-p-min 0`` so the draft proposes on every step it can) or without (``target-nodraft``, the
  reference) the bundled draft, and waits until ``/health`` answers.
- :func:`bundled_server` converts, serves, yields the server and stops it; both starts raise RuntimeError with the
  end of the server's log when it exits or does not answer in time (:mod:`specdec_lab.adapters.loopback`).

``python -m specdec_lab.adapters.llamacpp fetch-converter | build-engine | convert | serve | greedy-parity``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec_lab.adapters.llamacpp_build import (VERSION, run_converter, build_engine, convert_to_gguf,
                                                 converter_dir, engine_binary, fetch_converter)
from specdec_lab.adapters.loopback import LoopbackServer, free_port, wait_until_up
from specdec_lab.models import BUNDLED_DIR

ALIASES = {"target": "plain sampling", "target-lookup": "prompt-lookup speculative decoding"}
LOOKUP_TOKENS = 4  # draft_model_num_pred_tokens of the speculative alias (K), like verify's K = 4
# llama.cpp's own server (built by build_engine), one process per alias
SERVER_ALIASES = {"target-draft": "draft-model speculative decoding", "target-nodraft": "plain sampling",
                  "target-draft-synthetic": "draft model with synthetic acceptance, --spec-synth-len (lossy by design)"}
DRAFT_TOKENS = 4  # --spec-draft-n-max of target-draft (K)
ENV_URL = "SPECDEC_LAB_LLAMA_SERVER"  # set by .ci/run: a running server the tests use instead of their own


def server_label(alias: str) -> str:
    if alias in SERVER_ALIASES:
        k = f", K={DRAFT_TOKENS}" if alias.startswith("target-draft") else ""
        return f"llama.cpp llama-server (vendored in llama-cpp-python {VERSION}; {SERVER_ALIASES[alias]}{k})"
    return f"llama-cpp-python {VERSION} ({ALIASES[alias]})"


def server_config(gguf: Path, port: int, threads: int = 1, lookup_tokens: int = LOOKUP_TOKENS) -> dict:
    """llama-cpp-python config file: one GGUF served as ``target`` and ``target-lookup``."""
    common = {"model": str(gguf), "n_ctx": 512, "n_batch": 512, "n_threads": threads, "n_threads_batch": threads,
              "logits_all": True, "verbose": False, "cache": False,
              "type_k": 0, "type_v": 0}  # f32 KV cache: llama.cpp's default f16 cache moves the logits
    return {"host": "127.0.0.1", "port": port, "interrupt_requests": False,
            "models": [{**common, "model_alias": "target"},
                       {**common, "model_alias": "target-lookup", "draft_model": "prompt-lookup-decoding",
                        "draft_model_num_pred_tokens": lookup_tokens}]}


def start_server(gguf: Path, workdir: Path, port: int | None = None, threads: int = 1,
                 startup_timeout: float = 120.0) -> LoopbackServer:
    """Start ``python -m llama_cpp.server`` on loopback and wait until it answers."""
    port = port or free_port()
    config = workdir / "llama-server.json"
    config.write_text(json.dumps(server_config(gguf, port, threads)))
    log = workdir / "llama-server.log"
    with open(log, "wb") as out:
        # llama_cpp.server itself, with a log of the prompt-lookup draft calls (the drafted share's source)
        process = subprocess.Popen([sys.executable, "-m", "specdec_lab.adapters.lookup_server", "--config_file", str(config)],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return wait_until_up(LoopbackServer(process, f"http://127.0.0.1:{port}", log), "/v1/models", startup_timeout,
                         "llama.cpp server")


def llama_server_command(target: Path, port: int, draft: Path | None = None, threads: int = 1,
                         draft_tokens: int = DRAFT_TOKENS, parallel: int = 1, batch: int | None = None,
                         synthetic_length: int | None = None) -> list[str]:
    """``llama-server`` on loopback: ``parallel`` slots of 512 tokens each (continuous batching), f32 KV caches (as
    the llama-cpp-python server), ``/metrics`` on, ``batch`` the prefill chunk (``-b``/``-ub``; None: the
    engine's default), and with ``draft`` the draft model proposing ``draft_tokens`` tokens per pass on every
    step it can (``--spec-draft-n-min 0``: no minimum; ``--spec-draft-p-min 0``: no confidence cut-off).
    ``synthetic_length`` turns on llama.cpp's documented lossy benchmarking mode, ``--spec-synth-len L`` (draft tokens
    kept by a coin at fixed rates whatever p and q say; L = draft_tokens + 1 keeps every draft): a positive control
    the audit must reject."""
    command = [str(engine_binary("llama-server")), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
               "-c", str(512 * parallel), "-np", str(parallel), "-t", str(threads), "-tb", str(threads),
               "-ctk", "f32", "-ctv", "f32",
               "--metrics", "--no-webui", "--no-warmup", "-a", _alias(draft, synthetic_length)]
    if batch is not None:
        command += ["-b", str(batch), "-ub", str(batch)]
    if draft is not None:
        # --spec-type draft-simple: without it this llama.cpp loads the -md model and never drafts (the type is
        # inferred from the draft GGUF only for MTP/DFlash heads; a plain Llama draft leaves it at "none")
        command += ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(threads), "-tbd", str(threads),
                    "-ctkd", "f32", "-ctvd", "f32",
                    "--spec-draft-n-max", str(draft_tokens), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    if synthetic_length is not None:
        if draft is None:
            raise ValueError("synthetic acceptance needs a draft model")
        command += ["--spec-synth-len", str(synthetic_length)]
    return command


def _alias(draft: Path | None, synthetic_length: int | None) -> str:
    if draft is None:
        return "target-nodraft"
    return "target-draft" if synthetic_length is None else "target-draft-synthetic"


def start_llama_server(target: Path, workdir: Path, draft: Path | None = None, port: int | None = None,
                       threads: int = 1, draft_tokens: int = DRAFT_TOKENS, startup_timeout: float = 120.0,
                       parallel: int = 1, batch: int | None = None,
                       synthetic_length: int | None = None) -> LoopbackServer:
    """Start llama.cpp's ``llama-server`` (built by :func:`build_engine`, options as :func:`llama_server_command`) and
    wait until ``/health`` answers."""
    port = port or free_port()
    log = workdir / f"llama-server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(llama_server_command(target, port, draft, threads, draft_tokens, parallel, batch,
                                                        synthetic_length),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return wait_until_up(LoopbackServer(process, f"http://127.0.0.1:{port}", log), "/health", startup_timeout,
                         "llama.cpp server")


def greedy_tokens(base_url: str, pair, text: str, length: int) -> list[int]:
    """``length`` greedy (temperature 0) token ids from a llama-server after ``text`` (neutral sampler)."""
    from specdec_lab.adapters.endpoint import (LLAMA_SERVER_NEUTRAL, EndpointClient, EndpointConfig, EndpointError,
                                               TokenMap, choice_tokens)

    reply = EndpointClient(EndpointConfig(base_url, "greedy")).post(
        "/v1/completions", {"prompt": text, "max_tokens": length, "temperature": 0.0, "logprobs": 1,
                            **dict(LLAMA_SERVER_NEUTRAL)})
    ids = choice_tokens(reply["choices"][0], TokenMap(pair.tokenizer, pair.vocab_size), length)
    if ids is None or len(ids) != length:
        raise EndpointError(f"no {length} greedy tokens in the reply: {reply['choices'][0]}")
    return ids


GREEDY_PROMPTS = ("ROMEO:\n", "JULIET:\n", "KING HENRY:\nWhat", "First Citizen:\nBefore we proceed", "MENENIUS:\nWhy,",
                  "ROMEO:\nGood night, good night!\nJULIET:\nGood night, good", "HAMLET:\nTo be", "LADY MACBETH:\n",
                  "GLOUCESTER:\nNow is the", "PROSPERO:\n", "CORIOLANUS:\nI", "QUEEN:\nMy lord,", "Second Servant:\n",
                  "BRUTUS:\nThe", "DUKE VINCENTIO:\nHe", "ISABELLA:\nO,", "LUCIO:\nWhy, how now", "Nurse:\nFaith,",
                  "MERCUTIO:\nNay,", "FRIAR LAURENCE:\nHoly")


def greedy_parity(pair, prompts=GREEDY_PROMPTS, length: int = 64) -> dict:
    """Greedy tokens of llama-server with the draft, without it, and our target's argmax, per prompt.

    Returns the number of prompts on which all three agree on every token, the first differing positions
    otherwise, and the draft server's speculation counters over these requests.
    """
    from specdec_lab.adapters.endpoint import EndpointClient, EndpointConfig, server_counters

    differing = {}
    with bundled_server(model="target-draft") as spec, bundled_server(model="target-nodraft") as plain:
        client = EndpointClient(EndpointConfig(spec.base_url, "target-draft"))
        before = server_counters(client.get_text("/metrics"))
        for text in prompts:
            a, b = greedy_tokens(spec.base_url, pair, text, length), greedy_tokens(plain.base_url, pair, text, length)
            x = pair.encode(text)
            with torch.no_grad():
                logits = pair.target(torch.cat([x, torch.tensor(b)])[None].to(pair.device)).logits
            ours = logits[0, len(x) - 1:-1, : pair.vocab_size].argmax(-1).tolist()
            wrong = [i for i in range(length) if not a[i] == b[i] == ours[i]]
            if wrong:
                differing[text] = wrong[:5]
        after = server_counters(client.get_text("/metrics"))
    return {"prompts": len(prompts), "tokens": length, "identical": len(prompts) - len(differing),
            "differing": differing, "counters": {k: after[k] - before.get(k, 0.0) for k in after}}


@contextlib.contextmanager
def bundled_server(threads: int = 1, model: str = "target", parallel: int = 1, batch: int | None = None):
    """Convert the bundled target (and draft) into a temporary folder, serve it, yield the server, stop it.

    ``model`` in :data:`ALIASES`: llama-cpp-python's server (serving every alias of ``ALIASES``);
    in :data:`SERVER_ALIASES`: llama.cpp's ``llama-server`` with (``target-draft``) or without
    (``target-nodraft``) the bundled draft, with ``parallel`` slots and prefill chunk ``batch``.
    """
    if model not in ALIASES and model not in SERVER_ALIASES:
        raise ValueError(f"unknown bundled model {model!r}; valid: {', '.join([*ALIASES, *SERVER_ALIASES])}")
    with tempfile.TemporaryDirectory(prefix="specdec-llama-") as tmp:
        gguf = convert_to_gguf(Path(tmp) / "target-f32.gguf")
        if model in SERVER_ALIASES:
            draft = convert_to_gguf(Path(tmp) / "draft-f32.gguf", BUNDLED_DIR / "draft") \
                if model == "target-draft" else None
            server = start_llama_server(gguf, Path(tmp), draft, threads=threads, parallel=parallel, batch=batch)
        else:
            server = start_server(gguf, Path(tmp), threads=threads)
        try:
            yield server
        finally:
            server.stop()


def _serve(url_file: Path | None, threads: int, model: str = "target") -> int:
    """Serve until SIGTERM/SIGINT; write the base URL to ``url_file`` once it answers."""
    stop = {"now": False}

    def handler(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    with bundled_server(threads, model) as server:
        if url_file:
            url_file.write_text(server.base_url)
        served = model if model in SERVER_ALIASES else ", ".join(ALIASES)
        print(f"serving the bundled target at {server.base_url} (models: {served})", flush=True)
        while not stop["now"] and server.process.poll() is None:
            time.sleep(0.5)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_lab.adapters.llamacpp")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch-converter", help="extract llama.cpp's HF → GGUF converter from the pinned sdist")
    b = sub.add_parser("build-engine", help="build llama-server and the speculative tools for the CPU (cached)")
    b.add_argument("--jobs", type=int, default=2)
    c = sub.add_parser("convert", help="convert an HF model directory to an f32 GGUF")
    c.add_argument("model_dir", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--converter", type=Path, default=None)
    s = sub.add_parser("serve", help="serve the bundled target on loopback until SIGTERM")
    s.add_argument("--url-file", type=Path, default=None, help="write the server's base URL here")
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--model", default="target", choices=[*ALIASES, *SERVER_ALIASES],
                   help="target/target-lookup: llama-cpp-python's server; target-draft/target-nodraft: llama-server")
    g = sub.add_parser("greedy-parity", help="greedy: llama-server with the draft vs without vs our argmax")
    g.add_argument("--length", type=int, default=64)
    args = parser.parse_args(argv)
    if args.command == "greedy-parity":
        from specdec_lab.models import load_pair

        found = greedy_parity(load_pair("bundled"), length=args.length)
        print(json.dumps(found, indent=1))
        return 0 if found["identical"] == found["prompts"] else 1
    if args.command == "fetch-converter":
        print(fetch_converter())
        return 0
    if args.command == "build-engine":
        print(build_engine(jobs=args.jobs))
        return 0
    if args.command == "convert":
        run_converter(args.converter or converter_dir(), args.model_dir, args.out)
        return 0
    return _serve(args.url_file, args.threads, args.model)


if __name__ == "__main__":
    sys.exit(main())
