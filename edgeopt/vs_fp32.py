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

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeopt.device.runtime import RuntimeSettings
from edgeopt.paired_timing import (BLOCK_S, COVERAGE, MAX_ROUNDS, MIN_ROUNDS, SLOWER_TOLERANCE, THREADS,
                                   median_interval, paired_ratios)


def settings_for(runtime: str, target=None) -> RuntimeSettings:
    """The pinned settings every comparison in ``runtime`` runs with: f32 inference precision, ``THREADS``
    threads; where ``target`` (an ``edgeopt.targets.Target``) runs this runtime, its threads (at most this host's
    CPUs) and ONNX Runtime's spinning, so that INT8 and FP32 are compared the way the device runs them."""
    threads, spinning = THREADS, None
    if target is not None and target.settings.runtime == runtime:
        threads = min(target.settings.threads or THREADS, len(os.sched_getaffinity(0)))
        spinning = target.settings.spinning
    if runtime == "openvino":
        return RuntimeSettings(threads=threads, inference_precision="f32")
    return RuntimeSettings(runtime="onnxruntime", threads=threads, inference_precision=None, performance_hint=None,
                           spinning=spinning)


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
    unbound: tuple[str, ...] = ()  # "FP32" / "the artifact": timed without bound outputs (ONNX Runtime refused)

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
                    f"{1 + SLOWER_TOLERANCE}" + (f"; {' and '.join(self.unbound)} without bound outputs (ONNX "
                                                 f"Runtime refuses a binding for a declared output shape its graph "
                                                 f"does not compute)" if self.unbound else "")),
                    "slower_means": f"the {COVERAGE:.0%} interval on the p50 ratio lies above {1 + SLOWER_TOLERANCE}",
                    "possibly_slower_means": f"the interval straddles {1 + SLOWER_TOLERANCE} after {MAX_ROUNDS} "
                                             "rounds and the median lies above it"}}


def compare(artifacts, fp32_ov_model, fp32_onnx_model, feeds: dict[str, np.ndarray],
            onnx_dynamic: dict[str, list[int]] | None = None, target=None) -> dict[str, VsFp32]:
    """Each artifact (``export.Artifact``) against FP32 in its format; artifacts saved as FP32 are skipped.
    ``onnx_dynamic``: the input axes the ONNX artifact declares dynamic, which the FP32 ONNX graph is timed with
    open too (like for like: a graph can run slower so; ``edgeopt.onnx_prep.as_shipped``). ``target``: the
    profile whose threads (and spinning) the comparison in its runtime takes (:func:`settings_for`)."""
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

                from edgeopt.onnx_prep import as_shipped

                fp32_path = Path(tmp) / "fp32.onnx"
                onnx.save(as_shipped(fp32_onnx_model, onnx_dynamic), str(fp32_path))
                fp32_bytes = fp32_path.stat().st_size
            else:
                continue
            settings = settings_for(artifact.runtime, target)
            sessions = [open_session(path, settings) for path in (fp32_path, artifact.path)]
            runs = [session.bind(feeds) for session in sessions]
            fp32_p50, p50, ratios = paired_ratios(*runs)
            unbound = tuple(who for who, session in zip(("FP32", "the artifact"), sessions)
                            if not session.bound_outputs)
            results[artifact.format] = VsFp32(artifact.format, artifact.bytes, fp32_bytes, p50, fp32_p50,
                                              tuple(ratios), settings, unbound)
    return results
