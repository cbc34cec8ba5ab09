"""Latency statistics on samples whose figures are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeopt.device.stats import latency_stats


def test_one_to_hundred():
    stats = latency_stats(np.arange(1, 101, dtype=float))
    # numpy's linear interpolation: rank (n - 1) * q between sorted samples
    assert stats.runs == 100
    assert stats.p50_ms == pytest.approx(50.5)
    assert stats.p95_ms == pytest.approx(95.05)
    assert stats.p99_ms == pytest.approx(99.01)
    assert (stats.min_ms, stats.max_ms) == (1.0, 100.0)
    assert stats.mean_ms == pytest.approx(50.5)
    assert stats.stddev_ms == pytest.approx(math.sqrt(100 * 101 / 12))  # sample stddev of 1..n: sqrt(n(n+1)/12)
    assert stats.cv == pytest.approx(math.sqrt(100 * 101 / 12) / 50.5)
    assert stats.p99_over_p50 == pytest.approx(99.01 / 50.5)
    assert stats.jitter_ms == pytest.approx(1.0)
    assert stats.throughput_fps == pytest.approx(1000 / 50.5)


def test_four_samples_interpolate_between_neighbours():
    stats = latency_stats([4.0, 1.0, 3.0, 2.0])
    assert stats.p50_ms == pytest.approx(2.5)
    assert stats.p95_ms == pytest.approx(3.85)  # rank 2.85: 3 + 0.85 * (4 - 3)
    assert stats.p99_ms == pytest.approx(3.97)
    assert stats.stddev_ms == pytest.approx(math.sqrt(5 / 3))  # squares of deviations 2.25+0.25+0.25+2.25 over 3
    assert stats.jitter_ms == pytest.approx((3 + 2 + 1) / 3)  # |1-4|, |3-1|, |2-3| in arrival order


def test_constant_samples_have_no_spread():
    stats = latency_stats([2.0] * 10)
    assert (stats.p50_ms, stats.p99_ms, stats.stddev_ms, stats.cv, stats.jitter_ms) == (2.0, 2.0, 0.0, 0.0, 0.0)
    assert stats.p99_over_p50 == 1.0
    assert stats.throughput_fps == pytest.approx(500.0)


def test_one_outlier_moves_the_tail_not_the_median():
    samples = [1.0] * 99 + [101.0]
    stats = latency_stats(samples)
    assert stats.p50_ms == 1.0
    assert stats.p99_ms == pytest.approx(2.0)  # rank 98.01: 1 + 0.01 * 100
    assert stats.mean_ms == pytest.approx(2.0)
    assert stats.stddev_ms == pytest.approx(10.0)  # sum of squares 99 * 1 + 99^2 = 9900, over 99
    assert stats.cv == pytest.approx(5.0)


def test_single_sample_and_empty():
    stats = latency_stats([3.0])
    assert (stats.p50_ms, stats.stddev_ms, stats.cv, stats.jitter_ms) == (3.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        latency_stats([])
