"""llama.cpp for the audits, from the pinned ``llama-cpp-python`` sdist: its GGUF converter, its CPU build.

1. :func:`fetch_converter` takes llama.cpp's HF → GGUF converter (``convert_hf_to_gguf.py`` with its
   ``conversion/`` and ``gguf-py/`` packages) out of the pinned ``llama-cpp-python`` source
   distribution (``pip download``; done once by ``make``, kept under ``.venv/share``).
2. :func:`convert_to_gguf` converts ``specdec_lab/bundled/target`` (or the draft) to an f32 GGUF; raises RuntimeError with
   the converter's output when it fails. The converter identifies a BPE pre-tokenizer by hashing the token ids of
   a test string; our tokenizer, trained by :mod:`specdec_lab.training.base`, is not in its table, so it stops
   with "BPE pre-tokenizer was not recognized". Our tokenizer's pre-tokenizer *is* GPT-2's (``ByteLevel`` with the
   GPT-2 regex, no prefix space, no normaliser), so the conversion wraps ``get_vocab_base_pre`` to answer
   ``"gpt-2"`` for exactly that configuration — and refuses any other. The tests check the result: llama.cpp's
   tokenization and greedy tokens equal ours.
3. :func:`build_engine` builds llama.cpp's own ``llama-server`` and the ``llama-speculative`` /
   ``llama-speculative-simple`` tools (:data:`ENGINE_TARGETS`) for the CPU from the same sdist's vendored tree
   (``make llama-cpp``, once per machine, cached outside the clone by the pin: :func:`engine_dir`);
   :func:`engine_binary` is a built program's path (FileNotFoundError when not built).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from specdec_lab.adapters.worker import cache_root
from specdec_lab.models import BUNDLED_DIR

VERSION = "0.3.36"  # llama-cpp-python, pinned in requirements-audit.txt


def converter_dir() -> Path:
    """Where the converter lives: ``$SPECDEC_LAB_LLAMA_CONVERTER`` or ``<venv>/share/specdec-lab/...``."""
    default = Path(sys.prefix) / "share" / "specdec-lab" / f"llama.cpp-convert-{VERSION}"
    return Path(os.environ.get("SPECDEC_LAB_LLAMA_CONVERTER", default))


def fetch_converter(dest: Path | None = None) -> Path:
    """Extract the converter from the pinned llama-cpp-python sdist (downloaded with pip)."""
    dest = dest or converter_dir()
    if not (dest / "convert_hf_to_gguf.py").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _extract_vendored(dest, ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE"))
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
    return Path(os.environ.get("SPECDEC_LAB_LLAMA_CPP", cache_root() / f"llama.cpp-{VERSION}"))


def engine_binary(name: str) -> Path:
    """Path of a built llama.cpp program (``llama-server``, ...); a clear error when it is not built."""
    path = engine_dir() / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; build llama.cpp with `make llama-cpp` "
                                f"(python -m specdec_lab.adapters.llamacpp build-engine)")
    return path


def _extract_vendored(dest: Path, wanted: tuple[str, ...] = ("",)) -> None:
    """Put the files of the llama.cpp tree vendored in the pinned llama-cpp-python sdist (downloaded with pip) whose
    paths start with one of ``wanted`` at ``dest`` (replacing it): staged in a temporary folder, then moved."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        staging = Path(tmp) / "out"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and len(m.name) > len(prefix)
                       and m.name[len(prefix):].startswith(wanted) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(staging, members=members, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)


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
        _extract_vendored(src)
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


def run_converter(converter: Path, model_dir: Path, out: Path) -> None:
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


@contextlib.contextmanager
def bundled_ggufs():
    """The bundled target and draft as f32 GGUF files in a temporary folder: yields (target, draft)."""
    with tempfile.TemporaryDirectory(prefix="specdec-llama-") as tmp:
        yield (convert_to_gguf(Path(tmp) / "target-f32.gguf"),
               convert_to_gguf(Path(tmp) / "draft-f32.gguf", BUNDLED_DIR / "draft"))
