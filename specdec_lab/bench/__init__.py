"""Benchmarks: sample-collection throughput, work per token, batch-1 latency, peak memory.

Statistical power costs samples (``stats.plan_sample_size(0.01, 256)`` ≈ 232k), so the samplers
must be fast. One run measures, on the same models:

1. **throughput** — samples/s (L new tokens each) of the batched naive and speculative samplers,
   Hugging Face ``generate`` (batched, plain sampling) and HF assisted generation (batch 1), as
   ratios to the two HF peers. All four draw from the same law p (temperature 1, no top-k/top-p,
   no EOS stopping). Twice: after a short prompt and after a long one, because our samplers feed a
   prompt once per batch and share its cache while HF ``generate`` feeds it once per sample;
2. **work per token** — target and draft forwards per generated token for K = 1..8, counted per
   chain by forward hooks on the models, against (1 − α)/(1 − α^{K+1}) from the measured α;
3. **batch-1 latency** — wall time per token, and the achieved fraction of this machine's matmul
   throughput (measured in the same run with a large fp32 matmul) and of its copy bandwidth;
4. **memory** — each configuration runs in a fresh subprocess that reports its peak RSS.

Timings are medians over ``repeats`` runs after one warm-up, with min and max as the spread.
One module per part, their public names re-exported here (``from specdec_lab import bench; bench.run_job(...)``):

- :mod:`~specdec_lab.bench.measure` — the settings (:class:`BenchConfig`, :data:`FULL`, :data:`QUICK`) and the
  instruments (timing, peak RSS, forward counters);
- :mod:`~specdec_lab.bench.jobs` — one function per measured configuration (:data:`JOBS`), run in a subprocess or
  in this process;
- :mod:`~specdec_lab.bench.tables` — the report's tables and markdown page;
- :mod:`~specdec_lab.bench.run` — the whole run (bench.json, bench.md), the vLLM row, the command line
  (``python -m specdec_lab.bench``).

>>> QUICK.length, QUICK.k
(8, 4)
>>> sorted(JOBS)[:3]
['baseline', 'hf_assisted', 'hf_generate']
"""

from specdec_lab.bench.jobs import (JOBS, LONG, MEDUSA_TREES, ORDER, THROUGHPUT, VLLM_ORDER, hf_assisted, hf_config,
                                    hf_generate_batch, hf_plain_single, job_baseline, job_hf_assisted,
                                    job_hf_generate, job_latency, job_machine, job_naive, job_speculative,
                                    job_speculative_trim, job_vllm_draft_model, job_vllm_eagle, job_vllm_none,
                                    job_work, medusa_status, run_in_subprocess, run_job)
from specdec_lab.bench.measure import (FULL, LONG_PROMPT, QUICK, BenchConfig, ForwardCounter, matmul_params,
                                       peak_rss_mib, spread, synchronize, time_repeats, timed_and_counted)
from specdec_lab.bench.run import main, run_benchmark, run_vllm_benchmark
from specdec_lab.bench.tables import (latency_table, memory_table, render, throughput_table, vllm_table,
                                      work_table)

__all__ = [
    "FULL", "JOBS", "LONG", "LONG_PROMPT", "MEDUSA_TREES", "ORDER", "QUICK", "THROUGHPUT", "VLLM_ORDER", "BenchConfig",
    "ForwardCounter", "hf_assisted", "hf_config", "hf_generate_batch", "hf_plain_single", "job_baseline",
    "job_hf_assisted", "job_hf_generate", "job_latency", "job_machine", "job_naive", "job_speculative",
    "job_speculative_trim", "job_vllm_draft_model", "job_vllm_eagle", "job_vllm_none", "job_work", "latency_table",
    "main", "matmul_params", "medusa_status", "memory_table", "peak_rss_mib", "render", "run_benchmark",
    "run_in_subprocess", "run_job", "run_vllm_benchmark", "spread", "synchronize", "throughput_table",
    "time_repeats", "timed_and_counted", "vllm_table", "work_table",
]
