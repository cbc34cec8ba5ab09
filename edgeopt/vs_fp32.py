"""Is a compressed artifact actually smaller and faster than the FP32 model in the same format and runtime?

INT8 is not free: on small models the quantize/dequantize boundaries can cost more than the arithmetic saves,
and a graph the runtime cannot fuse runs slower than float. After every compress each artifact is timed
against its FP32 counterpart (same format, same runtime, pinned threads and precision, same input) and sized;
a larger or slower one is flagged in the report, the table and the exit summary.

The timing is a sequential test on a shared host: rounds of a short block of each model back to back (the
order alternating between rounds), each round giving one ratio of block medians, so that load from other
processes hits both models of a round alike. After ``MIN_ROUNDS`` the median ratio and its distribution-free
confidence interval (order statistics, ``COVERAGE``) are computed; measuring continues, up to ``MAX_ROUNDS``,
while the interval straddles the threshold. An artifact is "slower" when the whole interval lies above it,
"possibly slower" when the rounds ran out with the median above it, and not flagged otherwise.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeopt.device.runtime import RuntimeSettings

SLOWER_TOLERANCE = 0.05  # a p50 more than 5% above FP32's is "slower"
THREADS = 2
MIN_ROUNDS, MAX_ROUNDS = 6, 24
BLOCK_S = 0.08  # seconds per model and round
COVERAGE = 0.9  # of the interval on the median ratio


def settings_for(runtime: str) -> RuntimeSettings:
    if runtime == "openvino":
        return RuntimeSettings(threads=THREADS, inference_precision="f32")
    return RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None, performance_hint=None)


def median_interval(values, coverage: float = COVERAGE) -> tuple[float, float]:
    """Distribution-free interval on the median of ``values``: order statistics k and n+1-k, with k the largest
    rank whose binomial coverage is still at least ``coverage`` (the whole range when too few values)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k < n // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n >= coverage:
        k += 1
    return ordered[k - 1], ordered[n - k]


@dataclass(frozen=True)
class VsFp32:
    """One artifact against the FP32 model in the same format: sizes, and the p50 ratio from paired rounds."""

    format: str
    bytes: int
    fp32_bytes: int
    p50_ms: float
    fp32_p50_ms: float
    ratios: tuple[float, ...]  # one per round: the artifact's block median over FP32's
    settings: RuntimeSettings

    @property
    def size_ratio(self) -> float:
        return self.bytes / self.fp32_bytes

    @property
    def p50_ratio(self) -> float:
        return float(np.median(self.ratios))

    @property
    def p50_ratio_interval(self) -> tuple[float, float]:
        return median_interval(self.ratios)

    @property
    def larger(self) -> bool:
        return self.bytes > self.fp32_bytes

    @property
    def slower(self) -> bool:
        """Measured slower: the whole interval on the median ratio lies above the threshold."""
        return self.p50_ratio_interval[0] > 1 + SLOWER_TOLERANCE

    @property
    def possibly_slower(self) -> bool:
        """The rounds ran out with the interval straddling the threshold and the median above it."""
        return not self.slower and self.p50_ratio > 1 + SLOWER_TOLERANCE

    @property
    def flags(self) -> list[str]:
        return [flag for flag, on in (("larger than FP32", self.larger), ("slower than FP32", self.slower),
                                      ("possibly slower than FP32", self.possibly_slower)) if on]

    def summary(self) -> str:
        low, high = self.p50_ratio_interval
        return (f"{self.size_ratio:.2f}x size, {self.p50_ratio:.2f}x p50 of FP32 "
                f"({COVERAGE:.0%} interval {low:.2f}-{high:.2f}x, {len(self.ratios)} rounds)")

    def describe(self) -> dict:
        low, high = self.p50_ratio_interval
        return {"bytes": self.bytes, "fp32_bytes": self.fp32_bytes, "size_ratio": round(self.size_ratio, 4),
                "p50_ms": round(self.p50_ms, 4), "fp32_p50_ms": round(self.fp32_p50_ms, 4),
                "p50_ratio": round(self.p50_ratio, 4), "p50_ratio_interval": [round(low, 4), round(high, 4)],
                "rounds": len(self.ratios), "larger": self.larger, "slower": self.slower,
                "possibly_slower": self.possibly_slower, "flags": self.flags,
                "measured_with": {**self.settings.describe(), "method": (
                    f"paired rounds of ~{BLOCK_S}s per model (order alternating, bound inputs, first calibration "
                    f"sample), ratio of block medians per round; {MIN_ROUNDS} rounds, then more (at most "
                    f"{MAX_ROUNDS}) while the {COVERAGE:.0%} interval on the median ratio straddles "
                    f"{1 + SLOWER_TOLERANCE}"),
                    "slower_means": f"the {COVERAGE:.0%} interval on the p50 ratio lies above {1 + SLOWER_TOLERANCE}",
                    "possibly_slower_means": f"the interval straddles {1 + SLOWER_TOLERANCE} after {MAX_ROUNDS} "
                                             "rounds and the median lies above it"}}


def compare(artifacts, fp32_ov_model, fp32_onnx_model, feeds: dict[str, np.ndarray]) -> dict[str, VsFp32]:
    """Each artifact (``export.Artifact``) against FP32 in its format; artifacts saved as FP32 are skipped."""
    from edgeopt.device.runtime import open_session
    from edgeopt.export import write_ir

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for artifact in artifacts:
            if artifact.precision == "fp32":
                continue
            if artifact.format == "openvino" and fp32_ov_model is not None:
                fp32_path = Path(tmp) / "fp32.xml"
                write_ir(fp32_ov_model, fp32_path, compress_to_fp16=False)
                fp32_bytes = fp32_path.stat().st_size + fp32_path.with_suffix(".bin").stat().st_size
            elif artifact.format == "onnx" and fp32_onnx_model is not None:
                import onnx

                fp32_path = Path(tmp) / "fp32.onnx"
                onnx.save(fp32_onnx_model, str(fp32_path))
                fp32_bytes = fp32_path.stat().st_size
            else:
                continue
            settings = settings_for(artifact.runtime)
            runs = [open_session(path, settings).bind(feeds) for path in (fp32_path, artifact.path)]
            fp32_p50, p50, ratios = paired_ratios(*runs)
            results[artifact.format] = VsFp32(artifact.format, artifact.bytes, fp32_bytes, p50, fp32_p50,
                                              tuple(ratios), settings)
    return results


def paired_ratios(reference, candidate, *, threshold: float = 1 + SLOWER_TOLERANCE, min_rounds: int = MIN_ROUNDS,
                  max_rounds: int = MAX_ROUNDS, block_s: float = BLOCK_S) -> tuple[float, float, list[float]]:
    """Time two bound runs (``() -> None``) in paired rounds until the interval on the median of the per-round
    ratios (candidate over reference) clears ``threshold`` or ``max_rounds`` is reached: (reference p50 ms,
    candidate p50 ms, ratios)."""
    for run in (reference, candidate, reference, candidate, reference, candidate):  # warm-up
        run()
    runs = max(3, min(300, int(block_s / max(_once(reference), _once(candidate), 1e-6))))
    times: tuple[list[float], list[float]] = ([], [])
    ratios: list[float] = []
    while len(ratios) < max_rounds:
        order = (0, 1) if len(ratios) % 2 == 0 else (1, 0)
        block: list[list[float]] = [[], []]
        for index in order:
            block[index] = _block((reference, candidate)[index], runs)
        for index in (0, 1):
            times[index].extend(block[index])
        ratios.append(float(np.median(block[1]) / np.median(block[0])))
        if len(ratios) >= min_rounds:
            low, high = median_interval(ratios)
            if low > threshold or high <= threshold:
                break
    return float(np.median(times[0])), float(np.median(times[1])), ratios


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
