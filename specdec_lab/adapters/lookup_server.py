"""llama-cpp-python's server with a log of its prompt-lookup draft calls (for the drafted share).

``python -m specdec_lab.adapters.lookup_server --config_file FILE`` runs ``python -m llama_cpp.server``
unchanged, except that every call of ``LlamaPromptLookupDecoding`` (llama-cpp-python's prompt-lookup
"draft model", asked for a draft once per generation step) is recorded as ``[input length, draft token
ids]`` and served at ``GET /specdec-lab/draft-calls``. Nothing of the sampling path is touched: the
wrapper calls the original method and returns its result. :func:`specdec_lab.adapters.endpoint.lookup_positions`
turns the log into the samples whose token t was drafted and accepted.

Why a log: llama-cpp-python exports no speculation counters (no ``/metrics``), and its ``generate``
asks the draft model after each verification round: a call with input length P + j proposes tokens for
positions j + 1, … (P: the prompt's length), so the calls say exactly which positions were drafted.
"""

from __future__ import annotations

import sys
import threading

CALLS: list = []
_LOCK = threading.Lock()


def install() -> None:
    """Wrap the draft model's ``__call__`` and add the log's route to the server's app."""
    import llama_cpp.server.__main__ as server_main
    import llama_cpp.server.app as app_module
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    original = LlamaPromptLookupDecoding.__call__

    def recorded(self, input_ids, *args, **kwargs):
        draft = original(self, input_ids, *args, **kwargs)
        with _LOCK:
            CALLS.append([int(len(input_ids)), [int(t) for t in draft]])
        return draft

    LlamaPromptLookupDecoding.__call__ = recorded
    create_app = app_module.create_app

    def create_app_with_log(*args, **kwargs):
        app = create_app(*args, **kwargs)

        @app.get("/specdec-lab/draft-calls")
        def draft_calls() -> dict:
            with _LOCK:
                return {"calls": list(CALLS)}

        return app

    server_main.create_app = create_app_with_log


def main() -> None:
    install()
    import llama_cpp.server.__main__ as server_main

    sys.argv[0] = "llama_cpp.server"
    server_main.main()


if __name__ == "__main__":
    main()
