"""Timing two or more models against each other on a shared host: rounds of a short block of each, back to
back, the order rotating between rounds, so that load from other processes hits every model of a round alike;
each round gives one ratio of block medians, and a distribution-free interval on their median (order
statistics, ``COVERAGE``) says when the comparison is decided. Numpy and the standard library only: every
comparison edgeopt makes (``edgeopt.vs_fp32``, the ONNX backend race, graph rewrites in ``edgeopt.onnx_prep``)
times through here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

SLOWER_TOLERANCE = 0.05  # a p50 more than 5% above the reference's is "slower"
THREADS = 2  # intra-op threads of a comparison, unless a device profile says otherwise
MIN_ROUNDS, MAX_ROUNDS = 6, 24
BLOCK_S = 0.25  # seconds per model and round (0.08 s blocks of a 2-25 ms model swung 0.6x-1.1x where
# the ratio was 1.2-1.5x, measured in a new-user trial under load; 0.3 s blocks read 1.20x twice)
WARMUP_RUNS = 5  # per model, before the first round
COVERAGE = 0.9  # of the interval on the median ratio


def median_interval(values, coverage: float = COVERAGE) -> tuple[float, float]:
    """Distribution-free interval on the median of ``values``: order statistics k and n+1-k, with k the largest
    rank whose binomial coverage is still at least ``coverage`` (the whole range when too few values)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k < n // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n >= coverage:
        k += 1
    return ordered[k - 1], ordered[n - k]


def paired_ratios(reference, candidate, *, threshold: float = 1 + SLOWER_TOLERANCE, min_rounds: int = MIN_ROUNDS,
                  max_rounds: int = MAX_ROUNDS, block_s: float = BLOCK_S,
                  max_s: float | None = None) -> tuple[float, float, list[float]]:
    """Time two bound runs (``() -> None``) in paired rounds until the interval on the median of the per-round
    ratios (candidate over reference) clears ``threshold``, ``max_rounds`` is reached or ``max_s`` seconds have
    passed: (reference p50 ms, candidate p50 ms, ratios)."""

    def decided(ratios: list[list[float]]) -> bool:
        low, high = median_interval(ratios[1])
        return low > threshold or high <= threshold

    timed = interleaved_rounds([reference, candidate], decided, min_rounds=min_rounds, max_rounds=max_rounds,
                               block_s=block_s, max_s=max_s)
    return timed.p50_ms[0], timed.p50_ms[1], timed.ratios(1, 0)


@dataclass(frozen=True)
class Rounds:
    """Interleaved rounds of several runs: every timing (ms) per run, and each round's block median per run."""

    times: tuple[tuple[float, ...], ...]
    medians: tuple[tuple[float, ...], ...]  # [round][run]

    @property
    def p50_ms(self) -> list[float]:
        return [float(np.median(t)) for t in self.times]

    def ratios(self, run: int, reference: int) -> list[float]:
        """Per round, ``run``'s block median over ``reference``'s."""
        return [m[run] / m[reference] for m in self.medians]


def interleaved_rounds(runs, decided, *, min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                       block_s: float = BLOCK_S, max_s: float | None = None) -> Rounds:
    """Time bound runs (``() -> None``) in rounds of a block of each, the order rotating between rounds
    so that load from other processes hits every run alike. After ``min_rounds``, stop as soon as
    ``decided(ratios)`` (``ratios[i]``: run i's per-round ratios over run 0) holds, at ``max_rounds``, or once
    ``max_s`` seconds have passed (checked after each round from ``min_rounds`` on)."""
    started = time.perf_counter()
    for _ in range(WARMUP_RUNS):
        for run in runs:
            run()
    count = max(5, min(300, int(block_s / max(max(_once(run) for run in runs), 1e-6))))
    times: list[list[float]] = [[] for _ in runs]
    medians: list[tuple[float, ...]] = []
    while len(medians) < max_rounds:
        shift = len(medians) % len(runs)
        order = list(range(shift, len(runs))) + list(range(shift))
        block = {index: _block(runs[index], count) for index in order}
        for index in range(len(runs)):
            times[index].extend(block[index])
        medians.append(tuple(float(np.median(block[index])) for index in range(len(runs))))
        if len(medians) >= min_rounds:
            ratios = [[m[index] / m[0] for m in medians] for index in range(len(runs))]
            if decided(ratios) or (max_s is not None and time.perf_counter() - started > max_s):
                break
    return Rounds(tuple(tuple(t) for t in times), tuple(medians))


def _once(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _block(run, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return times
