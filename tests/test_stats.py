"""Statistics against scipy/statsmodels and Monte Carlo references; coverage and calibration."""

import zlib

import numpy as np
import pytest
import torch
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from specdec_lab import stats
from specdec_lab.stats import coverage
from specdec_lab.sampling import SamplingConfig, to_probs


def zipf(n, s=1.1):
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def sparse_tail_law():
    """40,512 cells: a Zipf head, 1,000 cells of 5e-6 and 39,000 of 1e-8 — more than the planner's SMALL_LAW_CELLS,
    with cells between the chosen floor (0.01/m at m = 20,000-30,000) and the coarse one, and a tail below both."""
    p = np.concatenate([0.999 * zipf(512), np.full(1_000, 5e-6), np.full(39_000, 1e-8)])
    return p / p.sum()


def binomial_slack(rate, reps, z=3.0):
    """Upper tolerance for an observed rejection rate whose true value is at most ``rate``."""
    return rate + z * np.sqrt(rate * (1 - rate) / reps)


@pytest.fixture(scope="module")
def real_law(pair, prompt):
    """A real bundled-model next-token law: peaked, with a long tail."""
    with torch.no_grad():
        logits = pair.target(prompt[None]).logits[0, -1, : pair.vocab_size]
    return to_probs(logits, SamplingConfig()).numpy()


class TestChiSquareIdentity:
    def test_matches_scipy_without_merging(self):
        rng = np.random.default_rng(0)
        p = np.array([0.4, 0.3, 0.2, 0.1])
        counts = rng.multinomial(500, p)
        for name, lam in (("pearson", 1.0), ("g", 0.0)):
            ours = stats.chisquare_identity(counts, p, statistic=name)
            ref = sps.power_divergence(counts, 500 * p, lambda_=lam)
            assert ours.merged_mass == 0 and ours.df == 3
            assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
            assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-12)

    def test_tail_merging_reports_mass_and_tests_the_tail(self):
        p = zipf(400)
        res = stats.chisquare_identity(np.random.default_rng(1).multinomial(2000, p), p, rng=np.random.default_rng(2))
        keep, tail = stats.merge_tail(p, 2000)
        assert (2000 * p[keep] >= 5).all() and 2000 * p[tail].sum() >= 5
        assert res.merged_mass == pytest.approx(p[tail].sum())
        assert res.n_bins == keep.sum() + 1 and not np.isnan(res.tail_pvalue)

    def test_mass_moved_inside_the_tail_is_caught_by_the_tail_test(self):
        p = zipf(400)
        keep, tail = stats.merge_tail(p, 5000)
        q = p.copy()
        idx = np.flatnonzero(tail)
        q[idx] = 0
        q[idx[: len(idx) // 4]] = p[tail].sum() / (len(idx) // 4)  # same tail mass, other tokens
        res = stats.chisquare_identity(np.random.default_rng(3).multinomial(5000, q), p, rng=np.random.default_rng(4))
        assert res.pvalue > 1e-3  # the pooled test cannot see it
        assert res.tail_pvalue < 1e-3  # the tail test does

    def test_type_one_error(self):
        rng = np.random.default_rng(5)
        p = zipf(100)
        pv = [stats.chisquare_identity(rng.multinomial(1000, p), p).pvalue for _ in range(400)]
        assert np.mean(np.array(pv) < 0.05) <= binomial_slack(0.05, 400)

    @pytest.mark.parametrize("counts,p,message", [
        ([1, 2], [0.5, 0.3, 0.2], "one length"),
        ([1, 2, 3], [0.5, 0.3, 0.3], "probability vector"),
        ([0, 0, 0], [0.5, 0.3, 0.2], "no samples"),
        ([5, 0, 1], [0.5, 0.5, 0.0], "impossible tokens"),
        ([-1, 2, 3], [0.5, 0.3, 0.2], "non-negative"),
    ])
    def test_bad_input(self, counts, p, message):
        with pytest.raises(ValueError, match=message):
            stats.chisquare_identity(counts, p)

    def test_unknown_statistic(self):
        with pytest.raises(ValueError, match="statistic must be one of"):
            stats.chisquare_identity([1, 2], [0.5, 0.5], statistic="cramer")


class TestADK:
    def test_statistic_formula(self):
        p = np.array([0.5, 0.25, 0.25])
        counts = np.array([60, 20, 20])
        res = stats.adk_identity(counts, p, n_resamples=99, rng=np.random.default_rng(0))
        expected = sum(((c - 100 * q) ** 2 - c) / (100 * q) for c, q in zip(counts, p))
        assert res.statistic == pytest.approx(expected)

    def test_pvalue_matches_independent_monte_carlo(self):
        p = zipf(200)
        counts = np.random.default_rng(1).multinomial(800, 0.9 * p + 0.1 * zipf(200, 0.5))
        ours = stats.adk_identity(counts, p, floor=0.0, n_resamples=20_000, rng=np.random.default_rng(2)).pvalue
        # reference: plain loop over fresh draws, computing Z by the formula
        rng = np.random.default_rng(3)
        z0 = (((counts - 800 * p) ** 2 - counts) / (800 * p)).sum()
        hits = 0
        for _ in range(4000):
            c = rng.multinomial(800, p)
            hits += (((c - 800 * p) ** 2 - c) / (800 * p)).sum() >= z0
        assert ours == pytest.approx((hits + 1) / 4001, abs=0.03)

    def test_null_pvalues_uniform(self):
        rng = np.random.default_rng(4)
        p = zipf(300)
        pv = [stats.adk_identity(rng.multinomial(500, p), p, n_resamples=999, rng=rng).pvalue for _ in range(200)]
        assert sps.kstest(pv, "uniform").pvalue > 1e-3

    def test_power_on_planted_alternative(self, real_law):
        q = 0.95 * real_law + 0.05 * np.roll(real_law, 1)
        counts = np.random.default_rng(5).multinomial(20_000, q)
        assert stats.adk_identity(counts, real_law, rng=np.random.default_rng(6)).pvalue < 1e-3

    def test_law_summing_just_above_one(self):
        # the --scale full crash: a conditional G test's tail of 488 cells, m = 2, every cell below the
        # floor 1/(10 m), so all pooled into one cell of mass 1 + 2e-16, which numpy's multinomial refused
        p = np.full(488, 1 / 488)
        p[0] += 2e-10  # within _counts_and_law's tolerance; the pooled cell is above 1
        assert p.sum() > 1
        counts = np.zeros(488, dtype=int)
        counts[[3, 7]] = 1
        res = stats.adk_identity(counts, p, rng=np.random.default_rng(0))
        assert (res.pvalue, res.support) == (1.0, 1)  # one cell carries no evidence
        many = stats.adk_identity(np.full(488, 5), p, n_resamples=99, rng=np.random.default_rng(0))
        assert many.support == 488 and 0 < many.pvalue <= 1  # renormalised cells above the floor draw fine

    def test_chisquare_tail_of_tiny_cells(self):
        # the same through chisquare_identity's tail test, as conditional_tests calls it
        p = np.r_[0.9, 0.1 * np.random.default_rng(11).dirichlet(np.ones(488))]
        assert (p[1:] / p[1:].sum()).sum() > 1  # the tail's inside law, as chisquare_identity forms it
        counts = np.zeros(489, dtype=int)
        counts[0], counts[[5, 9]] = 400, 1
        res = stats.chisquare_identity(counts, p, statistic="g", rng=np.random.default_rng(0))
        assert res.tail_pvalue == 1.0


class TestCloseness:
    def test_null_calibrated(self):
        rng = np.random.default_rng(0)
        p = zipf(50)
        pv = [stats.closeness_two_sample(rng.multinomial(300, p), rng.multinomial(400, p), n_resamples=499,
                                         rng=rng).pvalue for _ in range(200)]
        assert np.mean(np.array(pv) < 0.05) <= binomial_slack(0.05, 200)

    def test_power(self):
        rng = np.random.default_rng(1)
        p, q = zipf(50), zipf(50, 0.7)
        assert stats.closeness_two_sample(rng.multinomial(3000, p), rng.multinomial(3000, q), rng=rng).pvalue < 1e-3


class TestPluginMargin:
    @pytest.mark.parametrize("m", [50, 400, 20_000, 150_000])
    @pytest.mark.parametrize("delta", [0.001, 0.01])
    def test_is_an_exact_binomial_bound_at_every_q(self, m, delta):
        """P(q − N/m > margin) <= δ for N ~ Binomial(m, q), checked exactly (binomial cdf) on 20,000 values of q
        off the margin's own grid, and the margin is below McDiarmid's √(ln(1/δ)/2m)."""
        t = stats.plugin_margin(m, delta)
        q = np.random.default_rng(m).random(20_000)
        below = np.ceil(m * (q - t)) - 1  # N/m < q − t  <=>  N <= ceil(m (q − t)) − 1
        assert (sps.binom.cdf(below, m, q) <= delta).all()
        assert t < np.sqrt(np.log(1 / delta) / (2 * m))

    def test_is_nearly_the_normal_quantile_at_one_half(self):
        """The margin is ≈ z_δ/(2√m) (the q = ½ binomial), 16% below McDiarmid's at δ = 0.001 and m = 45,000."""
        m = 45_000
        assert stats.plugin_margin(m, 0.001) == pytest.approx(sps.norm.isf(0.001) / (2 * np.sqrt(m)), rel=0.01)
        assert stats.plugin_margin(m, 0.001) / np.sqrt(np.log(1000) / (2 * m)) == pytest.approx(0.835, abs=0.01)


class TestTwoSampleBound:
    def test_covers_the_true_tv(self):
        """The bound misses the true TV in at most 1% of replicates on a law pair where TV̂ is nearly unbiased
        (two cells, TV 0.06, m = 400 each), so the McDiarmid margin alone must carry the coverage."""
        rng = np.random.default_rng(3)
        p = np.array([0.5, 0.5])
        q = np.array([0.56, 0.44])  # TV 0.06; TV̂ at m = 400 is close to unbiased, so the margin does the work
        bounds = stats.two_sample_tv_upper(rng.multinomial(400, p, size=4000), rng.multinomial(400, q, size=4000))
        assert (bounds < 0.06).mean() <= 0.01

    def test_rejects_bad_input(self):
        with pytest.raises(ValueError, match="one shape"):
            stats.two_sample_tv_upper([1, 2], [1, 2, 3])
        with pytest.raises(ValueError, match="at least one observation"):
            stats.two_sample_tv_upper([0, 0], [1, 2])

    def test_plan_costs_more_than_the_exact_mode(self):
        """On a 200-cell law at ε = 0.05 the exact mode reaches ε with a third of what the two-sample mode needs per
        server, and the planned m meets its assurance (checked on fresh draws)."""
        p = zipf(200)
        two = stats.plan_two_sample_bound(p, 0.05, rng=np.random.default_rng(0))
        rng = np.random.default_rng(1)
        exact = stats.BoundPlan(p, two // 3).uppers(rng.multinomial(two // 3, p, size=500))  # the exact mode
        assert (exact > 0.05).mean() <= 0.01  # reaches ε with a third of one server's samples
        bounds = stats.two_sample_tv_upper(rng.multinomial(two, p, size=2000), rng.multinomial(two, p, size=2000))
        assert (bounds > 0.05).mean() <= 0.005


def test_holm_matches_statsmodels():
    pv = np.random.default_rng(0).random(12) ** 3
    ours = stats.holm(pv, alpha=0.05)
    reject, adjusted, _, _ = multipletests(pv, alpha=0.05, method="holm")
    np.testing.assert_allclose(ours.adjusted, adjusted)
    assert int(ours.statistic) == reject.sum()


class TestPITandZ:
    def _draws(self, p, n, rng):
        x = rng.choice(len(p), size=n, p=p)
        below = np.cumsum(p) - p
        return x, below[x], p[x]

    def test_pit_uniform_under_null_for_discrete_law(self, real_law):
        rng = np.random.default_rng(0)
        x, below, px = self._draws(real_law, 20_000, rng)
        u = stats.randomized_pit(below, px, rng)
        assert stats.pit_ks_test(u).pvalue > 1e-3
        assert sps.kstest(u, "uniform").statistic == pytest.approx(stats.pit_ks_test(u).statistic)

    def test_pit_rejects_tempered_law(self, real_law):
        rng = np.random.default_rng(1)
        hot = real_law ** 0.7 / (real_law ** 0.7).sum()
        x = rng.choice(len(hot), size=20_000, p=hot)
        u = stats.randomized_pit((np.cumsum(real_law) - real_law)[x], real_law[x], rng)
        assert stats.pit_ks_test(u).pvalue < 1e-3

    def test_logprob_z_null_and_temperature_sensitivity(self, real_law):
        rng = np.random.default_rng(2)
        logp = np.log(np.where(real_law > 0, real_law, 1))
        h = -(real_law * logp).sum()
        v = (real_law * logp ** 2).sum() - h ** 2
        null = [stats.logprob_ztest(logp[rng.choice(len(real_law), 2000, p=real_law)], np.full(2000, h),
                                    np.full(2000, v)).pvalue for _ in range(200)]
        assert np.mean(np.array(null) < 0.05) <= binomial_slack(0.05, 200)
        cold = real_law ** (1 / 0.9) / (real_law ** (1 / 0.9)).sum()
        x = rng.choice(len(cold), 20_000, p=cold)
        assert stats.logprob_ztest(logp[x], np.full(20_000, h), np.full(20_000, v)).pvalue < 1e-3


class TestEstimates:
    def test_tv_plugin(self):
        assert stats.tv_plugin([5, 5], [0.5, 0.5]) == 0
        assert stats.tv_plugin([10, 0], [0.5, 0.5]) == pytest.approx(0.5)

    def test_miller_madow_reduces_bias(self):
        rng = np.random.default_rng(0)
        p = zipf(100)
        q = 0.9 * p + 0.1 * zipf(100, 0.3)
        true_kl = float((q * np.log(q / p)).sum())
        mm, plug = [], []
        for _ in range(300):
            c = rng.multinomial(2000, q)
            mm.append(stats.kl_miller_madow(c, p))
            seen = c > 0
            plug.append(float((c[seen] / 2000 * np.log(c[seen] / 2000 / p[seen])).sum()))
        assert abs(np.mean(mm) - true_kl) < 0.5 * abs(np.mean(plug) - true_kl)


def too_many_misses(misses: int, reps: int, rate: float = 0.01, level: float = 1e-3) -> bool:
    """True when ``misses`` out of ``reps`` is implausible (one-sided binomial p < level) for a
    bound whose miss rate is at most ``rate``: 21 or more of 1,000 at 1%."""
    return bool(sps.binom.sf(misses - 1, reps, rate) < level)


class TestTVUpperBound:
    """Coverage of the 99% bound on the alternatives its construction finds hardest (the coverage
    study's, :mod:`specdec_lab.stats.coverage`, in small), and the parts it is built from."""

    @pytest.mark.parametrize("seed", range(6))
    def test_floor_search_criterion_equals_the_grid_build(self, seed):
        """The floor search's bisection (no grid) lands on the grid point the full unskewed build gives, on laws of
        1 to 3,000 cells, flat to spiky, at m from 2 to 300,000 (a wrong bisection changes the chosen floor)."""
        from specdec_lab.stats.holder import KeptSetTest

        rng = np.random.default_rng(seed)
        for size in (1, 2, 50, 3000):
            for m in (2, 1000, 300_000):
                p = rng.dirichlet(np.full(size, rng.choice([0.05, 1.0, 5.0])))
                p = p[p > 1e-300]
                delta = float(rng.choice([0.0085, 0.05]))
                assert (KeptSetTest.unskewed_upper_at_zero(p, m, delta)
                        == KeptSetTest.build(p, m, delta, skew=False).upper(0.0)), (size, m, delta)

    @pytest.mark.parametrize("law", ["real", "zipf"])
    @pytest.mark.parametrize("alternative", list(coverage.ALTERNATIVES))
    @pytest.mark.parametrize("m", [5_000, 50_000])
    def test_coverage_at_99(self, real_law, law, alternative, m):
        p = real_law if law == "real" else zipf(512)
        rng = np.random.default_rng(zlib.crc32(repr((law, alternative, m)).encode()))  # one fixed seed per case
        plan = stats.BoundPlan(p, m)
        tv = plan.expected_upper()  # at the edge of detection
        q = coverage.ALTERNATIVES[alternative](p, tv, plan.chosen_floor, rng)
        result = coverage.coverage_case(p, q, m, 1_000, rng, plan=plan)
        assert not too_many_misses(result["misses"], result["replicates"]), result

    @pytest.mark.parametrize("alternative", list(coverage.ALTERNATIVES))
    @pytest.mark.parametrize("floor", [0.0, 1e-4])
    def test_alternatives_stay_on_the_support_of_p(self, real_law, alternative, floor):
        """On a law with zeros (top-p), at floor 0 (every cell kept) too: q is a law on p's support."""
        p = np.where(real_law >= np.sort(real_law)[-21], real_law, 0.0)
        p /= p.sum()
        q = coverage.ALTERNATIVES[alternative](p, 0.01, floor, np.random.default_rng(3))
        assert (q >= 0).all() and q.sum() == pytest.approx(1.0) and not q[p == 0].any()

    @pytest.mark.parametrize("route", ["holder", "plugin"])
    @pytest.mark.parametrize("alternative", ["holder", "cauchy_schwarz", "rare_spike"])
    def test_each_route_covers_at_its_own_level(self, real_law, route, alternative):
        rng = np.random.default_rng(zlib.crc32(repr((route, alternative)).encode()))
        m = 20_000
        plan = stats.BoundPlan(real_law, m, route=route)
        q = coverage.ALTERNATIVES[alternative](real_law, 0.012, stats.BoundPlan(real_law, m).chosen_floor, rng)
        truth = coverage.tv(q, real_law)
        misses = sum(plan.bound(rng.multinomial(m, q)).upper < truth for _ in range(1_000))
        assert not too_many_misses(misses, 1_000)

    def test_holder_statistic_is_unbiased_for_d(self, real_law):
        """E[W] = D = Σ_A p^(−2/3) (q − p)² exactly under multinomial sampling (the N(N − 1)/(m − 1) term)."""
        rng = np.random.default_rng(14)
        q = coverage.holder(real_law, 0.05, 1e-4, rng)
        kept = real_law >= 1e-4
        d = float((real_law[kept] ** (-2 / 3) * (q[kept] - real_law[kept]) ** 2).sum())
        m = 500  # small m: the Poissonised version (without the correction) is biased by ≈ Σ a q² / m
        w = np.array([stats.holder_statistic(rng.multinomial(m, q)[kept], real_law[kept], m) for _ in range(20_000)])
        assert abs(w.mean() - d) < 4 * w.std() / np.sqrt(len(w)), (w.mean(), d)

    @pytest.mark.parametrize("c, lam", [(0.0, 40.0), (6.0, 30.0), (-6.0, 18.0), (25.0, 60.0)])
    def test_third_cumulant_of_the_summand_matches_monte_carlo(self, c, lam):
        """κ3 of Y = (N − μ)² − N, N ~ Poisson(λ), c = λ − μ: the formula the skew lift is built on."""
        n = np.random.default_rng(21).poisson(lam, 4_000_000)
        y = (n - (lam - c)) ** 2 - n
        k3 = stats.poisson_quadratic_k3(np.array(c), np.array(lam))
        se = np.sqrt(sps.moment(y, 6) / len(y))  # a generous standard error of the sample κ3
        assert abs(sps.kstat(y, 3) - k3) < 5 * se, (sps.kstat(y, 3), k3)
        assert y.mean() == pytest.approx(c ** 2, abs=5 * y.std() / np.sqrt(len(y)))

    def test_skew_polynomial_is_the_summed_negative_sign_cumulant(self, real_law):
        """The closed-form coefficients equal Σ a³ κ3 at the negative sign, and that is each cell's smaller value."""
        m, p_a = 30_000, real_law[real_law > 0]
        shapes = stats.deviation_shapes(p_a)[::37]
        coefficients = stats.skew_k3_coefficients(p_a, shapes, m)
        for x in (1e-4, 3e-3, 0.02):
            u, mu = 2 * m * x * shapes, m * p_a
            down = stats.poisson_quadratic_k3(-u, mu - u)
            assert (down <= stats.poisson_quadratic_k3(u, mu + u)).all()
            expected = (p_a ** -2.0 * down).sum(1)
            got = sum(c * x ** j for j, c in enumerate(coefficients))
            np.testing.assert_allclose(got, expected, rtol=1e-9)

    def test_an_empty_tail_or_coarse_floor_gives_its_delta_to_the_kept_set(self, real_law):
        """Floor 0: no tail, its 0.05δ to the kept set; the coarse floor ½/m = 1.25e-5 holds fewer cells, so it
        keeps its 0.05δ (16:1 between its kept set and tail). Floor 1e-4, above the coarse floor: a tail, no
        coarse route (it would keep the same cells), its 0.05δ to the kept set."""
        m = 40_000
        full = stats.BoundPlan(real_law, m, floor=0.0)
        cut = stats.BoundPlan(real_law, m, floor=1e-4)
        assert not full.tail.any() and cut.tail.any() and (real_law < 0.5 / m).any()
        coarse = {"coarse_kept": 0.0005 * 16 / 17, "coarse_tail": 0.0005 / 17}
        assert full.shares == pytest.approx({"kept": 0.0085, "tail": 0.0, "plugin": 0.001} | coarse)
        assert cut.shares == pytest.approx({"kept": 0.0085, "tail": 0.0005, "plugin": 0.001,
                                            "coarse_kept": 0.0, "coarse_tail": 0.0})
        assert [f.floor for f in full.holder_floors] == [0.0, 0.5 / m] and len(cut.holder_floors) == 1
        assert sum(full.shares.values()) == pytest.approx(0.01) == sum(cut.shares.values())

    def test_floor_candidates_keep_at_most_the_cell_cap(self):
        p = zipf(70_000)
        plan = stats.BoundPlan(p, 10_000)
        assert p.size > stats.bounds.MAX_KEPT_CELLS  # floor 0 would keep every cell: not a candidate
        assert plan.chosen_floor > 0 and 0 < plan.kept.sum() <= stats.bounds.MAX_KEPT_CELLS

    def test_skew_lift_raises_the_quantiles_by_at_most_its_cap(self, real_law):
        """With the skew lift every threshold is higher (W is right-skewed: its lower quantile sits above the
        normal one), by at most (z² − 1) SKEW_CAP / 6 standard deviations, and the bound at W = 0 is smaller."""
        m, delta = 40_000, 0.0085
        p_a = real_law[real_law >= 1 / m]
        lifted, normal = (stats.KeptSetTest.build(p_a, m, delta, skew=s) for s in (True, False))
        z = sps.norm.isf(delta)
        gap = lifted.thresholds - normal.thresholds
        S = float((p_a ** (2 / 3)).sum())
        sd_max = np.sqrt(2 * S + 64 * m * lifted.xs ** 2 / p_a.min() ** (1 / 3) + 1e3) / m  # generous
        assert (gap >= -1e-15).all() and (gap <= (z ** 2 - 1) * stats.SKEW_CAP / 6 * sd_max).all()
        assert gap.max() > 0
        assert lifted.upper(0.0) < normal.upper(0.0)

    def test_skew_lifted_threshold_stays_below_ws_lower_quantile(self, real_law):
        """The lifted threshold at the Hölder-equality alternative's x is below W's simulated lower δ-quantile
        there (the test keeps its level), and the normal threshold is further below (the lift is real)."""
        m, delta, rng = 40_000, 0.0085, np.random.default_rng(23)
        plan = stats.BoundPlan(real_law, m)
        kept = plan.kept
        x = plan.expected_upper()
        q = coverage.holder(real_law, x, plan.chosen_floor, rng)
        x_kept = 0.5 * np.abs(q - real_law)[kept].sum()
        w = stats.holder_statistics(rng.multinomial(m, q, size=20_000)[:, kept], real_law[kept], m)
        quantile = np.quantile(w, delta)
        lifted, normal = (stats.KeptSetTest.build(real_law[kept], m, delta, skew=s) for s in (True, False))
        t_lifted, t_normal = (np.interp(x_kept, t.xs, t.thresholds) for t in (lifted, normal))
        assert t_normal < t_lifted < quantile, (t_normal, t_lifted, quantile)

    def test_a_low_w_never_certifies_more_than_w_zero(self, real_law):
        """Counts at exactly m·p make W negative (below its H0 mean); the kept-set bound is then the one at W = 0,
        never the empty confidence set's 0."""
        m = 40_000
        plan = stats.BoundPlan(real_law, m, floor=0.0)
        counts = np.round(m * real_law).astype(np.int64)
        counts[np.argmax(counts)] += m - counts.sum()
        bound = plan.bound(counts)
        assert bound.d_estimate < 0
        assert bound.kept_upper == plan.test.upper(0.0) > 0.002

    def test_batched_bounds_equal_one_at_a_time(self, real_law):
        rng = np.random.default_rng(22)
        for route in stats.TV_ROUTES:
            plan = stats.BoundPlan(real_law, 30_000, route=route)
            q = coverage.cauchy_schwarz(real_law, 0.01, plan.chosen_floor, rng)
            counts = rng.multinomial(30_000, q, size=50)
            assert plan.uppers(counts) == pytest.approx([plan.bound(c).upper for c in counts], abs=0)
            w = stats.holder_statistics(counts[:, plan.kept], real_law[plan.kept], 30_000)
            assert w == pytest.approx([stats.holder_statistic(c[plan.kept], real_law[plan.kept], 30_000)
                                       for c in counts])

    def test_sharp_on_the_joint_two_token_law(self, pair, prompt):
        """The joint law of two tokens (262,144 cells, ‖p_A‖_(2/3) ≈ 30 against √|A| ≈ 50-60) is where the
        Hölder weights pay off: at m = 150,000 a correct sampler's bound has median ≈ 0.018 (the χ²
        route with Cauchy–Schwarz weights, estimated variance and δ split four ways gave 0.030)."""
        from specdec_lab.laws import two_token_law
        joint = two_token_law(pair, prompt, SamplingConfig()).joint
        m, rng = 150_000, np.random.default_rng(15)
        plan = stats.BoundPlan(joint, m)
        bounds = [plan.bound(rng.multinomial(m, joint)) for _ in range(20)]
        assert np.median([b.upper for b in bounds]) < 0.021
        assert all(b.binding == "holder" for b in bounds)

    def test_coarse_floor_rescues_mass_moved_onto_cells_far_below_one_count(self, pair, prompt):
        """On the joint law at m = 100,000 the chosen floor is 0.01/m: its kept set holds thousands of cells of
        expected count 0.01–0.04. TV 0.02 moved onto them: the chosen floor's Hölder bound is ≈ 0.08 and the
        plug-in's ≈ 0.067 (its bias on 262,144 cells); the coarse floor's tail reads the mass through its count."""
        from specdec_lab.laws import two_token_law
        joint = two_token_law(pair, prompt, SamplingConfig()).joint
        m, rng = 100_000, np.random.default_rng(16)
        plan = stats.BoundPlan(joint, m)
        assert plan.chosen_floor < 0.5 / m == plan.holder_floors[1].floor
        q = coverage.near_floor(joint, 0.02, plan.chosen_floor, rng)
        bounds = [plan.bound(rng.multinomial(m, q)) for _ in range(10)]
        assert all(b.binding == "holder-coarse" and coverage.tv(q, joint) <= b.upper for b in bounds)
        assert np.median([b.upper for b in bounds]) < 0.85 * np.median(
            [min(b.holder_route, b.plugin_route) for b in bounds])

    def test_plugin_route_rescues_a_deviation_on_a_rare_token(self, real_law):
        """TV 0.01 moved onto one rare token: Hölder (a large D for a small TV) is loose, the plug-in route is not."""
        rng = np.random.default_rng(11)
        q = coverage.rare_spike(real_law, 0.01, 1e-6, rng)
        bound = stats.tv_upper_bound(rng.multinomial(20_000, q), real_law)
        assert bound.holder_route > 0.04 and bound.plugin_route < 0.04
        assert bound.binding == "plugin" and coverage.tv(q, real_law) <= bound.upper == bound.plugin_route

    def test_combined_spends_delta_as_documented(self, real_law):
        """combined = min(Hölder at the chosen floor (0.8δ kept set, 0.05δ tail), Hölder at the coarse floor
        (0.05δ), the plug-in route at 0.1δ)."""
        rng = np.random.default_rng(12)
        m = 20_000
        for alternative in ("null", "holder", "rare_spike"):
            q = coverage.ALTERNATIVES[alternative](real_law, 0.01, 1 / m, rng)
            counts = rng.multinomial(m, q)
            combined = stats.tv_upper_bound(counts, real_law)
            plugin = stats.tv_plugin(counts, real_law) + stats.plugin_margin(m, 0.001)
            assert combined.plugin_route == pytest.approx(plugin)
            assert combined.upper == pytest.approx(min(combined.holder_route, combined.coarse_route,
                                                       combined.plugin_route))
            coarse = stats.tv_upper_bound(counts, real_law, route="holder", floor=combined.coarse_floor)
            assert coarse.holder_route < combined.coarse_route  # alone, the coarse floor has the whole δ
            alone = stats.tv_upper_bound(counts, real_law, route="holder", floor=combined.floor)
            assert alone.holder_route <= combined.holder_route + 1e-12  # alone it has the whole δ
            assert combined.holder_route == pytest.approx(
                combined.kept_upper + 0.5 * (combined.tail_mass_p + combined.tail_mass_q_upper))

    def test_expected_bound_matches_simulation_under_h0(self, real_law):
        rng = np.random.default_rng(13)
        m = 20_000
        expected = stats.expected_tv_bound(real_law, m)
        plan = stats.BoundPlan(real_law, m)
        sims = [plan.bound(rng.multinomial(m, real_law)) for _ in range(200)]
        plug = np.mean([stats.tv_plugin(rng.multinomial(m, real_law), real_law) for _ in range(200)])
        assert stats.expected_tv_plugin(real_law, m) == pytest.approx(plug, rel=0.03)
        assert np.median([b.upper for b in sims]) == pytest.approx(expected["combined"], rel=0.1)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="route must be one of"):
            stats.tv_upper_bound([5, 5], [0.5, 0.5], route="hoeffding")
        with pytest.raises(ValueError, match="confidence"):
            stats.tv_upper_bound([5, 5], [0.5, 0.5], confidence=1.0)

    def test_bound_shrinks_like_one_over_root_m_and_passes_correct_samples(self, real_law):
        expected = [stats.expected_tv_bound(real_law, m, routes=("combined",))["combined"] for m in (10_000, 160_000)]
        assert expected[1] == pytest.approx(expected[0] / 4, rel=0.25)  # 16x the samples: a quarter of the bound
        large = stats.tv_upper_bound(np.random.default_rng(9).multinomial(200_000, real_law), real_law).upper
        assert large < 0.02

    def test_far_alternative_has_large_bound(self, real_law):
        q = 0.5 * real_law + 0.5 / len(real_law)
        bound = stats.tv_upper_bound(np.random.default_rng(0).multinomial(50_000, q), real_law)
        assert bound.upper >= coverage.tv(q, real_law)


class TestPlanBySimulation:
    """The planner's m makes a correct sampler's bound land below ε as often as it promises, and is
    not padded: at a third of that m the bound usually misses ε."""

    @pytest.mark.parametrize("law", ["real", "zipf", "sparse tail"])
    def test_planned_m_reaches_eps_with_its_assurance(self, real_law, law):
        """'sparse tail' (40,512 cells, more than SMALL_LAW_CELLS) is planned from lumped draws; checked here on
        full ones, with the plug-in route."""
        p = {"real": real_law, "zipf": zipf(512), "sparse tail": sparse_tail_law()}[law]
        eps, assurance, reps = 0.04, 0.99, 400
        m = stats.plan_bound_by_simulation(p, eps, assurance=assurance, rng=np.random.default_rng(0))
        rng = np.random.default_rng(1)  # batched: BoundPlan.uppers is tv_upper_bound (test_batched_bounds_equal_one_at_a_time)
        misses = np.mean(stats.BoundPlan(p, m).uppers(rng.multinomial(m, p, size=reps)) > eps)
        assert misses <= binomial_slack(1 - assurance, reps)
        third = np.mean(stats.BoundPlan(p, m // 3).uppers(rng.multinomial(m // 3, p, size=100)) > eps)
        assert third > 0.5, (m, third)

    def test_lumped_counts_give_the_hoelder_bound_of_the_full_counts(self):
        """What the planner draws on a large law: the kept set's counts and one cell for the rest give exactly the
        Hölder route's bound of the full counts (both floors), which is at least the combined bound."""
        p, m = sparse_tail_law(), 30_000
        plan = stats.BoundPlan(p, m)
        assert len(plan.holder_floors) == 2 and plan.tail.any()
        counts = np.random.default_rng(4).multinomial(m, p, size=30)
        law, _ = plan.lumped
        lumped = np.concatenate([counts[:, plan.kept], counts[:, plan.tail].sum(1, keepdims=True)], axis=1)
        assert law.size == plan.kept.sum() + 1 and law.sum() == pytest.approx(1.0)
        np.testing.assert_array_equal(plan.holder_uppers(lumped, lumped=True), plan.holder_uppers(counts))
        assert (plan.uppers(counts) <= plan.holder_uppers(counts)).all()

    def test_at_least_is_kept_when_it_serves_and_searched_from_when_not(self, real_law):
        """How verify asks for a joint plan beside a first-token one: an m that already passes comes back as it is
        (no search below it); one that does not is the start of the search, which ends at the plan's own m."""
        eps, assurance = 0.04, 0.99
        m = stats.plan_bound_by_simulation(real_law, eps, assurance=assurance, rng=np.random.default_rng(0))
        assert stats.plan_bound_by_simulation(real_law, eps, assurance=assurance, at_least=3 * m,
                                              rng=np.random.default_rng(2)) == 3 * m
        from_below = stats.plan_bound_by_simulation(real_law, eps, assurance=assurance, at_least=m // 3,
                                                    rng=np.random.default_rng(3))
        assert 0.9 * m <= from_below <= 1.1 * m, (m, from_below)

    def test_bad_arguments(self, real_law):
        with pytest.raises(ValueError, match="at_least"):
            stats.plan_bound_by_simulation(real_law, 0.02, at_least=0)
        with pytest.raises(ValueError, match="assurance"):
            stats.plan_bound_by_simulation(real_law, 0.02, assurance=1.0)
        with pytest.raises(ValueError, match="eps"):
            stats.plan_bound_by_simulation(real_law, 0.0)
