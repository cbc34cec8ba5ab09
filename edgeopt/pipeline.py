"""The compress pipeline, top to bottom: load → torch passes → convert → graph passes → save → evaluate."""

from __future__ import annotations

import contextlib
import copy
import functools
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgeopt import atomic, jsonio
from edgeopt.conversion import check_conversions
from edgeopt.data import SampleSet, load_samples, raw_pixel_inputs, sample_shapes
from edgeopt.device.formats import format_for_runtime, model_suffixes
from edgeopt.device.golden import GoldenResult, GoldenSet, load_golden
from edgeopt.device.host import host_info
from edgeopt.device.runtime import SESSIONS, RuntimeSettings
from edgeopt.device.validate import ValidationReport, artifact_files
from edgeopt.dynamic_axes import Reopened, reopen
from edgeopt.errors import BadInputError
from edgeopt.evaluate import (
    EVAL_SETTINGS,
    Quality,
    QualityGate,
    all_outputs,
    language_model_ids,
    measure_outputs,
    original_predictor,
    session_predictor,
    torch_predictor,
)
from edgeopt.export import Artifact, save_artifacts, saved_bytes
from edgeopt.formats import FORMATS, REFERENCE, artifact_weight_bytes, format_of, parse_formats
from edgeopt.hf import save_companions
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.registry import GRAPH, TORCH
from edgeopt.pinning import pin_branch_inputs
from edgeopt.provenance import describe_inputs
from edgeopt.recipe import Recipe, Step, build_recipe, recipe_toml
from edgeopt.reporting.reports import CompressReport
from edgeopt.reporting.steps import StepRecorder, StepReport
from edgeopt.source import SourceModel, load_model, to_onnx
from edgeopt.targets import Measuring, Target, load_target, validate_on
from edgeopt.versions import tool_versions
from edgeopt.vs_fp32 import VsFp32
from edgeopt.vs_fp32 import compare as compare_with_fp32
from edgeopt.weight_bytes import WeightBytes


@dataclass
class CompressResult:
    out: Path
    recipe: Recipe
    artifacts: list[Artifact]
    reference: Quality | None = None
    qualities: dict[str, Quality] = field(default_factory=dict)
    in_sample_cosine: dict[str, float] = field(default_factory=dict)  # ungated: worst output on calibration samples
    gate: QualityGate = field(default_factory=QualityGate)
    gate_results: dict[str, tuple[bool, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    eval_settings: RuntimeSettings = EVAL_SETTINGS
    fp32_ir_bytes: int | None = None  # size of the original model as FP32 OpenVINO IR, for size ratios
    fp32_weight_bytes: WeightBytes | None = None  # weight constants of the FP32 OpenVINO model
    weight_bytes: dict[str, WeightBytes] = field(default_factory=dict)  # per artifact format, as saved
    steps: StepReport | None = None  # figures after each recipe step
    target: Target | None = None  # the device profile the result is for
    validations: list[ValidationReport] = field(default_factory=list)  # the artifacts the target runs, measured
    inputs: dict | None = None  # what it was built from (``provenance.describe_inputs``)
    decisions: dict = field(default_factory=dict)  # measured choices passes made (e.g. the ONNX INT8 backend)
    vs_fp32: dict[str, VsFp32] = field(default_factory=dict)  # per format: size and p50 against FP32
    golden: dict[str, GoldenResult] = field(default_factory=dict)  # per format: against the golden set (--golden)
    companions: list[str] = field(default_factory=list)  # files the artifacts need beside them (a tokenizer)

    @property
    def flagged(self) -> dict[str, list[str]]:
        """Artifacts larger or slower than the FP32 model in the same format and runtime."""
        return {fmt: v.flags for fmt, v in self.vs_fp32.items() if v.flags}

    def settings_for(self, runtime: str) -> RuntimeSettings:
        """How artifacts of ``runtime`` are run for evaluation (a runtime without a precision hint gets none)."""
        if SESSIONS[runtime].precision_hint:
            return replace(self.eval_settings, runtime=runtime)
        return RuntimeSettings(runtime=runtime, inference_precision=None, performance_hint=None)

    @property
    def quality_passed(self) -> bool:
        return all(ok for ok, _ in self.gate_results.values())

    @property
    def budgets_passed(self) -> bool:
        return all(v.passed for v in self.validations)

    def describe(self) -> dict:
        return self.report().to_dict()

    def _metric_check(self, quality: Quality) -> dict | None:
        checked = self.gate.metric_check(self.reference, quality) if self.reference else None
        return checked.describe() if checked else None

    def report(self) -> CompressReport:
        """The typed report (``report.json``)."""
        return CompressReport(**{
            "recipe": self.recipe.describe(),
            "recipe_steps": [{"name": s.name, "params": s.params} for s in self.recipe.steps],
            "notes": self.notes,
            "artifacts": [a.describe(relative_to=self.out) for a in self.artifacts],
            "fp32_ir_bytes": self.fp32_ir_bytes,
            "weight_bytes": {"fp32_openvino": self.fp32_weight_bytes.describe() if self.fp32_weight_bytes else None,
                             **{k: v.describe() for k, v in self.weight_bytes.items()}},
            "quality": {
                "evaluated_with": {a.format: self.settings_for(a.runtime).describe() for a in self.artifacts},
                "gate": self.gate.describe(),
                "original": self.reference.describe() if self.reference else None,
                "artifacts": {k: {**q.describe(), "passed": self.gate_results[k][0], "check": self.gate_results[k][1],
                                  "metric_check": self._metric_check(q)}
                              for k, q in self.qualities.items()},
                "passed": self.quality_passed if self.gate_results else None,  # None: nothing was gated
                **({"golden": {k: g.describe() for k, g in self.golden.items()}} if self.golden else {}),
                **({"in_sample_cosine": self.in_sample_cosine} if self.in_sample_cosine else {}),
            },
            "host": host_info().describe(),
            "versions": tool_versions(),
            "inputs": self.inputs,
            "steps": self.steps.describe() if self.steps else None,
            "seconds": dict(self.seconds),
            "validation": {"target": self.target.name, "passed": self.budgets_passed,
                           "reports": [v.to_dict() for v in self.validations]} if self.validations else None,
            "decisions": self.decisions,
            "vs_fp32": {fmt: v.describe() for fmt, v in self.vs_fp32.items()},
            "flagged": self.flagged,
            "companions": self.companions or None,
        })


def compress(model: str | Path, calibration: str | Path, *, out: str | Path, recipe: str | Recipe | None = None,
             precision: str | None = None, target: Target | str | Path | None = None,
             formats: tuple[str, ...] | None = None, eval_data: str | Path | None = None,
             gate: QualityGate | None = None, input_shapes: dict | None = None, seed: int = 0,
             eval_settings: RuntimeSettings = EVAL_SETTINGS, train_data: str | Path | None = None,
             step_report: bool | None = None, quiet: bool = False, measuring: Measuring = Measuring(),
             weights: Step | None = None, batch_axes: dict | None = None, task: str | None = None,
             golden: str | Path | None = None, repair: bool = False) -> CompressResult:
    """Compress ``model`` with ``recipe`` and write the artifacts to ``out`` atomically.

    ``recipe``: steps (``"prune,distill,int8"``, a recipe ``.toml``, or a ``Recipe``); ``precision`` is the
    one-step shorthand (int8, fp16, fp32; default int8). ``target`` (a ``Target``, a profile name or a
    ``.toml`` path) does what ``--target`` does on the command line: its preferred precision unless the recipe
    or ``precision`` sets one, its input shapes, its runtime's format required, passes that choose per device
    (``weights`` mode=auto) see it, and the artifact it runs is validated against its budgets (when the quality
    gate passed) with ``measuring``. Verdicts are in the result (``quality_passed``, ``budgets_passed``);
    callers decide what a failure means. ``formats`` default: both, OpenVINO only for an OpenVINO IR input; with
    a ``target``, the format it runs.
    ``train_data`` feeds the torch steps that fine-tune (default: the calibration set). ``step_report`` measures
    the model after every step (default: when the recipe has a PyTorch step). ``batch_axes`` (by input name) and
    ``task`` (for a Hugging Face model folder) go to ``load_model``. ``golden``: a golden set folder
    (``edgeopt golden create``) every artifact is also checked against (its tolerances and metric threshold).
    ``repair`` replaces the recipe's ``int8`` step with ``int8_repair`` (the ladder that runs when INT8 misses
    the gate; needs ``eval_data``).
    """
    profile = as_target(target)
    return compress_recipe(model, calibration, build_recipe(recipe, precision, weights=weights, target=profile,
                                                            repair=repair),
                           out=out, target=profile, formats=formats, eval_data=eval_data, gate=gate,
                           input_shapes=input_shapes, seed=seed, eval_settings=eval_settings, train_data=train_data,
                           step_report=step_report, quiet=quiet, measuring=measuring, batch_axes=batch_axes,
                           task=task, golden=golden)


def _check_not_quantized(source) -> None:
    """An ONNX model a quantizer already wrote is no FP32 reference to compress and compare against (its
    OpenVINO conversion dequantizes the weights: ddddocr's 13.6 MB dynamic-int8 OCR model became a 45.6 MB IR,
    measured "smaller than FP32" against its own dequantized form)."""
    if source.quantized_ops:
        found = ", ".join(f"{n} {op}" for op, n in sorted(source.quantized_ops.items(), key=lambda kv: -kv[1])[:4])
        raise BadInputError(f"{source.path}: already quantized ({found}); a precision step needs the float "
                            "model to compress and compare against: give the FP32 original")


def compress_recipe(model: str | Path, calibration: str | Path, recipe: Recipe, *, out: str | Path,
                    target: Target | None = None, formats: tuple[str, ...] | None = None,
                    eval_data: str | Path | None = None, gate: QualityGate | None = None,
                    input_shapes: dict | None = None, seed: int = 0, eval_settings: RuntimeSettings = EVAL_SETTINGS,
                    train_data: str | Path | None = None, step_report: bool | None = None, quiet: bool = False,
                    measuring: Measuring | None = Measuring(), batch_axes: dict | None = None,
                    task: str | None = None, golden: str | Path | None = None) -> CompressResult:
    """``compress`` with the recipe exactly as given (the target adds no step); ``measuring=None`` skips the
    validation on the target (the search measures its candidates itself)."""
    timer = _Timer()
    profile = target
    formats, left_out = _formats(model, formats, profile, recipe)
    _check_contracts(recipe, formats, eval_data)
    asked = (gate.metric if gate else None) or recipe.metric  # a profile's metric applies where there is data
    if asked is not None and not eval_data and golden is None:
        raise BadInputError(f"the task metric {asked.name} needs evaluation data (--eval) or a golden set")
    gate = with_metric(gate or QualityGate(), recipe, profile)
    golden_set = load_golden(golden) if golden is not None else None
    shapes = {**(profile.input_shapes if profile else {}), **(input_shapes or {})}
    shapes_from = profile.input_shapes_from(input_shapes) if profile else "--input-shape"
    scratch = tempfile.TemporaryDirectory(prefix="edgeopt-pinned-")  # the folded model, when inputs are pinned
    try:
        return _compress_loaded(model, calibration, recipe, out=out, profile=profile, formats=formats,
                                left_out=left_out, eval_data=eval_data, gate=gate, shapes=shapes,
                                shapes_from=shapes_from, seed=seed,
                                eval_settings=eval_settings, train_data=train_data, step_report=step_report,
                                quiet=quiet, measuring=measuring, batch_axes=batch_axes, task=task,
                                golden_set=golden_set, timer=timer, scratch=Path(scratch.name))
    finally:
        scratch.cleanup()


def _compress_loaded(model, calibration, recipe: Recipe, *, out, profile: Target | None, formats: tuple[str, ...],
                     left_out: str | None, eval_data, gate: QualityGate, shapes: dict, shapes_from: str,
                     seed: int,
                     eval_settings: RuntimeSettings, train_data, step_report: bool | None, quiet: bool,
                     measuring: Measuring | None, batch_axes: dict | None, task: str | None,
                     golden_set: GoldenSet | None, timer: "_Timer", scratch: Path) -> CompressResult:
    with timer("load"):
        axes = {**(getattr(profile, "batch_axes", None) or {}), **(batch_axes or {})}
        source = load_model(model, shapes, axes, task, data_shapes=functools.partial(sample_shapes, calibration),
                            shapes_from=shapes_from)
        _check_gated_outputs(source, gate)
        if recipe.sets_precision:
            _check_not_quantized(source)
        calib = load_samples(calibration, source.inputs, source.tokenizer)
        evaluation = load_samples(eval_data, source.inputs, source.tokenizer) if eval_data else None
        train = load_samples(train_data, source.inputs, source.tokenizer) if train_data else None
        inputs = describe_inputs(model, source, {
            "calibration": (calibration, calib),
            "evaluation": (eval_data, evaluation) if evaluation is not None else None,
            "training": (train_data, train) if train is not None else None})
        loaded = source
        pinned = pin_branch_inputs(source, [s for s in (calib, evaluation, train) if s is not None], scratch)
        if pinned is not None:
            source, calib, evaluation, train = pinned.apply(source, calib, evaluation, train)
    if step_report is None:
        step_report = recipe.has_torch_steps
    recorder = StepRecorder(source, evaluation or calib, gated=gate.outputs,
                            metric=gate.metric if evaluation is not None else None) if step_report else None
    ctx = PassContext(calibration=calib, seed=seed, evaluation=evaluation, train=train, quiet=quiet, target=profile,
                      gate=gate)
    try:
        working, baseline, fp32_ir_bytes, fp32_weights = _run_recipe(source, recipe, ctx, formats, timer,
                                                                     observe=recorder)
        if source.kind == "onnx" and "onnx" in working.graphs and working.precision != "int8":
            working.notes += _outputs_as_computed(working.graphs["onnx"], calib.samples[0])
        with timer("dynamic axes"):
            reopened, unchecked = _reopen_dynamic_axes(working, loaded, pinned, calib, formats)
        out = Path(out)
        with atomic.atomic_dir(out) as tmp:
            with timer("save"):
                artifacts = save_artifacts(working, tmp, formats)
                companions = save_companions(loaded.folder, tmp) if loaded.folder else []
                if working.reproduce:
                    _write_reproducing_recipe(tmp / "recipe.toml", recipe, working.reproduce)
                if "int8_repair" in working.decisions:
                    _write_repair_page(tmp / "repair.html", working.decisions["int8_repair"])
            result = CompressResult(tmp, recipe, artifacts, gate=gate, notes=working.notes, seconds=timer.seconds,
                                    eval_settings=eval_settings, fp32_ir_bytes=fp32_ir_bytes,
                                    fp32_weight_bytes=fp32_weights,
                                    weight_bytes={a.format: artifact_weight_bytes(a.path) for a in artifacts},
                                    steps=recorder.finish() if recorder else None, target=profile, inputs=inputs,
                                    decisions=working.decisions)
            if pinned is not None:
                result.decisions["pinned_inputs"] = pinned.describe()
                result.notes.insert(0, pinned.note())
            if left_out:
                result.notes.insert(0, left_out)
            result.companions = companions
            if companions:
                result.notes.append(f"beside the artifacts, from {loaded.folder}: {', '.join(companions)}")
            if reopened:
                result.decisions["dynamic_axes"] = {name: check.describe() for name, check in reopened.items()}
            if loaded.sized_by_data:
                result.notes.append("dynamic input dimensions sized by the calibration data's samples (no "
                                    "--input-shape): " + ", ".join(loaded.sized_by_data))
            result.notes.extend(_fixed_dims_notes(source.fixed_dims(), reopened, unchecked))
            int8 = any(name.startswith("int8") for name in recipe.names)
            pixels = raw_pixel_inputs(calib, source.inputs) if int8 and not Path(str(calibration)).is_dir() else []
            if pixels:  # an image folder's scale is the user's own choice (its preprocess.toml)
                result.notes.append(f"the calibration data for {', '.join(pixels)} hold whole numbers 0-255, raw "
                                    "pixels: if the model's own preprocessing scales or normalises them (/255, mean "
                                    "and std), give the values it makes; INT8 calibrated on other values fails")
            if loaded.kind == "torch" and not loaded.declared_inputs:
                result.notes.append("the artifacts run at the PyTorch example's input sizes only ("
                                    + ", ".join(f"{s.name} {list(s.shape)}" for s in loaded.inputs)
                                    + "): a factory's example fixes every dimension; --input-shape sets others, and a "
                                    "factory returning (module, example, dynamic_axes) keeps those dynamic")
            with timer("vs fp32"):
                result.vs_fp32 = compare_with_fp32(artifacts, baseline.graphs.get("openvino"),
                                                   baseline.graphs.get("onnx"), calib.samples[0],
                                                   reopened["onnx"].axes if "onnx" in reopened else None,
                                                   target=profile)
                result.notes.extend(_faster_runtime(result.vs_fp32))
                result.notes.extend(_larger_than_source(loaded, artifacts))
            if evaluation is not None:
                with timer("evaluate"):
                    _evaluate(result, source, evaluation)
            if golden_set is not None:
                with timer("golden"):
                    _check_golden(result, golden_set)
            if evaluation is None and golden_set is None:
                with timer("in-sample check"):
                    _in_sample_check(result, source, calib)
            if profile is not None and measuring is not None and result.quality_passed:
                with timer("validate"):
                    result.validations = [validate_on(profile, a.path, measuring=measuring, input_shapes=shapes)
                                          for a in artifacts if a.runtime == profile.settings.runtime]
            result.validations = [replace(v, artifact=str(out / Path(v.artifact).name)) for v in result.validations]
            atomic.write_text(tmp / "report.json", jsonio.dumps(result.describe(), indent=2))
        result.out, result.artifacts = out, [a.moved_to(out) for a in artifacts]
        return result
    finally:
        if recorder:
            recorder.close()


def _reopen_dynamic_axes(working: WorkingModel, source: SourceModel, pinned, calib: SampleSet,
                         formats: tuple[str, ...]) -> tuple[dict[str, Reopened], str]:
    """Format name -> the source's dynamic input dimensions declared again in that artifact where it still
    computes the source's result at other sizes (``edgeopt.dynamic_axes``), checked against the source file or,
    for a PyTorch model, its FP32 export with those dimensions dynamic; and why none was checked (or "")."""
    if not source.dynamic_axes():
        return {}, ""
    if source.kind == "openvino":
        return {}, "an OpenVINO IR source: edgeopt checks other sizes against the source run in ONNX Runtime"
    pinned_feeds = {}
    if pinned is not None:
        dtypes = {spec.name: spec.dtype for spec in source.inputs}
        pinned_feeds = {name: np.asarray(value, dtypes[name]) for name, value in pinned.values.items()}
    try:
        reference = source.path if source.kind == "onnx" else to_onnx(
            working.torch_module, source.example_input, source.input_names, source.output_names,
            source.dynamic_axes())
    except BadInputError as exc:  # the export the check runs as the source; the artifacts do not need it
        return {}, f"no FP32 ONNX export of the model to check other sizes against: {exc}"
    # a PyTorch model's outputs at other sizes come from the model itself, not from its export
    run_source = torch_predictor(working.torch_module, source.input_names) if source.kind == "torch" else None
    reopened = {}
    for name in formats:
        working.graphs[name], check = reopen(working.graphs[name], reference, source.declared_inputs, calib.samples,
                                             pinned_feeds, run_source)
        if check is not None:
            reopened[name] = check
    return reopened, ""


def _fixed_dims_notes(fixed: list[str], reopened: dict[str, Reopened], why: str) -> list[str]:
    """What the notes say about the source's dynamic input dimensions, per artifact."""
    if not fixed:
        return []
    if not reopened:
        return ["dynamic input dimensions fixed in the artifacts, which run at these sizes only: " + ", ".join(fixed)
                + (f" ({why})" if why else "")]
    return [check.note() for check in reopened.values()]


def with_metric(gate: QualityGate, recipe: Recipe, target: Target | None) -> QualityGate:
    """The gate with the task metric a recipe or profile names, when the caller gave none (the command line's
    ``--metric`` wins, then the recipe's, then the profile's)."""
    if gate.metric is not None:
        return gate
    declared = recipe.metric or (target.metric if target is not None else None)
    return replace(gate, metric=declared) if declared is not None else gate


def as_target(target: Target | str | Path | None) -> Target | None:
    """A loaded profile from a ``Target``, a name or a ``.toml`` path."""
    return target if target is None or isinstance(target, Target) else load_target(target)


def _formats(model: str | Path, formats: tuple[str, ...] | str | None, target: Target | None,
             recipe: Recipe) -> tuple[tuple[str, ...], str | None]:
    """The formats to write, and a note naming any default format left out: one the ``target`` does not run
    (its own format is the one gated and packaged), or one a step of the recipe does not write (``int8_repair``:
    OpenVINO IR only)."""
    if isinstance(formats, str):
        formats = parse_formats(formats)
    left_out = None
    native = format_of(model).name if Path(model).suffix.lower() in model_suffixes() else None
    needed = format_for_runtime(target.settings.runtime).name if target is not None else None  # what it runs
    if formats is None:
        formats = (REFERENCE,) if native == REFERENCE else tuple(FORMATS)
        if needed in formats and len(formats) > 1:
            left_out = (f"{', '.join(FORMATS[f].label for f in formats if f != needed)}: not written: target "
                        f"{target.name} runs {target.settings.runtime} (--format {','.join(FORMATS)} writes both)")
            formats = (needed,)
        accepted = [f for f in formats if all(f in step.info.formats for step in recipe.stage(GRAPH))]
        if accepted and len(accepted) < len(formats):  # by default, the formats every graph step writes
            steps = [_writes_only(step) for step in recipe.stage(GRAPH) if any(f not in step.info.formats
                                                                                  for f in formats)]
            left_out = (f"{', '.join(FORMATS[f].label for f in formats if f not in accepted)}: not written: "
                        + "; ".join(steps))
            formats = tuple(accepted)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise BadInputError(f"unknown format(s) {', '.join(unknown)} (known: {', '.join(FORMATS)})")
    if target is not None:
        reads = f"target {target.name} runs {target.settings.runtime}, which reads {FORMATS[needed].label} files"
        if native == REFERENCE and needed != REFERENCE:
            raise BadInputError(f"{reads}; an OpenVINO IR source is written as OpenVINO IR only")
        blocked = [_writes_only(step) for step in recipe.stage(GRAPH) if needed not in step.info.formats]
        if blocked:  # whatever --format asks, no file the target runs could be written
            raise BadInputError(f"{reads}; " + "; ".join(blocked))
        if needed not in formats:
            raise BadInputError(f"target {target.name} runs {target.settings.runtime}: --format must include {needed}")
    return tuple(formats), left_out


def _writes_only(step) -> str:
    """A graph step's formats, as a reason a format is not written ("int8_repair writes OpenVINO IR only")."""
    return f"{step.name} writes {', '.join(FORMATS[f].label for f in step.info.formats)} only"


def _check_contracts(recipe: Recipe, formats: tuple[str, ...], eval_data) -> None:
    """What the passes declare they need, checked before anything is loaded."""
    for step in recipe.steps:
        info = step.info
        if info.needs_eval and not eval_data:
            raise BadInputError(f"{step.name}: needs evaluation data (--eval)")
        refused = [f for f in formats if info.stage == GRAPH and f not in info.formats]
        if refused:
            labels = ", ".join(FORMATS[f].label for f in info.formats)
            raise BadInputError(f"{step.name}: runs on {labels} only; ask for --format {','.join(info.formats)}")


def _run_recipe(source: SourceModel, recipe: Recipe, ctx: PassContext, formats: tuple[str, ...], timer: "_Timer",
                observe: StepRecorder | None = None) -> tuple[WorkingModel, int, WeightBytes]:
    """Run torch steps, convert, run graph steps; also return the original model's FP32 IR size and weight
    bytes."""
    torch_steps, graph_steps = recipe.stage(TORCH), recipe.stage(GRAPH)
    if torch_steps and source.kind != "torch":
        raise BadInputError(f"{source.path}: {', '.join(s.name for s in torch_steps)} need(s) a PyTorch model "
                            f"(given {source.kind}); ONNX and OpenVINO IR have no training graph")
    working = WorkingModel(source, torch_module=copy.deepcopy(source.torch_module) if source.kind == "torch" else None)
    observe = observe or (lambda label, model: None)
    with timer("step report"):
        observe("original", working)
    for step in torch_steps:
        with timer(step.name):
            step.info.run(working, ctx, step.config)
        with timer("step report"):
            observe(step.describe(), working)
    reference = FORMATS[REFERENCE]
    with timer("convert"):
        for name in dict.fromkeys((REFERENCE, *formats)):
            fmt = FORMATS[name]
            try:
                working.graphs[name] = (fmt.from_torch(working.torch_module, source.example_input,
                                                       source.input_names, source.output_names, source.export_axes())
                                        if source.kind == "torch" else fmt.from_source(source))
            except BadInputError as exc:  # the other format converted: say how to have it alone
                done = [FORMATS[f].label for f in working.graphs if f in formats]
                if not done:
                    raise
                raise BadInputError(f"{exc}; --format {','.join(f for f in working.graphs if f in formats)} "
                                    f"writes the {' and '.join(done)} without it") from exc
    if not torch_steps:  # after pruning the graphs are another model by design
        with timer("conversion check"):
            working.notes += check_conversions(source, working.graphs, ctx.calibration.samples, formats,
                                               ctx.gate or QualityGate(),
                                               functools.partial(original_predictor, source, EVAL_SETTINGS))
    # Size baselines are the original model's, not the model after pruning.
    originals = dict(working.graphs) if not torch_steps else {
        name: FORMATS[name].from_torch(source.torch_module, source.example_input, source.input_names,
                                       source.output_names, source.export_axes()) for name in working.graphs}
    # Some graph passes change the model in place (nncf.compress_weights on OpenVINO): keep copies.
    baseline = WorkingModel(source, graphs={name: _copy_graph(name, g) for name, g in originals.items()})
    original = originals[REFERENCE]
    fp32_ir_bytes = saved_bytes(original, REFERENCE, float_weights_fp16=False)
    fp32_weights = reference.count_weights(original)
    for step in graph_steps:
        with timer(step.name):
            step.info.run(working, ctx, step.config)
        with timer("step report"):
            observe(step.describe(), working)
    return working, baseline, fp32_ir_bytes, fp32_weights


RUNTIME_GAP = 2.0  # one format's artifact this many times faster than the other's in its runtime is worth a note


def _faster_runtime(versus: dict[str, VsFp32]) -> list[str]:
    """A note when the artifact in one runtime ran ``RUNTIME_GAP`` times faster than the other format's in its
    own (CREPE's INT8: 0.98 ms in ONNX Runtime, 3.9 ms in OpenVINO): a device that runs either can choose."""
    if not {"openvino", "onnx"} <= set(versus):
        return []
    ir, onnx = versus["openvino"], versus["onnx"]
    gap = ir.p50_ms / onnx.p50_ms
    if 1 / RUNTIME_GAP < gap < RUNTIME_GAP:
        return []
    (fast, fast_runtime), (slow, slow_runtime) = sorted(((onnx, "ONNX Runtime"), (ir, "OpenVINO")),
                                                        key=lambda pair: pair[0].p50_ms)
    return [f"on this host the {fast.format} artifact ran {max(gap, 1 / gap):.1f}x faster in {fast_runtime} than the "
            f"{slow.format} one in {slow_runtime} (p50 {fast.p50_ms:.3g} vs {slow.p50_ms:.3g} ms, each timed beside "
            f"its FP32, not against each other): a device that runs either may prefer {fast_runtime} (a profile's "
            f"[runtime] name)"]


def _larger_than_source(source: SourceModel, artifacts: list[Artifact]) -> list[str]:
    """A note on each artifact larger than the user's own model file (an ONNX or IR source): the "x FP32" figures
    compare it with the FP32 model in its own format, which can itself be larger (basic-pitch's 225 KiB ONNX
    file is a 350 KiB FP32 IR, whose XML holds tf2onnx's long names)."""
    if source.kind not in ("onnx", "openvino"):
        return []
    given = sum(artifact_files(source.path).values())
    return [f"the {a.format} artifact ({a.bytes} B) is {a.bytes / given:.2f}x the size of the source file "
            f"{source.path.name} ({given} B): its ratio to FP32 is to the FP32 model in its own format"
            for a in artifacts if a.bytes > given]


def _outputs_as_computed(graph, feeds: dict) -> list[str]:
    """Notes on the outputs of an ONNX source's float artifact whose declared shape its graph does not compute,
    dropped (``edgeopt.onnx_prep.outputs_as_computed``; INT8 drops them as it normalises): ONNX Runtime warns on
    every run of such a file and refuses to bind its outputs."""
    from edgeopt.onnx_prep import outputs_as_computed

    return [f"onnx: {what}: its declared shape dropped" for what in outputs_as_computed(graph, feeds)]


def _write_reproducing_recipe(path: Path, recipe: Recipe, found: dict[str, dict]) -> None:
    """The recipe that redoes this run in one pass: each searching step replaced by the step it found."""
    steps = [found.get(step.name, {"name": step.name, **step.params}) for step in recipe.steps]
    atomic.write_text(path, recipe_toml(steps, f"Reproduces the OpenVINO IR of {recipe.describe()} without its "
                                               f"search:\nedgeopt compress ... --format openvino --recipe recipe.toml"))


def _write_repair_page(path: Path, repair: dict) -> None:
    from edgeopt.reporting import html, plots

    atomic.write_text(path, html.render_repair(repair, plots.worst_layers(repair)))


def _copy_graph(name: str, model):
    if name == "openvino":
        return model.clone()
    if name != "onnx":
        return model
    import onnx

    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _evaluate(result: CompressResult, source: SourceModel, evaluation: SampleSet) -> None:
    """Measure the original in its own framework, then each artifact in its runtime, and apply the gate."""
    original = original_predictor(source, result.eval_settings)
    reference = all_outputs(original, evaluation, source.output_names)
    token_ids = language_model_ids(original, evaluation)
    gated = result.gate.outputs
    result.reference = measure_outputs("original", reference, evaluation.labels, None, gated=gated,
                                       metric=result.gate.metric, targets=evaluation.targets)
    if evaluation.labels is not None and result.reference.top1_output is None and result.gate.metric is None:
        outputs = ", ".join(f"{name} {list(shape)}" for name, shape in zip(reference.names, reference.shapes)
                            if not gated or name in gated)
        result.notes.append(f"labels in {evaluation.source} not scored: no {'gated ' if gated else ''}output gives "
                            f"one score per class ({outputs}); the gate compares outputs with the original's")
    for artifact in result.artifacts:
        outputs = all_outputs(session_predictor(artifact.path, result.settings_for(artifact.runtime)), evaluation,
                              reference.names)
        if len(outputs.values) != len(reference.values):
            raise RuntimeError(f"{artifact.path.name} has {len(outputs.values)} outputs, the original "
                                f"{len(reference.values)}")
        quality = measure_outputs(artifact.format, outputs, evaluation.labels, reference, gated=gated,
                                  token_ids=token_ids, metric=result.gate.metric, targets=evaluation.targets)
        result.qualities[artifact.format] = quality
        result.gate_results[artifact.format] = result.gate.check(result.reference, quality)


IN_SAMPLE = 16  # calibration samples an ungated artifact is compared with the original on


def _in_sample_check(result: CompressResult, source: SourceModel, calibration: SampleSet) -> None:
    """Without evaluation data or a golden set nothing gates the artifacts; still, each is compared with the
    original on the first ``IN_SAMPLE`` calibration samples (worst gated output's mean cosine), so that an artifact
    that breaks the model does not pass unseen (resemblyzer's LSTM encoder: an ONNX file at 0.71 exited 0 with
    "quality not gated"). Calibration samples flatter it: a figure, never a pass."""
    from edgeopt.evaluate import compare_outputs

    samples = calibration.take(IN_SAMPLE)
    reference = all_outputs(original_predictor(source, result.eval_settings), samples, source.output_names)
    gated = [i for i, name in enumerate(reference.names) if not result.gate.outputs or name in result.gate.outputs]
    for artifact in result.artifacts:
        outputs = all_outputs(session_predictor(artifact.path, result.settings_for(artifact.runtime)), samples,
                              reference.names)
        result.in_sample_cosine[artifact.format] = round(min(
            compare_outputs(outputs.values[i], reference.values[i]).cosine for i in gated), 6)
    figures = ", ".join(f"{fmt} {cos:.4f}" for fmt, cos in result.in_sample_cosine.items())
    result.notes.append(f"quality not gated: no evaluation data (--eval) or golden set (--golden) (report "
                        f"quality.passed is null); on {len(samples)} calibration samples, which flatter it, the worst "
                        f"output's cosine to the original reads {figures}")


def _check_golden(result: CompressResult, golden: GoldenSet) -> None:
    """Each artifact against the golden set (as evaluated: f32 pinned); a regression fails its gate."""
    from edgeopt.golden import check_golden

    metric = result.gate.metric if result.gate.metric is not None and golden.metric is not None else None
    for artifact in result.artifacts:
        checked = check_golden(golden, artifact.path, result.settings_for(artifact.runtime), metric)
        result.golden[artifact.format] = checked
        ok, message = result.gate_results.get(artifact.format, (True, ""))
        summary = checked.message() if not checked.passed else f"golden set: passed ({checked.samples} samples)"
        result.gate_results[artifact.format] = (ok and checked.passed, "; ".join(m for m in (message, summary) if m))


def _check_gated_outputs(source: SourceModel, gate: QualityGate) -> None:
    unknown = [name for name in gate.outputs if name not in source.output_names]
    if unknown and source.output_names:
        raise BadInputError(f"--outputs names unknown output(s) {', '.join(unknown)}; the model's outputs are "
                            f"{', '.join(source.output_names)}")


class _Timer:
    """Accumulates wall-clock seconds per named stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)
