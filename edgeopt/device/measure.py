"""Measure a compiled model's latency: warm-up, then timed synchronous batch-1 inferences."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgeopt.device.runtime import Session
from edgeopt.device.stats import LatencyStats, latency_stats


@dataclass(frozen=True)
class Timings:
    """Raw timings of one measurement, in milliseconds.

    ``wall_ms`` times each synchronous inference call from Python on inputs bound once (``Session.bind``: no
    per-call input conversion or output copy, as ``benchmark_app`` times); ``runtime_ms`` is the runtime's own
    per-request time (OpenVINO's ``InferRequest.latency``), read outside the timed region, and empty for
    runtimes that do not report one.
    """

    first_ms: float
    wall_ms: list[float]
    runtime_ms: list[float]


def time_inferences(session: Session, feeds: dict[str, np.ndarray], runs: int, warmup: int,
                    min_seconds: float = 0.0) -> Timings:
    """The first (cold) inference, ``warmup - 1`` more, then at least ``runs`` timed ones and ``min_seconds``."""
    run = session.bind(feeds)
    start = time.perf_counter()
    run()
    first_ms = (time.perf_counter() - start) * 1000
    for _ in range(max(warmup - 1, 0)):
        run()
    wall: list[float] = []
    runtime: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(wall) < runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        wall.append((time.perf_counter() - start) * 1000)
        own = session.last_runtime_ms()
        if own is not None:
            runtime.append(own)
    return Timings(first_ms, wall, runtime)


def time_interleaved(sessions: list[Session], feeds: dict[str, np.ndarray], rounds: int, per_round: int,
                     warmup: int) -> list[list[float]]:
    """Wall-clock timings of several models on the same inputs, in rounds that take each model in turn, so that
    load from other processes hits them alike: the way to compare models on a shared host."""
    timings: list[list[float]] = [[] for _ in sessions]
    for round_index in range(rounds):
        for session, times in zip(sessions, timings):
            times += time_inferences(session, feeds, per_round, warmup if round_index == 0 else 2).wall_ms
    return timings


def measure_latency(session: Session, feeds: dict[str, np.ndarray], runs: int = 300, warmup: int = 20,
                    min_seconds: float = 0.0) -> LatencyStats:
    return latency_stats(time_inferences(session, feeds, runs, warmup, min_seconds).wall_ms)
