"""Fix of vLLM 0.32's CPU ``expand_batch_to_tokens`` for float inputs (opt-in; imports torch and vLLM only).

The defect (``vllm/utils/cpu_triton_utils.py``, the C++ fallback the CPU platform registers for the Triton
``_expand`` kernel of ``vllm/v1/sample/rejection_sampler.py``)::

    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        torch.ops._C.expand_kernel_impl(
            _ensure_int64(output),          # a float32 output becomes a new int64 tensor: written, then dropped
            _ensure_int64(input_val),       # a float32 input is truncated to int64 (T = 0.7 -> 0)
            _ensure_int64(cu_num_tokens), replace_from, replace_to)

so ``expand_batch_to_tokens`` returns the uninitialised ``x.new_empty(num_tokens)`` for the per-token temperature
and top-p of every verified position. The neighbouring wrappers copy their int64 results back
(``next_token_ids.copy_(next_i64.to(orig_next_dtype))``); this one does not, and no copy back could repair
the truncated input. The fix: a dtype-preserving path for non-int64 tensors (what the Triton kernel computes:
each request's value, ``replace_from`` replaced by ``replace_to``, repeated over its tokens)::

    if output.dtype != torch.int64 or input_val.dtype != torch.int64:
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output.copy_(torch.repeat_interleave(values, counts, output_size=output.numel()))
        return

Use: :func:`apply` before the engine starts (the CPU platform registers ``cpu_triton_utils._expand_kernel_impl``
by attribute lookup when the engine starts, so the fixed function is the one registered). The audit does this
in its worker process when asked (``specdec-lab audit vllm --patch vllm-cpu-expand``); the installed files are
not modified. ``python specdec_lab/patches/vllm_cpu_expand.py`` (in vLLM's environment) checks the fix on the
reproduction's inputs.
"""

import torch

NAME = "vllm-cpu-expand"


def expand_kernel_impl_fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``_expand_kernel_impl`` with a float path: output[t] = input[i] (``replace_from`` → ``replace_to``) for
    the tokens t of request i (cu_num_tokens[i − 1] <= t < cu_num_tokens[i])."""
    if output.dtype != torch.int64 or input_val.dtype != torch.int64:
        counts = torch.diff(cu_num_tokens.to(torch.long), prepend=torch.zeros(1, dtype=torch.long))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output.copy_(torch.repeat_interleave(values, counts, output_size=output.numel()).to(output.dtype))
        return
    torch.ops._C.expand_kernel_impl(output, input_val, cu_num_tokens.to(torch.int64), replace_from, replace_to)


def apply() -> str:
    """Install the fix in this process's vLLM (before an engine starts); returns what was replaced."""
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._expand_kernel_impl
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl_fixed
    return f"{original.__module__}.{original.__name__} -> {__name__}.expand_kernel_impl_fixed"


if __name__ == "__main__":
    import vllm._custom_ops  # noqa: F401
    from vllm.platforms import current_platform

    print(apply())
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    got = expand_batch_to_tokens(torch.tensor([1.0, 0.7]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    print("expected [1.0, 1.0, 0.7, 0.7], got", [round(float(v), 6) for v in got])
