"""The typed, versioned reports edgeopt writes as JSON (``report.json`` of compress and optimize; the validation
report is ``edgeopt.device.validate.ValidationReport``, lean for the device). Each is a dataclass with
``to_dict``/``from_dict`` (``from_dict(r.to_dict()) == r``), a ``schema_version`` and a ``report`` kind; the JSON
Schema of all of them is docs/report.schema.json, which the tests check every written report against.

Figures nested inside (quality, host, measurement settings) keep their own ``describe()`` shapes, typed in the
schema.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from edgeopt.device.validate import SCHEMA_VERSION
from edgeopt.errors import BadInputError


class _Report:
    """``to_dict``/``from_dict`` for a flat report dataclass; unknown or missing keys are errors on reading."""

    kind = ""

    def to_dict(self) -> dict:
        data = {"schema_version": SCHEMA_VERSION, "report": self.kind}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not (item.metadata.get("omit_none") and value is None):
                data[item.name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict):
        version, kind = data.get("schema_version"), data.get("report")
        if kind != cls.kind or not isinstance(version, str) or version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise BadInputError(f"not a {cls.kind} report of schema {SCHEMA_VERSION} "
                                f"(report={kind!r}, schema_version={version!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names - {"schema_version", "report"}
        if unknown:
            raise BadInputError(f"{cls.kind} report: unknown key(s) {', '.join(sorted(unknown))}")
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise BadInputError(f"{cls.kind} report: {exc}") from None


def _optional():
    return field(default=None, metadata={"omit_none": True})


@dataclass
class CompressReport(_Report):
    kind = "compress"

    recipe: str
    recipe_steps: list[dict]  # {"name", "params" (as given)}
    notes: list[str]
    artifacts: list[dict]  # Artifact.describe(): format, path, precision, bytes, files {name: {bytes, sha256}}
    fp32_ir_bytes: int | None
    weight_bytes: dict  # "fp32_openvino" and each format -> {"bytes", "by_type"}
    quality: dict  # evaluated_with, gate, original, artifacts, passed
    host: dict
    versions: dict
    steps: dict | None  # the step report (measured_with, rows)
    seconds: dict = field(default_factory=dict)  # per stage of the run
    validation: dict | None = _optional()  # with a target: {"target", "passed", "reports": [validation report]}
    inputs: dict | None = None  # what it was built from (provenance.describe_inputs): model, calibration, ...
    decisions: dict = field(default_factory=dict)  # measured choices passes made (e.g. "onnx_int8")
    vs_fp32: dict = field(default_factory=dict)  # per format: size and p50 against FP32 (VsFp32.describe())
    flagged: dict = field(default_factory=dict)  # per format: ["larger", "slower"] against FP32
    companions: list[str] | None = _optional()  # files beside the artifacts they need (a Hugging Face tokenizer)


@dataclass
class OptimizeReport(_Report):
    kind = "optimize"

    verdict: str  # found | budgets | quality
    chosen: str | None
    closest: str | None
    objective: str
    target: dict
    gate: dict
    measuring: dict
    emulation_note: str | None
    stages_run: list[str]
    candidates: list[dict]
    inputs: dict
    plan: str
    cache: str
    host: dict
    versions: dict
    chosen_files: list[str] | None = _optional()
    devices: list[dict] | None = _optional()  # with --device: the pool that measured the candidates
    pareto: dict | None = _optional()  # with --search pareto: sampler, seed, budget, storage, every trial, the front


@dataclass
class FleetReport(_Report):
    """``edgeopt fleet``'s matrix: every (model, target) pair's verdict, and where and under what load each
    build and host measurement ran (``events``; ``slot_overlaps`` counts measurements that overlapped a build on
    the same machine: 0 when the measurement slots held)."""

    kind = "fleet"

    fleet: str  # the fleet file
    executor: dict  # name (local | ray), address, nodes, build_slots
    exit_code: int  # the worst pair's
    models: list[str]
    targets: list[str]
    pairs: list[dict]  # fleet.run.PairResult.describe()
    events: list[dict]  # fleet.slots.SlotEvent.describe(), by start time
    slot_overlaps: int
    measuring: dict
    cache: str
    seconds: float
    host: dict
    versions: dict
