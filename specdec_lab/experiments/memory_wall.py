"""Notebook 01, the memory wall: roofline tables of decoding, batch sweeps, and decoding measured here."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec_lab import theory
from specdec_lab.experiments.scale import default_device, setup  # noqa: F401 (for the notebook)
from specdec_lab.sampling import make_generator
from specdec_lab.samplers.naive import NaiveConfig, sample_naive


def roofline_table(model: str, hardware_names, batch: int = 1, context: int = 0) -> pd.DataFrame:
    """One decoding step of ``model`` on each accelerator: bytes, time, tokens/s bound, what binds."""
    rows = []
    for name in hardware_names:
        r = theory.decode_roofline(model, name, batch=batch, context=context)
        hw = theory.get_hardware(name)
        rows.append({"hardware": name, "bandwidth TB/s": hw.bandwidth / 1e12, "TFLOP/s": hw.flops / 1e12,
                     "GB moved per step": r.bytes_moved / 1e9, "step ms": 1e3 * r.step_time_s,
                     "tokens/s ≤": r.tokens_per_s, "bound": r.bound, "compute used": r.compute_utilisation,
                     "compute-bound from batch": theory.compute_bound_batch(model, name, context)})
    return pd.DataFrame(rows)


def hardware_peaks(hardware_names) -> dict[str, tuple[float, float]]:
    """name -> (bandwidth bytes/s, peak FLOP/s), the two numbers a roofline needs."""
    return {name: (theory.get_hardware(name).bandwidth, theory.get_hardware(name).flops) for name in hardware_names}


def batch_sweep(model: str, hardware_names, batches, context: int = 0) -> pd.DataFrame:
    """Roofline tokens/s (all sequences together) and arithmetic intensity for each batch size."""
    rows = []
    for name in hardware_names:
        for batch in batches:
            r = theory.decode_roofline(model, name, batch=int(batch), context=context)
            rows.append({"hardware": name, "batch": int(batch), "tokens/s ≤": r.tokens_per_s, "bound": r.bound,
                         "FLOP per byte": r.arithmetic_intensity, "FLOP/s attained": r.flops / r.step_time_s,
                         "bytes per token": r.bytes_moved / (r.batch * r.tokens)})
    return pd.DataFrame(rows)


def measure_decode(pair, batches, steps: int = 8, repeats: int = 3, context: str = "ROMEO:\n") -> pd.DataFrame:
    """Measured decoding speed of the bundled target here: ``steps`` cached one-token steps at each
    batch size (median of ``repeats`` after a warm-up), next to the roofline of this machine
    (its copy bandwidth and fp32 matmul peak, measured by :func:`specdec_lab.bench.job_machine`)."""
    from specdec_lab import bench

    machine = bench.job_machine(bench.BenchConfig(repeats=repeats, matmul_size=1024, device=str(pair.device)))
    here = theory.Hardware("this machine", machine["copy_gbs"]["median"] * 1e9,
                           machine["matmul_gflops"]["median"] * 1e9, 1e12, "measured")
    spec = theory.get_model("bundled-target")
    prompt = pair.encode(context)
    rows = []
    for batch in batches:
        def run(B=int(batch)):
            sample_naive(pair, prompt, B, steps, NaiveConfig(), make_generator(0, pair.device))
        seconds = float(np.median(bench.time_repeats(run, repeats, pair.device)))
        bound = theory.decode_roofline(spec, here, batch=int(batch), context=prompt.numel())
        rows.append({"batch": int(batch), "ms per step": 1e3 * seconds / steps,
                     "tokens/s measured": batch * steps / seconds, "tokens/s roofline ≤": bound.tokens_per_s,
                     "bound": bound.bound, "share of roofline": batch * steps / seconds / bound.tokens_per_s})
    frame = pd.DataFrame(rows)
    frame.attrs["machine"] = {"copy GB/s": machine["copy_gbs"]["median"], "matmul GFLOP/s": machine["matmul_gflops"]["median"]}
    return frame
