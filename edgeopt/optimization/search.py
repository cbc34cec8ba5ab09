"""Search the plan's stages for the artifact that meets every budget of a device profile and the quality gate.

Stages run in the plan's order; the search stops after the first stage at whose end some candidate passes
(unless the stage says ``stop_when_passed = false``, as the baseline does), and picks among all passing
candidates the lowest objective figure; figures within 3% count as a tie, won by the smaller file. Built artifacts and measurements are cached.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from edgeopt.atomic import WriteError
from edgeopt.data import load_samples, sample_shapes
from edgeopt.device.host import host_info
from edgeopt.errors import BadInputError, first_line
from edgeopt.evaluate import Quality, QualityGate
from edgeopt.optimization.cache import Cache, digest, files_digest
from edgeopt.optimization.candidate import BUILD_FAILED, Candidate, build_failures, choose, closest
from edgeopt.optimization.executor import Executor, Inline
from edgeopt.optimization.plan import DEFAULT_PLAN, PlannedCandidate, load_plan
from edgeopt.device.formats import format_for_runtime
from edgeopt.recipe import Recipe
from edgeopt.reporting.reports import CompressReport, OptimizeReport
from edgeopt.source import load_model
from edgeopt.targets import OBJECTIVES, Measuring, Target, judge, plan_emulation, validate_on
from edgeopt.versions import tool_versions


@dataclass
class OptimizeResult:
    target: Target
    gate: QualityGate
    objective: str
    measuring: Measuring
    candidates: list[Candidate]
    stages_run: list[str]
    chosen: Candidate | None
    closest: Candidate | None
    emulation_note: str | None
    cache_dir: Path
    plan: Path | str  # the plan file, or what searched instead of one
    inputs: dict = field(default_factory=dict)
    chosen_files: list[str] = field(default_factory=list)  # the chosen artifact's files, as written to --out
    pareto: dict | None = None  # with --search pareto: the study and its trials (edgeopt.optimization.pareto)

    @property
    def verdict(self) -> str:
        """``found``, ``budgets`` (some candidate keeps quality, none meets every budget), ``unbuilt`` (no
        candidate could be built: every build refused the model, data or recipe) or ``quality``."""
        if self.chosen:
            return "found"
        if self.closest:
            return "budgets"
        return "unbuilt" if self.build_failures and not any(c.artifact for c in self.candidates) else "quality"

    @property
    def build_failures(self) -> list[str]:
        """Why candidates could not be built, each reason once, in the order met."""
        return build_failures(c.skipped for c in self.candidates)

    def describe(self) -> dict:
        return self.report().to_dict()

    def report(self) -> OptimizeReport:
        """The typed report (``report.json``)."""
        return OptimizeReport(**{
            "verdict": self.verdict,
            "chosen": self.chosen.label if self.chosen else None,
            "closest": self.closest.label if self.closest else None,
            "objective": self.objective,
            "target": self.target.describe(),
            "gate": {"max_top1_drop": self.gate.max_drop, "min_cosine": self.gate.min_cosine,
                     "metric": self.gate.metric.describe() if self.gate.metric else None},
            "measuring": self.measuring.describe(),
            "emulation_note": self.emulation_note,
            "stages_run": self.stages_run,
            "candidates": [c.describe() for c in self.candidates],
            "inputs": self.inputs,
            "plan": str(self.plan),
            "cache": str(self.cache_dir),
            "host": host_info().describe(),
            "versions": tool_versions(),
            "chosen_files": self.chosen_files or None,
            "pareto": self.pareto,
        })


def search(model: str, calibration: str, eval_data: str, target: Target, *, gate: QualityGate, cache: Cache,
           plan: str | Path | None = None, measuring: Measuring = Measuring(), objective: str = "p50_ms",
           input_shapes: dict | None = None, seed: int = 0, pool=None,
           progress: Callable[[Candidate, str], None] = lambda candidate, event: None,
           executor: Executor | None = None) -> OptimizeResult:
    """Run the plan's stages for ``target``; ``progress(candidate, event)`` hears what happens to each one.
    ``pool`` (``edgeopt.remote.pool.DevicePool``): measure on real devices, in parallel with the next builds.
    ``executor`` (``edgeopt.optimization.executor``): where builds and host measurements run (default: here)."""
    stages = load_plan(plan)
    builder, source = prepare(model, calibration, eval_data, target, gate=gate, cache=cache, measuring=measuring,
                              objective=objective, input_shapes=input_shapes, seed=seed, pool=pool, progress=progress,
                              executor=executor)
    gate = builder.gate
    emulation = builder.emulation
    candidates: list[Candidate] = []
    stages_run = []
    # Devices measure while this host builds the next candidate; here, measuring waits for a quiet host.
    with ThreadPoolExecutor(max_workers=pool.slots if pool else 1) as measurers:
        for stage in stages:
            stages_run.append(stage.name)
            pending = []
            for planned in stage.candidates:
                candidate = builder.candidate(stage.name, planned)
                candidate.skipped = _skip_reason(planned, target, source.kind, candidates)
                candidates.append(candidate)
                if candidate.skipped:
                    progress(candidate, "skipped")
                    continue
                builder.build(candidate, planned.recipe)
                if candidate.skipped:
                    progress(candidate, "done")
                elif pool:
                    pending.append((candidate, measurers.submit(builder.measure, candidate)))
                else:
                    builder.measure(candidate)
                    progress(candidate, "done")
            for candidate, future in pending:
                future.result()
                progress(candidate, "done")
            if stage.stop_when_passed and any(c.passed for c in candidates):
                break
    result = OptimizeResult(target, gate, objective, measuring, candidates, stages_run,
                            choose(candidates, objective), closest(candidates),
                            emulation.note if emulation else None, cache.root, Path(plan or DEFAULT_PLAN),
                            {"model": str(model), "calibration": str(calibration), "evaluation": str(eval_data)})
    return result


def _metric_key(gate: QualityGate) -> dict:
    """What the cache key holds of the task metric: its declaration and its file's content."""
    if gate.metric is None:
        return {}
    return {"metric": gate.metric.describe(), "metric_file": files_digest(gate.metric.name.rpartition(":")[0])}


def prepare(model: str, calibration: str, eval_data: str, target: Target, *, gate: QualityGate, cache: Cache,
            measuring: Measuring, objective: str, input_shapes: dict | None, seed: int, pool,
            progress: Callable[[Candidate, str], None], executor: Executor | None = None):
    """Check the inputs (bad ones fail here, before any work) and set up the ``Builder`` every search builds and
    measures its candidates with; returns it and the loaded source model."""
    if objective not in OBJECTIVES:
        raise BadInputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    from edgeopt.pipeline import with_metric

    gate = with_metric(gate, Recipe(()), target)
    shapes = {**target.input_shapes, **(input_shapes or {})}
    source = load_model(model, shapes, target.batch_axes, data_shapes=functools.partial(sample_shapes, calibration),
                        shapes_from=target.input_shapes_from(input_shapes))
    load_samples(calibration, source.inputs, source.tokenizer)
    load_samples(eval_data, source.inputs, source.tokenizer)
    fmt = format_for_runtime(target.settings.runtime).name
    inputs = {"model": files_digest(model), "calibration": files_digest(calibration),
              "evaluation": files_digest(eval_data), "input_shapes": {k: list(v) for k, v in shapes.items()},
              "batch_axes": dict(target.batch_axes), "seed": seed, "format": fmt, "versions": tool_versions(),
              # passes see the target and the gate (weights mode=auto, int8_ac's allowed drop)
              "target": target.describe(), "gate": {"max_drop": gate.max_drop, "min_cosine": gate.min_cosine,
                                                   "cosine_on_labelled": gate.cosine_on_labelled,
                                                   "outputs": list(gate.outputs), **_metric_key(gate)}}
    emulation = None if pool else plan_emulation(target, host_info())
    measure_key = digest({"settings": (emulation.settings if emulation else target.settings).describe(),
                          "cpus": emulation.cpus if emulation else None,
                          "max_isa": emulation.max_isa if emulation else None, "runs": measuring.runs,
                          "warmup": measuring.warmup, "min_seconds": float(measuring.min_seconds),
                          "host": host_info().cpu_model})
    builder = Builder(model, calibration, eval_data, target, gate, cache, measuring, shapes, seed, fmt, inputs,
                      measure_key, progress, emulation, pool, executor or Inline())
    return builder, source


def _skip_reason(planned: PlannedCandidate, target: Target, source_kind: str, done: list[Candidate]) -> str | None:
    if planned.recipe.steps and planned.precision not in target.precisions:
        return f"{target.name} does not run {planned.precision} (it lists {', '.join(target.precisions)})"
    runs = format_for_runtime(target.settings.runtime).name
    for step in planned.recipe.steps:
        if step.info.needs_torch_module and source_kind != "torch":
            return f"step '{step.name}' needs a PyTorch model (this one is {source_kind})"
        if step.info.formats and runs not in step.info.formats:
            return (f"step '{step.name}' writes {', '.join(step.info.formats)} only, and {target.name} runs "
                    f"{runs} ({target.settings.runtime})")
    if planned.if_gate_failed:
        failed = [c.label for c in done if c.label in planned.if_gate_failed and c.gate_passed is False]
        if not failed:
            return f"only tried when {' or '.join(planned.if_gate_failed)} fails the quality gate"
    return None


@dataclass
class Builder:
    model: str
    calibration: str
    eval_data: str
    target: Target
    gate: QualityGate
    cache: Cache
    measuring: Measuring
    shapes: dict
    seed: int
    fmt: str
    inputs: dict
    measure_key: str
    progress: Callable[[Candidate, str], None]
    emulation: object = None  # targets.Emulation when this host stands in for the device
    pool: object = None  # remote.pool.DevicePool: measure on real devices
    executor: Executor = field(default_factory=Inline)  # runs the builds and host measurements

    def candidate(self, stage: str, planned: PlannedCandidate) -> Candidate:
        eligible = planned.precision in self.target.precisions
        return Candidate(planned.label, stage, planned.precision, planned.recipe.describe(), eligible)

    def build(self, candidate: Candidate, recipe: Recipe) -> None:
        """Build (or reuse) the artifact, then apply the quality gate to its evaluation."""
        from edgeopt.pipeline import compress_recipe

        key = digest({"inputs": self.inputs, "recipe": recipe.key()})
        entry = self.cache.entry(key)
        if self.cache.has_entry(key):
            candidate.reused["artifact"] = True
            self.progress(candidate, "reused artifact")
        else:
            self.progress(candidate, "building")
            try:
                self.executor.build(functools.partial(
                    compress_recipe, self.model, self.calibration, recipe, out=entry, target=self.target,
                    formats=(self.fmt,), eval_data=self.eval_data, gate=self.gate, input_shapes=self.shapes,
                    seed=self.seed, measuring=None, batch_axes=self.target.batch_axes), candidate.label)
            except WriteError:
                raise
            except BadInputError as exc:
                candidate.skipped = f"{BUILD_FAILED}{first_line(exc)}"
                return
            self.cache.seal(key)
        report = CompressReport.from_dict(json.loads((entry / "report.json").read_text(encoding="utf-8")))
        artifact = report.artifacts[0]
        candidate.artifact = entry / artifact["path"]
        candidate.file_bytes = artifact["bytes"]
        candidate.notes = list(report.notes)
        candidate.built = artifact["precision"]
        candidate.repair = report.decisions.get("int8_repair")
        original = Quality.from_dict(report.quality["original"])
        quality = Quality.from_dict(report.quality["artifacts"][self.fmt])
        candidate.top1, candidate.reference_top1 = quality.top1, original.top1
        candidate.cosine = quality.fidelity.cosine if quality.fidelity else None
        checked = self.gate.metric_check(original, quality)
        candidate.metric = checked.describe() if checked else None
        candidate.evaluation = (original, quality)
        candidate.gate_passed, candidate.gate_check = self.gate.check(original, quality)

    def measure(self, candidate: Candidate) -> None:
        """Measure (or reuse the measurement of) the artifact with the device's settings; check the budgets."""
        if self.pool is not None:
            self._measure_on_device(candidate)
            return
        key = candidate.artifact.parent.name
        stored = self.cache.load_measurement(key, self.measure_key)
        if stored is not None:
            candidate.reused["measurement"] = True
            self.progress(candidate, "reused measurement")
        else:
            self.progress(candidate, "measuring")
            try:
                report = self.executor.measure(functools.partial(
                    validate_on, self.target, candidate.artifact, measuring=self.measuring,
                    input_shapes=self.shapes), candidate.label)
            except (BadInputError, RuntimeError) as exc:  # the runtime cannot run this artifact here
                reason = first_line(exc).replace(str(candidate.artifact), "the artifact")
                candidate.skipped = f"measurement failed: {reason}"
                return
            stored = {"validation": report.to_dict(), "figures": report.measured(),
                      "timings_ms": list(report.timings_ms)}
            self.cache.store_measurement(key, self.measure_key, stored)
        candidate.validation, candidate.figures = stored["validation"], stored["figures"]
        candidate.timings_ms = stored["timings_ms"]
        busy_twice = any(check["status"] == "unreliable" for check in stored["validation"]["checks"])
        candidate.checks = judge(self.target.budgets, candidate.figures, self.emulation, busy_twice=busy_twice)

    def _measure_on_device(self, candidate: Candidate) -> None:
        """Measure on a free device of the pool (cached per device); a device lost mid-run leaves it unmeasured."""
        from edgeopt.remote.ssh import DeviceLost

        self.progress(candidate, "measuring")
        try:
            report = self.pool.measure(candidate.artifact, runs=self.measuring.runs, warmup=self.measuring.warmup,
                                       min_seconds=self.measuring.min_seconds, input_shapes=self.shapes)
        except DeviceLost as exc:
            candidate.skipped = f"unmeasured: {first_line(exc)}"
            return
        candidate.validation, candidate.figures = report.to_dict(), report.measured()
        candidate.checks, candidate.timings_ms = report.checks, list(report.timings_ms)
