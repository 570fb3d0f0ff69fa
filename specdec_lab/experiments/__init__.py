"""What the teaching notebooks call: one module per notebook, named for its topic.

Notebook cells hold prose, maths and calls into the library, never loops of their own (Medusa's
explanatory notebook drifted from its library); so every experiment a notebook shows lives in its
module here as a function with a test, and each notebook imports one of them:

========================================  =============================================
notebook                                   module
========================================  =============================================
00_worked_example                          :mod:`~specdec_lab.experiments.worked_example`
01_memory_wall                             :mod:`~specdec_lab.experiments.memory_wall`
02_proof_by_numbers                        :mod:`~specdec_lab.experiments.proof_by_numbers`
03_real_models_chi_square                  :mod:`~specdec_lab.experiments.chi_square`
04_medusa_trees                            :mod:`~specdec_lab.experiments.medusa_trees`
05_negative_controls_and_power             :mod:`~specdec_lab.experiments.negative_controls`
06_speedup_calibrator                      :mod:`~specdec_lab.experiments.speedup_calibrator`
07_auditing_engines                        :mod:`~specdec_lab.experiments.engine_audits`
08_serving_configs                         :mod:`~specdec_lab.experiments.serving_configs`
09_kernel_audit                            :mod:`~specdec_lab.experiments.kernel_audit`
========================================  =============================================

The scale knob (``SPECDEC_LAB_SCALE=ci|full``) and the notebooks' start-up live in
:mod:`~specdec_lab.experiments.scale`; every topic module re-exports ``setup``, ``default_device``
and ``work_dir`` from there. These modules are the top layer (docs/architecture.md): nothing in the
library imports them.
"""
