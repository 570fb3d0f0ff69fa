"""Opt-in fixes of engine defects the audits found; never applied unless asked for.

- :mod:`~specdec_lab.patches.vllm_cpu_expand` — vLLM's CPU build expands the rejection sampler's float
  per-request parameters (temperature, top-p) through an int64 temporary and never copies back
  (``vllm/utils/cpu_triton_utils.py``); ``specdec-lab audit vllm --patch vllm-cpu-expand`` applies the fix
  inside the audit's vLLM worker process only (the installed files stay as they are).
"""

PATCHES = {"vllm-cpu-expand": "specdec_lab/patches/vllm_cpu_expand.py"}
