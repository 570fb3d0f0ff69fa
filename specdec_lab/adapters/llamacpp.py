"""A real llama.cpp server on loopback serving the bundled target: convert, start, stop.

Used by the endpoint tests' fixture, by ``.ci/run`` and by ``specdec-lab audit endpoint
--serve-bundled``, so all three run the same thing:

1. :func:`fetch_converter` takes llama.cpp's HF → GGUF converter (``convert_hf_to_gguf.py`` with its
   ``conversion/`` and ``gguf-py/`` packages) out of the pinned ``llama-cpp-python`` source
   distribution (``pip download``; done once by ``make``, kept under ``.venv/share``).
2. :func:`convert_to_gguf` converts ``data/models/target`` to an f32 GGUF (seconds). The converter
   identifies a BPE pre-tokenizer by hashing the token ids of a test string; our tokenizer, trained
   by :mod:`specdec_lab.training.base`, is not in its table, so it stops with "BPE pre-tokenizer was not
   recognized". Our tokenizer's pre-tokenizer *is* GPT-2's (``ByteLevel`` with the GPT-2 regex,
   no prefix space, no normaliser), so the conversion wraps ``get_vocab_base_pre`` to answer
   ``"gpt-2"`` for exactly that configuration — and refuses any other. The tests check the
   result: llama.cpp's tokenization and greedy tokens equal ours.
3. :func:`start_server` runs ``python -m llama_cpp.server`` (through
   :mod:`specdec_lab.adapters.lookup_server`, which adds a log of the prompt-lookup draft calls) with a config file serving two model
   aliases from the one GGUF: ``target`` (plain sampling) and ``target-lookup`` (llama-cpp-python's
   only speculative option, ``draft_model=prompt-lookup-decoding``, K tokens per pass), on a free
   loopback port, and waits until ``/v1/models`` answers.
4. :func:`build_engine` builds llama.cpp's own ``llama-server`` and the ``llama-speculative`` /
   ``llama-speculative-simple`` tools for the CPU from the same sdist's vendored tree (``make llama-cpp``,
   once per machine, cached outside the clone by the pin); :func:`start_llama_server` serves the
   bundled target with (``target-draft``: ``-md draft.gguf``, draft-model speculative decoding, K
   tokens per pass, ``--spec-draft-p-min 0`` so the draft proposes on every step it can) or without
   (``target-nodraft``, the reference) the bundled draft, converted the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.models import BUNDLED_DIR
from specdec_lab.sampling import SamplingConfig

VERSION = "0.3.36"  # llama-cpp-python, pinned in requirements-audit.txt
ALIASES = {"target": "plain sampling", "target-lookup": "prompt-lookup speculative decoding"}
LOOKUP_TOKENS = 4  # draft_model_num_pred_tokens of the speculative alias (K), like verify's K = 4
# llama.cpp's own server (built by build_engine), one process per alias
SERVER_ALIASES = {"target-draft": "draft-model speculative decoding", "target-nodraft": "plain sampling"}
DRAFT_TOKENS = 4  # --spec-draft-n-max of target-draft (K)
ENV_URL = "SPECDEC_LAB_LLAMA_SERVER"  # set by .ci/run: a running server the tests use instead of their own


def server_label(alias: str) -> str:
    if alias in SERVER_ALIASES:
        k = f", K={DRAFT_TOKENS}" if alias == "target-draft" else ""
        return f"llama.cpp llama-server (vendored in llama-cpp-python {VERSION}; {SERVER_ALIASES[alias]}{k})"
    return f"llama-cpp-python {VERSION} ({ALIASES[alias]})"


def converter_dir() -> Path:
    """Where the converter lives: ``$SPECDEC_LAB_LLAMA_CONVERTER`` or ``<venv>/share/specdec-lab/...``."""
    default = Path(sys.prefix) / "share" / "specdec-lab" / f"llama.cpp-convert-{VERSION}"
    return Path(os.environ.get("SPECDEC_LAB_LLAMA_CONVERTER", default))


def fetch_converter(dest: Path | None = None) -> Path:
    """Extract the converter from the pinned llama-cpp-python sdist (downloaded with pip)."""
    dest = dest or converter_dir()
    if (dest / "convert_hf_to_gguf.py").exists():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
        staging = Path(tmp) / "out"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].startswith(wanted) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(staging, members=members, filter="data")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, dest)
    return dest


ENGINE_TARGETS = ("llama-server", "llama-speculative", "llama-speculative-simple")
# CPU only, static, no network at build or run time: no HTTPS (OpenSSL), no BLAS, no web UI (the UI would
# otherwise be downloaded from a Hugging Face bucket), no tests.
ENGINE_CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_BLAS=OFF",
                      "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DLLAMA_OPENSSL=OFF",
                      "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                      "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON")


def engine_dir() -> Path:
    """The per-machine llama.cpp build, keyed by the pin: ``$SPECDEC_LAB_LLAMA_CPP`` or
    ``${XDG_CACHE_HOME:-~/.cache}/specdec-lab/llama.cpp-<VERSION>`` (outside every clone)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("SPECDEC_LAB_LLAMA_CPP", cache / "specdec-lab" / f"llama.cpp-{VERSION}"))


def engine_binary(name: str) -> Path:
    """Path of a built llama.cpp program (``llama-server``, ...); a clear error when it is not built."""
    path = engine_dir() / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; build llama.cpp with `make llama-cpp` "
                                f"(python -m specdec_lab.adapters.llamacpp build-engine)")
    return path


def _download_sdist(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(dest)], check=True)
    return next(dest.glob("llama_cpp_python-*.tar.gz"))


def build_engine(dest: Path | None = None, jobs: int = 2) -> Path:
    """Build ``ENGINE_TARGETS`` for the CPU from the llama.cpp tree vendored in the pinned sdist.

    Done once per machine: a finished build (``<dest>/bin`` with every target and the ``.built`` stamp)
    is reused; a new pin is a new directory. The source and the CMake build tree are kept in
    ``<dest>/src`` and ``<dest>/build`` so an interrupted build resumes where it stopped.
    """
    dest = dest or engine_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clones building at once: the second waits, then reuses
        return _build_engine_locked(dest, jobs)


def _build_engine_locked(dest: Path, jobs: int) -> Path:
    stamp = dest / ".built"
    if stamp.exists() and all((dest / "bin" / t).exists() for t in ENGINE_TARGETS):
        return dest
    src = dest / "src"
    if not (src / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            sdist = _download_sdist(Path(tmp))
            prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
            staging = Path(tmp) / "src"
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(staging, members=[m for m in members if m.name], filter="data")
            if src.exists():
                shutil.rmtree(src)
            os.replace(staging, src)
    build = dest / "build"
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *ENGINE_CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--parallel", str(jobs), "--target", *ENGINE_TARGETS],
                   check=True)
    (dest / "bin").mkdir(exist_ok=True)
    for t in ENGINE_TARGETS:
        built = build / "bin" / t
        tmp_copy = dest / "bin" / f".{t}.tmp"
        tmp_copy.write_bytes(built.read_bytes())
        tmp_copy.chmod(0o755)
        os.replace(tmp_copy, dest / "bin" / t)
    stamp.write_text(f"llama.cpp vendored in llama-cpp-python {VERSION}\n")
    return dest


def _is_gpt2_pretokenizer(model_dir: Path) -> bool:
    """True when tokenizer.json pre-tokenizes exactly like GPT-2 (ByteLevel + GPT-2 regex, no normaliser)."""
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    pre = tok.get("pre_tokenizer") or {}
    return (tok.get("normalizer") is None and tok["model"]["type"] == "BPE" and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space", False))


def _run_converter(converter: Path, model_dir: Path, out: Path) -> None:
    """In a child process: run llama.cpp's converter, answering "gpt-2" for an unlisted GPT-2-style
    pre-tokenizer (see the module docstring)."""
    import runpy

    sys.path[:0] = [str(converter), str(converter / "gguf-py")]
    import conversion.base as base  # llama.cpp's converter package

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if not _is_gpt2_pretokenizer(model_dir):
                raise
            print("specdec-lab: pre-tokenizer hash not in llama.cpp's table; tokenizer.json is ByteLevel "
                  "with the GPT-2 regex, so tokenizer.ggml.pre = 'gpt-2'", file=sys.stderr)
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outfile", str(out), "--outtype", "f32"]
    runpy.run_path(str(converter / "convert_hf_to_gguf.py"), run_name="__main__")


def convert_to_gguf(out: Path, model_dir: Path = BUNDLED_DIR / "target", converter: Path | None = None) -> Path:
    """Convert an HF model directory to an f32 GGUF file ``out``; raise with the converter's output."""
    converter = converter or converter_dir()
    if not (converter / "convert_hf_to_gguf.py").exists():
        raise FileNotFoundError(f"llama.cpp's converter is not at {converter}; run "
                                "`python -m specdec_lab.adapters.llamacpp fetch-converter` (make does it)")
    done = subprocess.run([sys.executable, "-m", "specdec_lab.adapters.llamacpp", "convert", str(model_dir),
                           str(out), "--converter", str(converter)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"GGUF conversion failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """A running llama-cpp-python server; ``stop()`` ends it (and only it)."""

    process: subprocess.Popen | None
    base_url: str
    log: Path | None = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log and self.log.exists() else ""


def server_config(gguf: Path, port: int, threads: int = 1, lookup_tokens: int = LOOKUP_TOKENS) -> dict:
    """llama-cpp-python config file: one GGUF served as ``target`` and ``target-lookup``."""
    common = {"model": str(gguf), "n_ctx": 512, "n_batch": 512, "n_threads": threads, "n_threads_batch": threads,
              "logits_all": True, "verbose": False, "cache": False,
              "type_k": 0, "type_v": 0}  # f32 KV cache: llama.cpp's default f16 cache moves logits by ~3.5e-3
    return {"host": "127.0.0.1", "port": port, "interrupt_requests": False,
            "models": [{**common, "model_alias": "target"},
                       {**common, "model_alias": "target-lookup", "draft_model": "prompt-lookup-decoding",
                        "draft_model_num_pred_tokens": lookup_tokens}]}


def start_server(gguf: Path, workdir: Path, port: int | None = None, threads: int = 1,
                 startup_timeout: float = 120.0) -> LlamaServer:
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
    return _wait_until_up(LlamaServer(process, f"http://127.0.0.1:{port}", log), "/v1/models", startup_timeout)


def _wait_until_up(server: LlamaServer, route: str, startup_timeout: float) -> LlamaServer:
    """Poll ``route`` until it answers 200; stop the server and raise with its log otherwise."""
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with {server.process.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(server.base_url + route, timeout=2) as response:
                if response.status == 200:
                    return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"llama.cpp server did not answer within {startup_timeout:.0f} s:\n{server.log_tail()}")


def llama_server_command(target: Path, port: int, draft: Path | None = None, threads: int = 1,
                         draft_tokens: int = DRAFT_TOKENS, parallel: int = 1, batch: int | None = None) -> list[str]:
    """``llama-server`` on loopback: ``parallel`` slots of 512 tokens each (continuous batching), f32 KV caches (as
    the llama-cpp-python server), ``/metrics`` on, ``batch`` the prefill chunk (``-b``/``-ub``; None: the
    engine's default), and with ``draft`` the draft model proposing ``draft_tokens`` tokens per pass on every
    step it can (``--spec-draft-n-min 0``: no minimum; ``--spec-draft-p-min 0``: no confidence cut-off)."""
    command = [str(engine_binary("llama-server")), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
               "-c", str(512 * parallel), "-np", str(parallel), "-t", str(threads), "-tb", str(threads),
               "-ctk", "f32", "-ctv", "f32",
               "--metrics", "--no-webui", "--no-warmup", "-a", "target-nodraft" if draft is None else "target-draft"]
    if batch is not None:
        command += ["-b", str(batch), "-ub", str(batch)]
    if draft is not None:
        # --spec-type draft-simple: without it this llama.cpp loads the -md model and never drafts (the type is
        # inferred from the draft GGUF only for MTP/DFlash heads; a plain Llama draft leaves it at "none")
        command += ["-md", str(draft), "--spec-type", "draft-simple", "-td", str(threads), "-tbd", str(threads),
                    "-ctkd", "f32", "-ctvd", "f32",
                    "--spec-draft-n-max", str(draft_tokens), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    return command


def start_llama_server(target: Path, workdir: Path, draft: Path | None = None, port: int | None = None,
                       threads: int = 1, draft_tokens: int = DRAFT_TOKENS, startup_timeout: float = 120.0,
                       parallel: int = 1, batch: int | None = None) -> LlamaServer:
    """Start llama.cpp's ``llama-server`` (built by :func:`build_engine`) and wait until ``/health`` answers."""
    port = port or free_port()
    log = workdir / f"llama-server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(llama_server_command(target, port, draft, threads, draft_tokens, parallel, batch),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return _wait_until_up(LlamaServer(process, f"http://127.0.0.1:{port}", log), "/health", startup_timeout)


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


# ------------------------------------------------------------ llama.cpp's `speculative` example as a sampler

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

        from specdec_lab.adapters.endpoint import distinct_seeds
        from specdec_lab.samplers.naive import SampleResult, check_request

        from specdec_lab.drafting import add_positions

        check_request(prompt, n, length)
        text = pair.decode(prompt.tolist())
        rows, counts = [], {"processes": 0, "refused_samples": 0, "stopped_early": 0, "reruns": 0}
        counts.update({f"{key}@{t}": 0 for t in range(1, length + 1) for key in ("drafted", "accepted")})
        bar = tqdm(total=n, desc="llama-speculative", leave=False, disable=not self.progress)
        while len(rows) < n:
            for seed in distinct_seeds(generator, n - len(rows)):
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


@contextlib.contextmanager
def bundled_ggufs():
    """The bundled target and draft as f32 GGUF files in a temporary folder: yields (target, draft)."""
    with tempfile.TemporaryDirectory(prefix="specdec-llama-") as tmp:
        yield (convert_to_gguf(Path(tmp) / "target-f32.gguf"),
               convert_to_gguf(Path(tmp) / "draft-f32.gguf", BUNDLED_DIR / "draft"))


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
        _run_converter(args.converter or converter_dir(), args.model_dir, args.out)
        return 0
    return _serve(args.url_file, args.threads, args.model)


if __name__ == "__main__":
    sys.exit(main())
