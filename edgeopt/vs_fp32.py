"""Is a compressed artifact actually smaller and faster than the FP32 model in the same format and runtime?

INT8 is not free: on small models the quantize/dequantize boundaries can cost more than the arithmetic saves,
and a graph the runtime cannot fuse runs slower than float. After every compress each artifact is timed
against its FP32 counterpart (same format, same runtime, pinned threads and precision, interleaved rounds on
the same input) and sized; a larger or slower one is flagged in the report, the table and the exit summary.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeopt.device.runtime import RuntimeSettings

SLOWER_TOLERANCE = 0.05  # a p50 more than 5% above FP32's is "slower" (quick interleaved timing on a shared host)
THREADS = 2
ROUNDS = 3
BUDGET_S = 0.3  # seconds per model and round


def settings_for(runtime: str) -> RuntimeSettings:
    if runtime == "openvino":
        return RuntimeSettings(threads=THREADS, inference_precision="f32")
    return RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None, performance_hint=None)


@dataclass(frozen=True)
class VsFp32:
    """One artifact against the FP32 model in the same format."""

    format: str
    bytes: int
    fp32_bytes: int
    p50_ms: float
    fp32_p50_ms: float
    settings: RuntimeSettings

    @property
    def size_ratio(self) -> float:
        return self.bytes / self.fp32_bytes

    @property
    def p50_ratio(self) -> float:
        return self.p50_ms / self.fp32_p50_ms

    @property
    def larger(self) -> bool:
        return self.bytes > self.fp32_bytes

    @property
    def slower(self) -> bool:
        return self.p50_ratio > 1 + SLOWER_TOLERANCE

    @property
    def flags(self) -> list[str]:
        return [flag for flag, on in (("larger than FP32", self.larger), ("slower than FP32", self.slower)) if on]

    def summary(self) -> str:
        return f"{self.size_ratio:.2f}x size, {self.p50_ratio:.2f}x p50 of FP32"

    def describe(self) -> dict:
        return {"bytes": self.bytes, "fp32_bytes": self.fp32_bytes, "size_ratio": round(self.size_ratio, 4),
                "p50_ms": round(self.p50_ms, 4), "fp32_p50_ms": round(self.fp32_p50_ms, 4),
                "p50_ratio": round(self.p50_ratio, 4), "larger": self.larger, "slower": self.slower,
                "flags": self.flags,
                "measured_with": {**self.settings.describe(), "method": f"{ROUNDS} interleaved rounds of "
                                  f"~{BUDGET_S}s per model, bound inputs (first calibration sample), median",
                                  "slower_means": f"p50 ratio > {1 + SLOWER_TOLERANCE}"}}


def compare(artifacts, fp32_ov_model, fp32_onnx_model, feeds: dict[str, np.ndarray]) -> dict[str, VsFp32]:
    """Each artifact (``export.Artifact``) against FP32 in its format; artifacts saved as FP32 are skipped."""
    from edgeopt.device.measure import time_interleaved
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
            sessions = [open_session(fp32_path, settings), open_session(artifact.path, settings)]
            per_round = _runs_per_round(sessions, feeds)
            timings = time_interleaved(sessions, feeds, ROUNDS, per_round, warmup=3)
            fp32_p50, p50 = (float(np.median(t)) for t in timings)
            results[artifact.format] = VsFp32(artifact.format, artifact.bytes, fp32_bytes, p50, fp32_p50, settings)
    return results


def _runs_per_round(sessions, feeds) -> int:
    slowest = 1e-5
    for session in sessions:
        run = session.bind(feeds)
        run()
        start = time.perf_counter()
        run()
        slowest = max(slowest, time.perf_counter() - start)
    return int(min(max(BUDGET_S / slowest, 3), 300))
