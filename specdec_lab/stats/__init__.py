"""Goodness of fit and equivalence against an exactly known target law p.

The question is never "do two samplers look alike" but "is sampler S's law equal to p", and p is
computable exactly from the target model. So the main tools are identity tests against p, an upper
confidence bound on TV(q, p) (what a "pass" means), and a planner that says how many samples make a
test able to see a given TV. Conventions follow ``scipy.stats``: public functions validate their
input and return named results that unpack as ``(statistic, pvalue)``.

Here the sampler's unknown law is written q̂ (empirical) / q (true) and the target law p; counts
are ``N_i`` over ``m`` samples. One module per idea:

- :mod:`~specdec_lab.stats.identity` — identity tests (Pearson/G with tail merging, ADK, two-sample
  closeness, per-prefix conditional tests, randomized PIT, the log-probability z-test, Holm, the
  calibration meta-test and the anytime-valid e-process);
- :mod:`~specdec_lab.stats.plugin` — plug-in TV and KL, the plug-in margin, the two-sample TV bound;
- :mod:`~specdec_lab.stats.holder` — the Hölder kept-set test that the certified bound inverts;
- :mod:`~specdec_lab.stats.bounds` — the certified TV upper bound (floors, routes, δ split) and its plan;
- :mod:`~specdec_lab.stats.coupling` — the coupling certificate (TV ≤ P(X ≠ Y) from paired draws), Clopper–Pearson;
- :mod:`~specdec_lab.stats.independence` — the collision test;
- :mod:`~specdec_lab.stats.planning` — sample sizes and power;
- :mod:`~specdec_lab.stats.coverage` — the coverage study of the TV bound (``make coverage``).
"""

from specdec_lab.stats.bounds import FLOOR_MULTIPLES, TV_ROUTES, BoundPlan, TVBound, expected_tv_bound, tv_upper_bound
from specdec_lab.stats.coupling import binomial_tail, clopper_pearson_upper, coupling_pairs_needed, coupling_tv_upper
from specdec_lab.stats.holder import (SKEW_CAP, KeptSetTest, deviation_shapes, holder_statistic, holder_statistics,
                                      poisson_quadratic_k3, skew_k3_coefficients, skew_lift)
from specdec_lab.stats.plugin import (expected_tv_plugin, kl_miller_madow, plugin_margin, tv_plugin,
                                      two_sample_tv_upper)
from specdec_lab.stats.identity import (adk_identity, chisquare_identity, closeness_two_sample,
                                        conditional_tests, dirichlet_eprocess, holm, logprob_ztest,
                                        merge_tail, pit_ks_test, randomized_pit, uniformity_test)
from specdec_lab.stats.independence import _collision_null, _collision_parts, collision_test, pair_cells
from specdec_lab.stats.planning import (LookPlan, plan_bound_by_simulation, plan_looks, plan_sample_size,
                                        plan_tv_bound_samples, plan_two_sample_bound, power_chisquare)
from specdec_lab.stats.results import (ADKResult, ChiSquareResult, ClosenessResult, CollisionResult,
                                       EProcessResult, HolmResult, KSResult, ZResult)

__all__ = [
    "ADKResult", "BoundPlan", "LookPlan", "ChiSquareResult", "ClosenessResult", "CollisionResult", "EProcessResult",
    "FLOOR_MULTIPLES", "HolmResult", "SKEW_CAP", "KSResult", "KeptSetTest", "TVBound", "TV_ROUTES", "ZResult",
    "adk_identity", "chisquare_identity", "closeness_two_sample", "collision_test", "conditional_tests",
    "deviation_shapes", "dirichlet_eprocess", "expected_tv_bound", "expected_tv_plugin", "holder_statistic",
    "holder_statistics", "holm", "kl_miller_madow", "logprob_ztest", "plugin_margin", "merge_tail", "pair_cells",
    "pit_ks_test", "plan_bound_by_simulation", "plan_looks", "poisson_quadratic_k3", "plan_sample_size", "plan_tv_bound_samples",
    "plan_two_sample_bound",
    "power_chisquare", "randomized_pit", "skew_k3_coefficients", "skew_lift", "tv_plugin", "tv_upper_bound", "two_sample_tv_upper",
    "uniformity_test", "binomial_tail", "clopper_pearson_upper", "coupling_pairs_needed", "coupling_tv_upper",
]
