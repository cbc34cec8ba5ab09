"""Measure a compiled model's latency: warm-up, then timed synchronous batch-1 inferences."""

from __future__ import annotations

import time

import numpy as np

from edgeopt.device.runtime import Session
from edgeopt.device.stats import LatencyStats, latency_stats


def time_inferences(session: Session, feeds: dict[str, np.ndarray], runs: int, warmup: int,
                    min_seconds: float = 0.0) -> tuple[float, list[float]]:
    """Return (first-inference ms, timed inference ms list); runs at least ``runs`` and ``min_seconds``."""
    start = time.perf_counter()
    session.infer(feeds)
    first_ms = (time.perf_counter() - start) * 1000
    for _ in range(max(warmup - 1, 0)):
        session.infer(feeds)
    timings: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(timings) < runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        session.infer(feeds)
        timings.append((time.perf_counter() - start) * 1000)
    return first_ms, timings


def measure_latency(session: Session, feeds: dict[str, np.ndarray], runs: int = 300, warmup: int = 20,
                    min_seconds: float = 0.0) -> LatencyStats:
    _, timings = time_inferences(session, feeds, runs, warmup, min_seconds)
    return latency_stats(timings)
