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
        other = {"peaked": np.eye(len(p))[np.argsort(p)[len(p) // 2]], "flat": np.full(len(p), 1 / len(p)),
                 "shifted": np.roll(p, 3)}[kind]
        q = (1 - strength) * p + strength * other
        return q, 0.5 * np.abs(q - p).sum()

    @pytest.mark.parametrize("law", ["real", "zipf"])
    @pytest.mark.parametrize("kind,strength", [("null", 0.0), ("peaked", 0.02), ("flat", 0.05), ("shifted", 0.03)])
    @pytest.mark.parametrize("m", [2_000, 50_000])
    def test_coverage(self, real_law, law, kind, strength, m):
        p = real_law if law == "real" else zipf(512)
        q, true_tv = (p, 0.0) if kind == "null" else self.planted(p, kind, strength)
        rng = np.random.default_rng(hash((law, kind, m)) % 2**32)
        reps = 400
        misses = sum(stats.tv_upper_bound(rng.multinomial(m, q), p, confidence=0.95).upper < true_tv
                     for _ in range(reps))
        assert misses / reps <= binomial_slack(0.05, reps)

    def test_bound_shrinks_with_m_and_passes_correct_samples(self, real_law):
        rng = np.random.default_rng(9)
        small = stats.tv_upper_bound(rng.multinomial(5_000, real_law), real_law).upper
        large = stats.tv_upper_bound(rng.multinomial(200_000, real_law), real_law).upper
        assert large < small and large < 0.02

    def test_far_alternative_has_large_bound(self, real_law):
        q, tv = self.planted(real_law, "flat", 0.5)
        bound = stats.tv_upper_bound(np.random.default_rng(0).multinomial(50_000, q), real_law)
        assert bound.upper >= tv


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
