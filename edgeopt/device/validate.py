"""Validate a saved model against device budgets: measure it in a separate process, compare, report.

Lean module: numpy, the standard library and (in the measuring process) the one runtime the model needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgeopt import jsonio
from edgeopt.device.budgets import BudgetCheck, Budgets, check_budgets
from edgeopt.device.formats import file_format
from edgeopt.device.host import host_info
from edgeopt.device.runtime import SESSIONS, RuntimeSettings, format_sizes
from edgeopt.device.stats import LatencyStats, latency_stats
from edgeopt.errors import BadInputError

MB = 1_000_000  # budgets and reports use decimal megabytes
SCHEMA_VERSION = "1.5"  # of every JSON report edgeopt writes (docs/report.schema.json); major bumps break readers


@dataclass(frozen=True)
class ValidationReport:
    """Everything measured about one artifact, how it was measured, and the verdict per budget."""

    artifact: str
    files: dict[str, int]  # file name -> bytes on disk
    settings: RuntimeSettings  # as requested
    effective_settings: dict  # as the runtime reports them after compiling
    runtime_version: str
    input_shapes: dict[str, list[int]]
    runs: int
    warmup: int
    min_seconds: float
    latency: LatencyStats  # wall-clock of each synchronous inference call from Python: what the budgets check
    first_inference_ms: float  # cold: the first inference after compiling
    load_compile_ms: float  # read + compile, in the measuring process
    rss_before_load_bytes: int | None  # measuring process after importing the runtime, before loading
    peak_rss_bytes: int | None  # peak RSS of the measuring process (VmHWM)
    cpus: list[int]  # CPUs the measuring process was allowed to run on
    kernels: list[str]  # OpenVINO kernel types executed (ISA and precision evidence)
    host: dict
    emulation_note: str | None
    notes: list[str]
    checks: list[BudgetCheck]
    target: str | None = None
    budgets: Budgets = field(default_factory=Budgets)
    timings_ms: tuple[float, ...] = ()  # every timed inference, in order (for histograms)
    runtime_latency: LatencyStats | None = None  # OpenVINO's own per-request time, without the Python call
    golden: dict | None = None  # the artifact against a golden set (GoldenResult.describe()), when checked
    compress_gate: str | None = None  # why the edgeopt compress run that wrote it refused it, when it did

    @property
    def artifact_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def measured(self) -> dict[str, float | None]:
        """The figures budgets are checked against (see ``budgets.BUDGET_FIELDS``)."""
        return {
            "file_mb": self.artifact_bytes / MB,
            "peak_rss_mb": self.peak_rss_bytes / MB if self.peak_rss_bytes else None,
            "p50_ms": self.latency.p50_ms, "p95_ms": self.latency.p95_ms, "p99_ms": self.latency.p99_ms,
            "cv": self.latency.cv, "p99_over_p50": self.latency.p99_over_p50,
        }

    def measured_with(self, where: bool = True) -> str:
        """One line saying how the latency figures were measured (and, with ``where``, on what)."""
        eff = self.effective_settings
        text = (f"{self.latency.runs} timed runs after {self.warmup} warm-up, {_batch_text(self.input_shapes)}, "
                f"wall-clock of each synchronous "
                f"inference call from Python on inputs bound once; "
                f"{self.settings.runtime} {self.runtime_version}, threads={eff.get('threads')}, "
                f"streams={eff.get('streams')}, hint={eff.get('performance_hint')}, "
                f"inference precision={eff.get('inference_precision')}")
        if eff.get("compiled_at"):
            text += "; dynamic inputs compiled static at " + format_sizes(eff["compiled_at"])
        if not where:
            return text
        return f"{text}; {self.emulation_note or 'on this host (' + self.host['cpu_model'] + ')'}"

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "report": "validation",
            "target": self.target,
            "artifact": self.artifact,
            "files": self.files,
            "artifact_bytes": self.artifact_bytes,
            "passed": self.passed,
            "checks": [check.describe() for check in self.checks],
            "budgets": self.budgets.describe(),
            "latency_ms": self.latency.describe(),
            "runtime_latency_ms": self.runtime_latency.describe() if self.runtime_latency else None,
            "first_inference_ms": self.first_inference_ms,
            "load_compile_ms": self.load_compile_ms,
            "memory": {"rss_before_load_bytes": self.rss_before_load_bytes, "peak_rss_bytes": self.peak_rss_bytes,
                       "measured_in": "a separate process (python -m edgeopt.device.probe); peak = VmHWM"},
            "measured_with": {
                "summary": self.measured_with(),
                "runs": self.latency.runs, "min_runs": self.runs, "warmup": self.warmup,
                "min_seconds": self.min_seconds, "batch": leading_batch(self.input_shapes),
                "input_shapes": self.input_shapes,
                "settings_requested": self.settings.describe(), "settings_effective": self.effective_settings,
                "runtime_version": self.runtime_version, "cpus": self.cpus, "kernels": self.kernels,
            },
            "host": self.host,
            "emulated": self.emulation_note is not None,
            "emulation_note": self.emulation_note,
            "notes": self.notes,
            "timings_ms": list(self.timings_ms),
            **({"golden": self.golden} if self.golden is not None else {}),
            **({"compress_gate": self.compress_gate} if self.compress_gate is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ValidationReport":
        """The report ``to_dict`` wrote (``from_dict(r.to_dict()) == r``)."""
        how, memory = data["measured_with"], data["memory"]
        check_keys = ("name", "budget", "measured", "unit", "passed", "margin")
        return cls(
            artifact=data["artifact"], files=dict(data["files"]),
            settings=RuntimeSettings(**how["settings_requested"]), effective_settings=how["settings_effective"],
            runtime_version=how["runtime_version"], input_shapes=how["input_shapes"], runs=how["min_runs"],
            warmup=how["warmup"], min_seconds=how["min_seconds"], latency=LatencyStats(**data["latency_ms"]),
            first_inference_ms=data["first_inference_ms"], load_compile_ms=data["load_compile_ms"],
            rss_before_load_bytes=memory["rss_before_load_bytes"], peak_rss_bytes=memory["peak_rss_bytes"],
            cpus=how["cpus"], kernels=how["kernels"], host=data["host"], emulation_note=data["emulation_note"],
            notes=data["notes"], checks=[BudgetCheck(**{k: c[k] for k in check_keys},
                                                      **{k: c[k] for k in ("status", "reason") if k in c})
                                          for c in data["checks"]],
            target=data["target"], budgets=Budgets.from_dict(data["budgets"]),
            timings_ms=tuple(data["timings_ms"]),
            runtime_latency=LatencyStats(**data["runtime_latency_ms"]) if data["runtime_latency_ms"] else None,
            golden=data.get("golden"), compress_gate=data.get("compress_gate"),
        )


def artifact_files(model_path: Path) -> dict[str, int]:
    """The files a model needs (``.xml`` + ``.bin``, or ``.onnx``) and their sizes in bytes."""
    return {f.name: f.stat().st_size for f in file_format(model_path).files(model_path) if f.is_file()}


def isa_cap_note(max_isa: str) -> str:
    """What an emulation note says of oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``), so the cap's own part is taken
    out of the note when the cap is dropped."""
    return f"; ISA capped to {max_isa} (ONEDNN_MAX_CPU_ISA)"


def validate_artifact(model_path: str | Path, settings: RuntimeSettings, budgets: Budgets, runs: int = 300,
                      warmup: int = 20, min_seconds: float = 2.0, emulation_note: str | None = None, *,
                      cpus: tuple[int, ...] | None = None, max_isa: str | None = None,
                      input_shapes: dict[str, tuple[int, ...]] | None = None, target: str | None = None,
                      notes: tuple[str, ...] = (), timeout: float | None = None) -> ValidationReport:
    """Measure ``model_path`` in a fresh process with ``settings`` and check it against ``budgets``.

    ``cpus`` pins the measuring process's CPU affinity and ``max_isa`` caps OpenVINO's kernels
    (``ONEDNN_MAX_CPU_ISA``, e.g. ``AVX2``): both emulate a device; ``emulation_note`` says so in the report.
    """
    path = Path(model_path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such model file")
    file_format(path)  # rejects anything but a model file
    if runs < 1 or warmup < 1 or min_seconds < 0:
        raise BadInputError(f"runs and warm-up must be at least 1 and min-seconds not negative "
                            f"(got runs={runs}, warmup={warmup}, min_seconds={min_seconds})")
    request = {"model": str(path.resolve()), "settings": settings.describe(), "runs": runs, "warmup": warmup,
               "min_seconds": min_seconds, "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
               "cpus": list(cpus) if cpus else None}
    load_before = _load_average()
    notes = list(notes)
    try:
        result = _run_probe(request, max_isa, timeout)
    except (BadInputError, ProbeFailed) as exc:
        if not max_isa:
            raise
        # OpenVINO picks some kernels (e.g. for compressed weights) by the real CPU, so a oneDNN cap can leave
        # no implementation at all, or one that crashes (PP-OCRv4 rec's INT8 IR: SIGSEGV at the first inference
        # under AVX2); measure with the host's ISA rather than not at all, and say so.
        result = _run_probe(request, None, timeout)
        notes.append(f"the {max_isa} ISA cap was dropped for this model: OpenVINO could not run it with oneDNN "
                     f"capped ({exc}); measured with this host's full ISA, so latency reads lower than on the device")
        emulation_note = (emulation_note.replace(isa_cap_note(max_isa), "") + "; ISA cap dropped for this model "
                          "(see notes)") if emulation_note else None
    host = host_info().describe()
    load = max(load_before, _load_average())
    notes += _precision_notes(settings, result["effective_settings"]) + _load_notes(load, host)
    if not result.get("bound_outputs", True):  # a probe from before the field: bound
        notes.append("timed without bound outputs: ONNX Runtime refused an output binding (a declared output "
                     "shape the graph does not compute), so each call also copies its outputs out, as a plain run "
                     "does; latency reads a little higher than a bound run's")
    report = ValidationReport(
        artifact=str(path), files=artifact_files(path), settings=settings,
        effective_settings=result["effective_settings"], runtime_version=result["runtime_version"],
        input_shapes=result["input_shapes"], runs=runs, warmup=warmup, min_seconds=min_seconds,
        latency=latency_stats(result["timings_ms"]), first_inference_ms=result["first_inference_ms"],
        load_compile_ms=result["load_compile_ms"], rss_before_load_bytes=result["rss_before_load_bytes"],
        peak_rss_bytes=result["peak_rss_bytes"], cpus=result["cpus"], kernels=result["kernels"],
        host=host | {"load_average_1min": round(load, 2)}, emulation_note=emulation_note, notes=notes, checks=[],
        target=target,
        budgets=budgets, timings_ms=tuple(result["timings_ms"]),
        runtime_latency=latency_stats(result["runtime_timings_ms"]) if result["runtime_timings_ms"] else None,
    )
    return replace(report, checks=check_budgets(budgets, report.measured()))


def leading_batch(shapes: dict[str, list[int]]) -> int | None:
    """The batch of one inference call: the first dimension, where every input of rank 1 or more has the same
    one (1 for a model without such inputs); None where they differ (a state batched on another axis)."""
    leading = {shape[0] for shape in shapes.values() if shape}
    return leading.pop() if len(leading) == 1 else (1 if not leading else None)


def _batch_text(shapes: dict[str, list[int]]) -> str:
    batch = leading_batch(shapes)
    sizes = format_sizes(shapes)
    return (f"batch {batch}" if batch is not None else "batch as the shapes say") + (f" ({sizes})" if sizes else "")


class ProbeFailed(RuntimeError):
    """The measuring process ended without a result (a crash in the runtime)."""


def _run_probe(request: dict, max_isa: str | None, timeout: float | None) -> dict:
    env = dict(os.environ)
    if max_isa:
        env["ONEDNN_MAX_CPU_ISA"] = max_isa
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="edgeopt-probe-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(jsonio.dumps(request), encoding="utf-8")
        try:
            proc = subprocess.run([sys.executable, "-m", "edgeopt.device.probe", str(request_path), str(result_path)],
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BadInputError(f"{request['model']}: measuring took longer than {timeout:.0f} s") from exc
        if not result_path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ProbeFailed(f"the measuring process failed (exit {proc.returncode}): {tail[0]}")
        result = json.loads(result_path.read_text(encoding="utf-8"))
    if "error" in result:
        raise BadInputError(result["error"])
    return result


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 0.0


def _load_notes(load: float, host: dict) -> list[str]:
    """Say when other processes competed for the CPUs: the spread figures then include their interference."""
    if load <= host["usable_cpus"]:
        return []
    return [f"the host was busy while measuring (1-min load average {load:.1f} on {host['usable_cpus']} CPUs): "
            f"the tail and spread figures (p95, p99, CV, p99/p50) include other processes' interference"]


def _precision_notes(settings: RuntimeSettings, effective: dict) -> list[str]:
    """Say when the runtime did not compute in the precision the settings (the device's) ask for."""
    asked = settings.inference_precision
    if asked is None:
        return []
    if not SESSIONS[settings.runtime].precision_hint:
        return [f"inference precision {asked} is not applied: {SESSIONS[settings.runtime].label} computes in the "
                f"model's own precision"]
    used = str(effective.get("inference_precision"))
    if used != asked:
        return [f"the profile asks for inference precision {asked}, but OpenVINO on this host computes in {used} "
                f"(the host has no {asked} arithmetic); latency differs from the device's"]
    return []
