"""llama-server with a draft model reports logprob 0.0 for every token its speculative step emits (standalone
reproduction; llama.cpp #27972's shape, present in the llama.cpp that llama-cpp-python 0.3.36 vendors).

Needs a ``llama-server`` binary and two GGUF files of one vocabulary (a target and a draft). With this repository:
``make llama-cpp`` builds the binary into ``~/.cache/specdec-lab/llama.cpp-0.3.36/bin`` and
``python -c "from specdec_lab.adapters.llamacpp_build import convert_to_gguf as c, BUNDLED_DIR as b;
c(__import__('pathlib').Path('/tmp/t.gguf')); c(__import__('pathlib').Path('/tmp/d.gguf'), b / 'draft')"``
writes the bundled pair as f32 GGUFs. Then::

    python docs/repro/llama_server_logprobs_speculative.py LLAMA_SERVER /tmp/t.gguf /tmp/d.gguf

It starts the server without and with the draft, sends one seeded request for 3 tokens with ``logprobs``, and prints
each token's reported logprob. Without the draft every token has its raw log-probability (a negative number);
with it, token 1 (from the prompt's pass) does, and tokens 2 and 3 (emitted by the verification step) report 0.0:
``tools/server/server-context.cpp``, the speculative "sample and accept" branch, builds each emitted token's result
with ``result.prob = 1.0f; // set later`` and ``// TODO: set result.probs``, and never calls
``populate_token_probs`` as the plain branch does; ``completion_token_output::probs_vector_to_json`` then writes
``logarithm(1.0) = 0``.
"""

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary: str, target: str, draft: str | None, log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [binary, "-m", target, "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-np", "1",
               "-t", "1", "-ctk", "f32", "-ctv", "f32", "--no-webui", "--no-warmup"]
    if draft:
        command += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
                    "--spec-draft-p-min", "0", "-ctkd", "f32", "-ctvd", "f32"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return process, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"llama-server did not start; see {log.name}")


def logprobs(url: str) -> list[tuple[int, float]]:
    body = {"prompt": "HAMLET.", "max_tokens": 3, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
            "seed": 7, "logprobs": 1}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=60))
    return [(entry["id"], entry["logprob"]) for entry in reply["choices"][0]["logprobs"]["content"]]


if __name__ == "__main__":
    binary, target, draft = sys.argv[1:4]
    with tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False) as log:
        for label, with_draft in (("without the draft", None), ("with the draft   ", draft)):
            process, url = serve(binary, target, with_draft, log)
            try:
                found = logprobs(url)
                print(f"{label}: " + ", ".join(f"token {i + 1} id {t} logprob {lp:.4f}"
                                              for i, (t, lp) in enumerate(found)))
            finally:
                process.terminate()
                process.wait()
