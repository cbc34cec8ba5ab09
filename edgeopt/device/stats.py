"""Latency statistics from raw per-inference timings (milliseconds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    runs: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    stddev_ms: float
    cv: float  # coefficient of variation: stddev / mean
    p99_over_p50: float
    jitter_ms: float  # mean absolute difference between consecutive runs
    throughput_fps: float  # 1000 / mean latency at batch 1, one request at a time

    def describe(self) -> dict:
        return asdict(self)


def latency_stats(samples_ms) -> LatencyStats:
    """Percentiles use linear interpolation (numpy's default); stddev is the sample stddev (ddof=1)."""
    values = np.asarray(samples_ms, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no latency samples")
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    mean = float(values.mean())
    stddev = float(values.std(ddof=1)) if values.size > 1 else 0.0
    jitter = float(np.mean(np.abs(np.diff(values)))) if values.size > 1 else 0.0
    return LatencyStats(
        runs=int(values.size), p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99),
        min_ms=float(values.min()), max_ms=float(values.max()), mean_ms=mean, stddev_ms=stddev,
        cv=stddev / mean if mean > 0 else 0.0, p99_over_p50=float(p99 / p50) if p50 > 0 else 0.0,
        jitter_ms=jitter, throughput_fps=1000.0 / mean if mean > 0 else 0.0,
    )
