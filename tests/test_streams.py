"""The overlapping-streams negative control: every batch alone is the correct sampler, the whole
is not independent, and the suite's collision test rejects it."""

import numpy as np
import pytest
import torch

from specdec_lab.sampling import SamplingConfig, make_generator
from specdec_lab.samplers.faulty import OverlappingStreams
from specdec_lab.samplers.naive import NaiveConfig
from specdec_lab.samplers.speculative import SpeculativeConfig
from specdec_lab.suite import SuiteSettings, run_suite, score


def test_request_seeds_overlap_across_batches_only():
    streams = OverlappingStreams(NaiveConfig(), requests_per_batch=2, request_size=4)
    seeds = [s for s, _ in streams.request_seeds(100, 4 * 8)]
    assert seeds == [100, 101, 101, 102, 102, 103, 103, 104]
    for j in range(4):  # batch j: requests 2j, 2j+1 — distinct seeds within the batch
        assert len(set(seeds[2 * j: 2 * j + 2])) == 2


def test_each_batch_alone_is_the_correct_sampler_token_for_token(pair, prompt):
    base = SpeculativeConfig(k=4)
    streams = OverlappingStreams(base, requests_per_batch=2, request_size=4)
    tokens = streams.draw(pair, prompt, 16, 6, make_generator(7)).tokens  # 2 batches of 2 requests
    for k, (seed, size) in enumerate(streams.request_seeds(7, 16)):
        alone = base.draw(pair, prompt, size, 6, make_generator(seed)).tokens
        assert torch.equal(tokens[4 * k: 4 * k + 4], alone)
    assert torch.equal(tokens[4:8], tokens[8:12])  # request 1 of batch 0 replayed as request 0 of batch 1


def test_bad_settings():
    with pytest.raises(ValueError, match="requests_per_batch >= 2"):
        OverlappingStreams(NaiveConfig(), requests_per_batch=1)


def test_suite_rejects_overlapping_streams_by_collisions(pair, prompt):
    """2,048 naive two-token samples with the control's default layout (3 of every 8 requests are
    replays): rejected, and the collision test is among the tests that reject (its shift, about
    3/8 m pairs against a null sd of m √(Σ P² / 2), does not depend on m)."""
    streams = OverlappingStreams(NaiveConfig())
    tokens = streams.draw(pair, prompt, 2048, 2, make_generator(3)).tokens.numpy()
    settings = SuiteSettings(alpha=0.05, n_resamples=999, min_prefix_count=100)
    result = run_suite("streams", tokens, score(pair, prompt, tokens, SamplingConfig(), settings.min_prefix_count),
                       settings, np.random.default_rng(0))
    assert result.verdict == "rejected"
    assert "collisions (first two tokens)" in result.rejected_by, result.verdict_text
    assert result.tests["collisions (first two tokens)"].statistic > 4 * result.tests["collisions (first two tokens)"].sd
