"""Device results (the JSON ``python -m edgeopt.device validate --json`` writes on a device) read back into a
``ValidationReport``, judged here against the profile's budgets, and tied to the bundle they came from."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from edgeopt.device.budgets import LATENCY_BUDGETS, Budgets, check_budgets
from edgeopt.device.runtime import RuntimeSettings
from edgeopt.device.stats import LatencyStats
from edgeopt.device.validate import ValidationReport
from edgeopt.errors import BadInputError, first_line
from edgeopt.file_digest import sha256_file

RESULT_SCHEMA = "edgeopt-device-result/1"


def read_result(path: str | Path) -> dict:
    """A device result file, checked to be one (schema and the bundle it names)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path}: not a readable device result ({first_line(exc)})") from exc
    return checked(data, str(path))


def checked(data, source: str) -> dict:
    if not isinstance(data, dict) or data.get("schema_version") != RESULT_SCHEMA:
        raise BadInputError(f"{source}: not a device result ({RESULT_SCHEMA}, written by `python -m edgeopt.device "
                            f"validate BUNDLE --json FILE` on the device)")
    bundle = data.get("bundle")
    if not isinstance(bundle, dict) or not isinstance(bundle.get("sha256"), str):
        raise BadInputError(f"{source}: the result names no bundle sha256")
    return data


def check_bundle(data: dict, bundle: str | Path, source: str) -> None:
    """Refuse a result measured on another bundle than ``bundle`` (by the sha256 of its bytes)."""
    sha = sha256_file(bundle)
    if data["bundle"]["sha256"] != sha:
        raise BadInputError(f"{source}: measured on bundle {data['bundle']['file']} (sha256 "
                            f"{data['bundle']['sha256'][:16]}...), not {Path(bundle).name} (sha256 {sha[:16]}...); "
                            f"refused")


def to_report(data: dict, budgets: Budgets, *, device_note: str | None = None) -> ValidationReport:
    """The device's figures as a ``ValidationReport``, its budgets checked again here against ``budgets``."""
    try:
        how, memory = data["measured_with"], data["memory"]
        runtime_latency = data.get("runtime_latency_ms")
        report = ValidationReport(
            artifact=data["artifact"], files=data["files"], settings=RuntimeSettings(**how["settings_requested"]),
            effective_settings=how["settings_effective"], runtime_version=how["runtime_version"],
            input_shapes=how["input_shapes"], runs=how["min_runs"], warmup=how["warmup"],
            min_seconds=how["min_seconds"], latency=LatencyStats(**data["latency_ms"]),
            first_inference_ms=data["first_inference_ms"], load_compile_ms=data["load_compile_ms"],
            rss_before_load_bytes=memory["rss_before_load_bytes"], peak_rss_bytes=memory["peak_rss_bytes"],
            cpus=how["cpus"], kernels=how["kernels"], host=data["host"], emulation_note=data["emulation_note"],
            notes=list(data["notes"]) + ([device_note] if device_note else []), checks=[], target=data["target"],
            budgets=budgets, runtime_latency=LatencyStats(**runtime_latency) if runtime_latency else None,
            timings_ms=tuple(data.get("timings_ms", ())), golden=data.get("golden"))
    except (KeyError, TypeError) as exc:
        raise BadInputError(f"device result is incomplete or malformed ({type(exc).__name__}: {first_line(exc)})") \
            from exc
    # a figure the device validator marked emulated (its host is not the profile's device) stays emulated when
    # judged again here; so does every timing figure of a result that says it was emulated
    marked = {c["name"]: c.get("reason") for c in data.get("checks", []) if c.get("status") == "emulated"}
    if report.emulation_note:
        marked = {name: report.emulation_note for name in LATENCY_BUDGETS} | marked
    return replace(report, checks=[replace(c, status="emulated", reason=marked[c.name]) if c.name in marked else c
                                   for c in check_budgets(budgets, report.measured())])
