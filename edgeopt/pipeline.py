"""The compress pipeline, top to bottom: load → torch passes → convert → graph passes → save → evaluate."""

from __future__ import annotations

import contextlib
import copy
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgeopt import atomic, jsonio
from edgeopt.data import SampleSet, load_samples
from edgeopt.device.host import host_info
from edgeopt.device.runtime import RuntimeSettings
from edgeopt.errors import BadInputError
from edgeopt.evaluate import (Quality, QualityGate, first_outputs, language_model_ids, measure_quality,
                              session_predictor, torch_predictor)
from edgeopt.export import Artifact, save_artifacts, write_ir
from edgeopt.passes import PassContext, WorkingModel, get_pass, run_step
from edgeopt.provenance import describe_inputs
from edgeopt.recipe import Recipe, parse_recipe
from edgeopt.source import SourceModel, load_model, to_onnx, to_openvino
from edgeopt.step_report import StepRecorder, StepReport
from edgeopt.versions import tool_versions
from edgeopt.weight_bytes import WeightBytes, artifact_weight_bytes, openvino_weight_bytes

EVAL_SETTINGS = RuntimeSettings(inference_precision="f32", threads=None)


@dataclass
class CompressResult:
    out: Path
    recipe: Recipe
    artifacts: list[Artifact]
    reference: Quality | None = None
    qualities: dict[str, Quality] = field(default_factory=dict)
    gate: QualityGate = field(default_factory=QualityGate)
    gate_results: dict[str, tuple[bool, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    eval_settings: RuntimeSettings = EVAL_SETTINGS
    fp32_ir_bytes: int | None = None  # size of the original model as FP32 OpenVINO IR, for size ratios
    fp32_weight_bytes: WeightBytes | None = None  # weight constants of the FP32 OpenVINO model
    weight_bytes: dict[str, WeightBytes] = field(default_factory=dict)  # per artifact format, as saved
    steps: StepReport | None = None  # figures after each recipe step
    inputs: dict | None = None  # what it was built from (``provenance.describe_inputs``)

    def settings_for(self, runtime: str) -> RuntimeSettings:
        """How artifacts of ``runtime`` are run for evaluation (ONNX Runtime has no precision or hint)."""
        if runtime == "openvino":
            return self.eval_settings
        return RuntimeSettings(runtime=runtime, inference_precision=None, performance_hint=None)

    @property
    def quality_passed(self) -> bool:
        return all(ok for ok, _ in self.gate_results.values())

    def describe(self) -> dict:
        return {
            "recipe": self.recipe.describe(),
            "recipe_steps": [{"name": s.name, "params": s.params} for s in self.recipe.steps],
            "notes": self.notes,
            "artifacts": [a.describe(relative_to=self.out) for a in self.artifacts],
            "fp32_ir_bytes": self.fp32_ir_bytes,
            "weight_bytes": {"fp32_openvino": self.fp32_weight_bytes.describe() if self.fp32_weight_bytes else None,
                             **{k: v.describe() for k, v in self.weight_bytes.items()}},
            "quality": {
                "evaluated_with": {a.format: self.settings_for(a.runtime).describe() for a in self.artifacts},
                "gate": {"max_top1_drop": self.gate.max_drop, "min_cosine": self.gate.min_cosine,
                         "language_model": {"min_token_agreement": self.gate.min_token_agreement,
                                            "max_perplexity_ratio": self.gate.max_perplexity_ratio}},
                "original": self.reference.describe() if self.reference else None,
                "artifacts": {k: {**q.describe(), "passed": self.gate_results[k][0], "check": self.gate_results[k][1]}
                              for k, q in self.qualities.items()},
                "passed": self.quality_passed,
            },
            "host": host_info().describe(),
            "versions": tool_versions(),
            "inputs": self.inputs,
            "steps": self.steps.describe() if self.steps else None,
        }


def compress(model: str | Path, calibration: str | Path, *, out: str | Path, recipe: str | Recipe = "int8",
             formats: tuple[str, ...] = ("openvino", "onnx"), eval_data: str | Path | None = None,
             gate: QualityGate | None = None, input_shapes: dict | None = None, seed: int = 0,
             eval_settings: RuntimeSettings = EVAL_SETTINGS, train_data: str | Path | None = None,
             step_report: bool | None = None, quiet: bool = False) -> CompressResult:
    """Compress ``model`` with ``recipe`` and write the artifacts to ``out`` atomically.

    The quality gate's verdict is in the result (``quality_passed``); callers decide what a failure means.
    ``train_data`` feeds the torch steps that fine-tune (default: the calibration set). ``step_report`` measures
    the model after every step (default: when the recipe has a PyTorch step).
    """
    timer = _Timer()
    recipe = recipe if isinstance(recipe, Recipe) else parse_recipe(recipe)
    gate = gate or QualityGate()
    with timer("load"):
        source = load_model(model, input_shapes)
        calib = load_samples(calibration, source.inputs)
        evaluation = load_samples(eval_data, source.inputs) if eval_data else None
        train = load_samples(train_data, source.inputs) if train_data else None
        inputs = describe_inputs(model, source, {
            "calibration": (calibration, calib),
            "evaluation": (eval_data, evaluation) if evaluation is not None else None,
            "training": (train_data, train) if train is not None else None})
    if step_report is None:
        step_report = any(get_pass(s.name).stage == "torch" for s in recipe.steps)
    recorder = StepRecorder(source, evaluation or calib) if step_report else None
    try:
        return _compress(source, recipe, calib, evaluation, train, Path(out), formats, gate, seed, eval_settings,
                         quiet, recorder, timer, inputs)
    finally:
        if recorder:
            recorder.close()


def _compress(source, recipe, calib, evaluation, train, out, formats, gate, seed, eval_settings, quiet, recorder,
              timer, inputs) -> CompressResult:
    working, fp32_ir_bytes, fp32_weights = _run_recipe(source, recipe, calib, formats, seed, timer, evaluation,
                                                       train=train, quiet=quiet, observe=recorder)
    with atomic.atomic_dir(out) as tmp:
        with timer("save"):
            artifacts = save_artifacts(working, tmp, formats)
        result = CompressResult(tmp, recipe, artifacts, gate=gate, notes=working.notes, seconds=timer.seconds,
                                eval_settings=eval_settings, fp32_ir_bytes=fp32_ir_bytes,
                                fp32_weight_bytes=fp32_weights,
                                weight_bytes={a.format: artifact_weight_bytes(a.path) for a in artifacts},
                                steps=recorder.finish() if recorder else None, inputs=inputs)
        if evaluation is not None:
            with timer("evaluate"):
                _evaluate(result, source, evaluation)
        atomic.write_text(tmp / "report.json", jsonio.dumps(result.describe() | {"seconds": timer.seconds}, indent=2))
    result.out, result.artifacts = out, [a.moved_to(out) for a in artifacts]
    return result


def _run_recipe(source: SourceModel, recipe: Recipe, calib: SampleSet, formats: tuple[str, ...], seed: int,
                timer: "_Timer", evaluation: SampleSet | None = None, *, train: SampleSet | None = None,
                quiet: bool = False, observe: StepRecorder | None = None) -> tuple[WorkingModel, int, WeightBytes]:
    """Run torch steps, convert, run graph steps; also return the original model's FP32 IR size and weight
    bytes."""
    torch_steps = [s for s in recipe.steps if get_pass(s.name).stage == "torch"]
    graph_steps = [s for s in recipe.steps if get_pass(s.name).stage == "graph"]
    if torch_steps and source.kind != "torch":
        raise BadInputError(f"{source.path}: {', '.join(s.name for s in torch_steps)} need(s) a PyTorch model "
                            f"(given {source.kind}); ONNX and OpenVINO IR have no training graph")
    first_graph = min((recipe.steps.index(s) for s in graph_steps), default=len(recipe.steps))
    if any(recipe.steps.index(s) > first_graph for s in torch_steps):
        raise BadInputError(f"recipe '{recipe.describe()}': PyTorch steps must come before graph steps")
    if "qat" in recipe.names and graph_steps:
        raise BadInputError(f"recipe '{recipe.describe()}': qat already quantizes the model to INT8; drop "
                            f"{', '.join(s.name for s in graph_steps)} after it")
    ctx = PassContext(calibration=calib, seed=seed, evaluation=evaluation, train=train, quiet=quiet)
    working = WorkingModel(source, torch_module=copy.deepcopy(source.torch_module) if source.kind == "torch" else None)
    observe = observe or (lambda label, model: None)
    with timer("step report"):
        observe("original", working)
    for step in torch_steps:
        with timer(step.name):
            run_step(step, working, ctx)
        with timer("step report"):
            observe(step.describe(), working)
    with timer("convert"):
        if source.kind == "torch":
            working.ov_model = to_openvino(working.torch_module, source.example_input, source.input_names)
            if "onnx" in formats:
                working.onnx_model = to_onnx(working.torch_module, source.example_input, source.input_names)
        else:
            working.ov_model = source.openvino_model()
            if "onnx" in formats:
                working.onnx_model = source.onnx_model()
    # Size baselines are the original model's, not the model after pruning.
    original_ov = working.ov_model if not torch_steps else to_openvino(source.torch_module, source.example_input,
                                                                       source.input_names)
    fp32_ir_bytes = ir_bytes(original_ov, compress_to_fp16=False)
    fp32_weights = openvino_weight_bytes(original_ov)
    for step in graph_steps:
        with timer(step.name):
            run_step(step, working, ctx)
        with timer("step report"):
            observe(step.describe(), working)
    return working, fp32_ir_bytes, fp32_weights


def _evaluate(result: CompressResult, source: SourceModel, evaluation: SampleSet) -> None:
    """Measure the original in its own framework, then each artifact in its runtime, and apply the gate."""
    original = _original_predictor(source, result.eval_settings)
    reference_outputs = first_outputs(original, evaluation)
    token_ids = language_model_ids(original, evaluation)
    result.reference = measure_quality("original", reference_outputs, evaluation.labels, None)
    for artifact in result.artifacts:
        outputs = first_outputs(session_predictor(artifact.path, result.settings_for(artifact.runtime)), evaluation)
        quality = measure_quality(artifact.format, outputs, evaluation.labels, reference_outputs, token_ids)
        result.qualities[artifact.format] = quality
        result.gate_results[artifact.format] = result.gate.check(result.reference, quality)


def ir_bytes(ov_model, compress_to_fp16: bool) -> int:
    """Size on disk of ``ov_model`` saved as IR (.xml + .bin)."""
    with tempfile.TemporaryDirectory() as tmp:
        return write_ir(ov_model, Path(tmp) / "model.xml", compress_to_fp16)


def _original_predictor(source: SourceModel, settings: RuntimeSettings):
    if source.kind == "torch":
        return torch_predictor(source.torch_module, source.input_names)
    if source.kind == "onnx":
        return session_predictor(source.path, RuntimeSettings(runtime="onnxruntime"))
    return session_predictor(source.path, settings)


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
