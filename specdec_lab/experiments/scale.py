"""The notebooks' scale knob and start-up: one place for both.

``SPECDEC_LAB_SCALE=ci`` (the default, what nbval runs: each notebook in about a minute on 2 CPU
cores) or ``full`` (``make notebooks``: the sample sizes a claim deserves).

>>> scale("ci").name, scale("full").samples > scale("ci").samples
('ci', True)
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

SCALE_ENV = "SPECDEC_LAB_SCALE"


@dataclass(frozen=True)
class Scale:
    """Sample sizes of the notebooks' experiments at one scale."""

    name: str
    samples: int  # per lossless sampler in a distributional check
    equivalence_samples: int  # per lossless sampler in notebook 03: at least the planner's m for its prompt (24,145 ci)
    control_samples: int  # per negative control: its effects are large (TV >= 0.05)
    length: int  # new tokens per sample
    replicates: int  # independent replicate runs for the p-value uniformity meta-test
    replicate_samples: int  # samples per replicate
    power_reps: int  # simulated test runs per sample size on a power curve
    chains: int  # sampled continuations per prompt that supply real prefixes for exact checks
    audit_samples: int  # per audited external implementation (HF generate runs at batch 1: ~16 ms a sample)
    meta_reps: int = 20  # suite runs on samples of the exact law for the size meta-test (notebook 05)
    meta_samples: int = 2_000  # two-token samples per meta-test run
    detection_reps: int = 4  # suite runs per planted fault strength (notebook 05)
    detection_samples: int = 2_000  # samples per detection run (make verify's negative controls: 10,000)
    detection_step: int = 5  # every n-th strength of each planted family's grid (ci: its weakest and strongest)
    kernel_vocab: int = 32_000  # notebook 09: the vocabulary of the kernels that must pass (Llama-2's)
    kernel_samples: int = 400  # draws per scenario row for those kernels
    kernel_control_vocab: int = 4_000  # notebook 09: the negative controls' vocabulary (their faults are large)
    kernel_control_samples: int = 600  # draws per scenario row for each control (300 misses the greedy-uniforms pair)


SCALES = {
    "ci": Scale("ci", samples=8_000, equivalence_samples=25_000, control_samples=2_000, length=3, replicates=30,
                replicate_samples=600, power_reps=200, chains=16, audit_samples=1_000),
    "full": Scale("full", samples=80_000, equivalence_samples=80_000, control_samples=10_000, length=3, replicates=200,
                  replicate_samples=4_000, power_reps=1_000, chains=64, audit_samples=20_000,
                  meta_reps=400, meta_samples=10_000, detection_reps=20, detection_samples=10_000,
                  detection_step=1, kernel_vocab=128_256, kernel_samples=4_000, kernel_control_vocab=32_000,
                  kernel_control_samples=1_000),
}


def scale(name: str | None = None) -> Scale:
    """The scale named ``name``, else ``$SPECDEC_LAB_SCALE``, else ``"ci"``.

    >>> scale("nope")
    Traceback (most recent call last):
    ...
    ValueError: unknown scale 'nope' (from SPECDEC_LAB_SCALE or the argument); valid scales: ci, full
    """
    chosen = name if name is not None else os.environ.get(SCALE_ENV, "ci")
    if chosen not in SCALES:
        raise ValueError(f"unknown scale {chosen!r} (from {SCALE_ENV} or the argument); "
                         f"valid scales: {', '.join(SCALES)}")
    return SCALES[chosen]


def default_device() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``: the one place notebooks pick it."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def setup(name: str | None = None, threads: int | None = 1) -> Scale:
    """Start a notebook: seaborn's theme, fixed pandas display, no model-loading progress bars, and the scale in force.

    ``threads`` sets torch's intra-op threads; 1 by default: the bundled models' kernels are tiny,
    and on a busy 2-core machine a second spinning thread made a notebook cell up to 30x slower in
    wall time (HF ``generate`` at batch 1: 1,138 s with 2 threads, 37 s with 1). None leaves it alone.
    """
    import seaborn as sns
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights" bars would land in the committed outputs
    if threads is not None:
        torch.set_num_threads(int(threads))
    sns.set_theme(context="notebook", style="whitegrid")
    pd.set_option("display.precision", 4)
    pd.set_option("display.max_colwidth", 80)
    return scale(name)


def work_dir(prefix: str = "specdec-lab-") -> Path:
    """A fresh temporary folder for sample files (nothing is written into the repository)."""
    return Path(tempfile.mkdtemp(prefix=prefix))
