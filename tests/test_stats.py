"""Statistics against scipy/statsmodels and Monte Carlo references; coverage and calibration."""

import numpy as np
import pytest
import torch
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from specdec_lab import stats
from specdec_lab.sampling import SamplingConfig, to_probs


def zipf(n, s=1.1):
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


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


class TestTVUpperBound:
    """Coverage of the bound on planted alternatives with known TV (what its docstring promises)."""

    @staticmethod
    def planted(p, kind, strength):
        if kind == "rare":  # mass `strength` moved from the whole law onto one token of p ≈ 1e-4
            q = (1 - strength) * p
            q[np.argmin(np.abs(np.log(p + 1e-300) - np.log(1e-4)))] += strength
            return q, 0.5 * np.abs(q - p).sum()
        other = {"peaked": np.eye(len(p))[np.argsort(p)[len(p) // 2]], "flat": np.full(len(p), 1 / len(p)),
                 "shifted": np.roll(p, 3)}[kind]
        q = (1 - strength) * p + strength * other
        return q, 0.5 * np.abs(q - p).sum()

    @pytest.mark.parametrize("law", ["real", "zipf"])
    @pytest.mark.parametrize("kind,strength", [("null", 0.0), ("peaked", 0.02), ("flat", 0.05), ("shifted", 0.03),
                                               ("rare", 0.01)])
    @pytest.mark.parametrize("m", [2_000, 50_000])
    def test_coverage(self, real_law, law, kind, strength, m):
        p = real_law if law == "real" else zipf(512)
        q, true_tv = (p, 0.0) if kind == "null" else self.planted(p, kind, strength)
        rng = np.random.default_rng(hash((law, kind, m)) % 2**32)
        reps = 400
        misses = sum(stats.tv_upper_bound(rng.multinomial(m, q), p, confidence=0.95).upper < true_tv
                     for _ in range(reps))
        assert misses / reps <= binomial_slack(0.05, reps)

    @pytest.mark.parametrize("route", ["chi2", "mcdiarmid"])
    @pytest.mark.parametrize("kind,strength", [("peaked", 0.02), ("rare", 0.01), ("shifted", 0.03)])
    def test_each_route_covers_at_its_own_level(self, real_law, route, kind, strength):
        q, true_tv = self.planted(real_law, kind, strength)
        rng = np.random.default_rng(hash((route, kind)) % 2**32)
        reps = 400
        misses = sum(stats.tv_upper_bound(rng.multinomial(20_000, q), real_law, confidence=0.95,
                                          route=route).upper < true_tv for _ in range(reps))
        assert misses / reps <= binomial_slack(0.05, reps)

    def test_mcdiarmid_rescues_a_deviation_on_a_rare_token(self, real_law):
        """TV 0.01 moved onto one rare token: χ² → TV (Cauchy–Schwarz) is very loose, McDiarmid is not."""
        q, tv = self.planted(real_law, "rare", 0.01)
        bound = stats.tv_upper_bound(np.random.default_rng(11).multinomial(20_000, q), real_law)
        assert bound.chi2_route > 0.3 and bound.mcdiarmid_route < 0.05
        assert bound.binding == "mcdiarmid" and tv <= bound.upper == bound.mcdiarmid_route

    def test_combined_costs_at_most_the_bonferroni_split(self, real_law):
        """combined(δ) <= the better route at its own δ + that route's cost of running at δ/2."""
        rng = np.random.default_rng(12)
        for kind, strength, m in [("null", 0, 5_000), ("null", 0, 80_000), ("rare", 0.01, 20_000),
                                  ("peaked", 0.02, 20_000), ("flat", 0.05, 2_000)]:
            q = real_law if kind == "null" else self.planted(real_law, kind, strength)[0]
            for _ in range(20):
                counts = rng.multinomial(m, q)
                full = {r: stats.tv_upper_bound(counts, real_law, route=r).upper for r in ("chi2", "mcdiarmid")}
                half = {r: stats.tv_upper_bound(counts, real_law, confidence=0.995, route=r).upper
                        for r in ("chi2", "mcdiarmid")}
                combined = stats.tv_upper_bound(counts, real_law)
                assert combined.upper == pytest.approx(min(half.values()))
                best = min(full, key=full.get)
                assert combined.upper <= full[best] + (half[best] - full[best]) + 1e-12
                # McDiarmid's cost is explicit: sqrt(ln(2/δ)/2m) − sqrt(ln(1/δ)/2m)
                cost = stats.mcdiarmid_margin(m, 0.005) - stats.mcdiarmid_margin(m, 0.01)
                assert half["mcdiarmid"] - full["mcdiarmid"] == pytest.approx(cost)

    def test_expected_bound_matches_simulation_under_h0(self, real_law):
        rng = np.random.default_rng(13)
        m = 20_000
        expected = stats.expected_tv_bound(real_law, m)
        sims = [stats.tv_upper_bound(rng.multinomial(m, real_law), real_law) for _ in range(100)]
        plug = np.mean([stats.tv_plugin(rng.multinomial(m, real_law), real_law) for _ in range(200)])
        assert stats.expected_tv_plugin(real_law, m) == pytest.approx(plug, rel=0.03)
        assert np.mean([b.mcdiarmid_route for b in sims]) == pytest.approx(expected["mcdiarmid (δ/2)"], rel=0.05)
        assert np.mean([b.upper for b in sims]) == pytest.approx(expected["combined"], rel=0.25)

    def test_bad_route(self):
        with pytest.raises(ValueError, match="route must be one of"):
            stats.tv_upper_bound([5, 5], [0.5, 0.5], route="hoeffding")

    def test_bound_shrinks_with_m_and_passes_correct_samples(self, real_law):
        rng = np.random.default_rng(9)
        small = stats.tv_upper_bound(rng.multinomial(5_000, real_law), real_law).upper
        large = stats.tv_upper_bound(rng.multinomial(200_000, real_law), real_law).upper
        assert large < small and large < 0.02

    def test_far_alternative_has_large_bound(self, real_law):
        q, tv = self.planted(real_law, "flat", 0.5)
        bound = stats.tv_upper_bound(np.random.default_rng(0).multinomial(50_000, q), real_law)
        assert bound.upper >= tv


class TestCollision:
    """The collision test's null moments, calibration, and power against replayed random streams."""

    def test_null_moments_match_the_formulas(self, real_law):
        m = 3_000
        rng = np.random.default_rng(20)
        C, S = stats._collision_null(real_law, m, 20_000, rng)
        s2, s3, pairs = (real_law ** 2).sum(), (real_law ** 3).sum(), m * (m - 1) / 2
        var_c = pairs * (s2 - s2 ** 2) + 6 * (m * (m - 1) * (m - 2) / 6) * (s3 - s2 ** 2)
        assert C.mean() == pytest.approx(pairs * s2, abs=4 * np.sqrt(var_c / len(C)))
        assert C.var() == pytest.approx(var_c, rel=0.05)
        T = C - (m - 1) * S + pairs * s2
        res = stats.collision_test(rng.multinomial(m, real_law), real_law, n_resamples=99, rng=rng)
        assert T.mean() == pytest.approx(0, abs=4 * res.sd / np.sqrt(len(T)))
        assert T.std() == pytest.approx(res.sd, rel=0.05)
        assert res.expected == pytest.approx(pairs * s2)

    def test_null_sampler_is_exact_for_a_sparse_law(self):
        """The pooled-cell shortcut draws the same law as a plain multinomial."""
        p = zipf(5_000, 1.3)
        m, rng = 400, np.random.default_rng(21)
        ours = stats._collision_null(p, m, 4_000, rng)[0]
        plain = stats._collision_parts(rng.multinomial(m, p, size=4_000), p)[0]
        assert sps.ks_2samp(ours, plain).pvalue > 1e-3

    def test_type_one_error_and_uniform_pvalues(self, real_law):
        rng = np.random.default_rng(22)
        pv = np.array([stats.collision_test(rng.multinomial(2_000, real_law), real_law, n_resamples=499,
                                            rng=rng).pvalue for _ in range(200)])
        assert np.mean(pv < 0.05) <= binomial_slack(0.05, 200)
        assert stats.uniformity_test(pv).pvalue > 1e-3

    def test_replayed_streams_rejected_and_the_excess_sees_more_than_the_raw_count(self, real_law):
        """Every draw twice, on a two-token law: the excess T stands many times further outside its
        null spread than the raw count C does (C's spread is mostly the draws' own probabilities
        wandering, which T removes). T's shift is about m/2 against a null sd of about m √(Σ P² / 2): what it sees depends
        on how spread the law is (1 / √(2 Σ P²) sd for full duplication), not on m."""
        joint = np.outer(real_law, real_law).ravel()
        rng = np.random.default_rng(23)
        half = rng.choice(len(joint), size=2_500, p=joint)
        counts = np.bincount(np.concatenate([half, half]), minlength=len(joint))
        res = stats.collision_test(counts, joint, rng=rng)
        m, s2, s3 = 5_000, (joint ** 2).sum(), (joint ** 3).sum()
        sd_c = np.sqrt(m * (m - 1) / 2 * (s2 - s2 ** 2) + m * (m - 1) * (m - 2) * (s3 - s2 ** 2))
        assert res.statistic / res.sd > 2 * (res.collisions - res.expected) / sd_c
        assert res.pvalue < 1e-3 and res.statistic > 5 * res.sd

    def test_antithetic_streams_rejected_two_sided(self):
        p = np.full(50, 0.02)
        counts = np.full(50, 40)  # m = 2000 spread perfectly evenly: far too few collisions
        rng = np.random.default_rng(24)
        assert stats.collision_test(counts, p, rng=rng).pvalue < 1e-3
        assert stats.collision_test(counts, p, alternative="greater", rng=rng).pvalue > 0.5

    def test_bad_alternative(self):
        with pytest.raises(ValueError, match="alternative must be one of"):
            stats.collision_test([3, 3], [0.5, 0.5], alternative="less")


class TestPlanner:
    def test_stats_md_numbers(self):
        assert stats.plan_sample_size(0.01, 256, 0.01, 0.9) == pytest.approx(232_000, rel=0.01)
        assert stats.plan_sample_size(0.01, 50_000, 0.01, 0.9) == pytest.approx(2_900_000, rel=0.01)

    def test_planned_power_is_achieved_by_simulation(self):
        # worst case: |q - p| proportional to p, where the noncentrality is exactly m (2 eps)^2
        n, eps = 20, 0.05
        p = np.full(n, 1 / n)
        q = p * (1 + 2 * eps * np.r_[np.ones(n // 2), -np.ones(n // 2)])
        m = stats.plan_sample_size(eps, n, alpha=0.01, power=0.9)
        rng = np.random.default_rng(0)
        rejected = np.mean([stats.chisquare_identity(rng.multinomial(m, q), p).pvalue < 0.01 for _ in range(400)])
        assert abs(rejected - 0.9) < 0.06


class TestEProcess:
    def test_anytime_type_one_error(self):
        rng = np.random.default_rng(0)
        crossings = [stats.dirichlet_eprocess(rng.integers(0, 8, 3000), np.full(8, 1 / 8), alpha=0.05).rejected_at
                     for _ in range(300)]
        assert np.mean([c is not None for c in crossings]) <= 0.05 + 0.02

    def test_stops_early_under_alternative(self):
        rng = np.random.default_rng(1)
        q = np.r_[np.full(4, 0.15), np.full(4, 0.1)]
        res = stats.dirichlet_eprocess(rng.choice(8, 20_000, p=q), np.full(8, 1 / 8), alpha=0.01)
        assert res.rejected_at is not None and res.rejected_at < 20_000 and res.pvalue < 0.01


def test_uniformity_meta_test_flags_miscalibration():
    rng = np.random.default_rng(0)
    assert stats.uniformity_test(rng.random(300)).pvalue > 1e-3
    assert stats.uniformity_test(rng.random(300) ** 2).pvalue < 1e-3


class TestPlanBySimulation:
    """The planner's m makes a correct sampler's bound land below ε as often as it promises, and is
    not padded: at a third of that m the bound usually misses ε."""

    @pytest.mark.parametrize("law", ["real", "zipf"])
    def test_planned_m_reaches_eps_with_its_assurance(self, real_law, law):
        p = real_law if law == "real" else zipf(512)
        eps, assurance, reps = 0.04, 0.99, 400
        m = stats.plan_bound_by_simulation(p, eps, assurance=assurance, rng=np.random.default_rng(0))
        rng = np.random.default_rng(1)
        misses = np.mean([stats.tv_upper_bound(rng.multinomial(m, p), p).upper > eps for _ in range(reps)])
        assert misses <= binomial_slack(1 - assurance, reps)
        third = np.mean([stats.tv_upper_bound(rng.multinomial(m // 3, p), p).upper > eps for _ in range(100)])
        assert third > 0.5, (m, third)

    def test_bad_arguments(self, real_law):
        with pytest.raises(ValueError, match="assurance"):
            stats.plan_bound_by_simulation(real_law, 0.02, assurance=1.0)
        with pytest.raises(ValueError, match="eps"):
            stats.plan_bound_by_simulation(real_law, 0.0)
