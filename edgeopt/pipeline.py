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
from edgeopt.evaluate import (Quality, QualityGate, all_outputs, language_model_ids, measure_outputs,
                              session_predictor, torch_predictor)
from edgeopt.export import Artifact, save_artifacts, write_ir
from edgeopt.passes import PassContext, WorkingModel, get_pass, run_step
from edgeopt.provenance import describe_inputs
from edgeopt.recipe import Recipe, parse_recipe
from edgeopt.source import SourceModel, load_model, to_onnx, to_openvino
from edgeopt.step_report import StepRecorder, StepReport
from edgeopt.versions import tool_versions
from edgeopt.vs_fp32 import VsFp32
from edgeopt.vs_fp32 import compare as compare_with_fp32
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
    decisions: dict = field(default_factory=dict)  # measured choices passes made (e.g. the ONNX INT8 backend)
    vs_fp32: dict[str, VsFp32] = field(default_factory=dict)  # per format: size and p50 against FP32

    @property
    def flagged(self) -> dict[str, list[str]]:
        """Artifacts larger or slower than the FP32 model in the same format and runtime."""
        return {fmt: v.flags for fmt, v in self.vs_fp32.items() if v.flags}

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
                         "outputs": list(self.gate.outputs) or "all",
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
            "decisions": self.decisions,
            "vs_fp32": {fmt: v.describe() for fmt, v in self.vs_fp32.items()},
            "flagged": self.flagged,
        }


def compress(model: str | Path, calibration: str | Path, *, out: str | Path, recipe: str | Recipe = "int8",
             formats: tuple[str, ...] = ("openvino", "onnx"), eval_data: str | Path | None = None,
             gate: QualityGate | None = None, input_shapes: dict | None = None, seed: int = 0,
             eval_settings: RuntimeSettings = EVAL_SETTINGS, train_data: str | Path | None = None,
             step_report: bool | None = None, quiet: bool = False, batch_axes: dict | None = None,
             task: str | None = None) -> CompressResult:
    """Compress ``model`` with ``recipe`` and write the artifacts to ``out`` atomically.

    The quality gate's verdict is in the result (``quality_passed``); callers decide what a failure means.
    ``train_data`` feeds the torch steps that fine-tune (default: the calibration set). ``step_report`` measures
    the model after every step (default: when the recipe has a PyTorch step). ``batch_axes`` (by input name) and
    ``task`` (for a Hugging Face model folder) go to ``load_model``.
    """
    timer = _Timer()
    recipe = recipe if isinstance(recipe, Recipe) else parse_recipe(recipe)
    gate = gate or QualityGate()
    with timer("load"):
        source = load_model(model, input_shapes, batch_axes, task)
        _check_gated_outputs(source, gate)
        calib = load_samples(calibration, source.inputs, source.tokenizer)
        evaluation = load_samples(eval_data, source.inputs, source.tokenizer) if eval_data else None
        train = load_samples(train_data, source.inputs, source.tokenizer) if train_data else None
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
    working, baseline, fp32_ir_bytes, fp32_weights = _run_recipe(source, recipe, calib, formats, seed, timer,
                                                                 evaluation, train=train, quiet=quiet,
                                                                 observe=recorder)
    with atomic.atomic_dir(out) as tmp:
        with timer("save"):
            artifacts = save_artifacts(working, tmp, formats)
        result = CompressResult(tmp, recipe, artifacts, gate=gate, notes=working.notes, seconds=timer.seconds,
                                eval_settings=eval_settings, fp32_ir_bytes=fp32_ir_bytes,
                                fp32_weight_bytes=fp32_weights,
                                weight_bytes={a.format: artifact_weight_bytes(a.path) for a in artifacts},
                                steps=recorder.finish() if recorder else None, inputs=inputs,
                                decisions=working.decisions)
        with timer("vs fp32"):
            result.vs_fp32 = compare_with_fp32(artifacts, baseline.ov_model, baseline.onnx_model, calib.samples[0])
        if evaluation is not None:
            with timer("evaluate"):
                _evaluate(result, source, evaluation)
        atomic.write_text(tmp / "report.json", jsonio.dumps(result.describe() | {"seconds": timer.seconds}, indent=2))
    result.out, result.artifacts = out, [a.moved_to(out) for a in artifacts]
    return result


def _run_recipe(source: SourceModel, recipe: Recipe, calib: SampleSet, formats: tuple[str, ...], seed: int,
                timer: "_Timer", evaluation: SampleSet | None = None, *, train: SampleSet | None = None,
                quiet: bool = False, observe: StepRecorder | None = None
                ) -> tuple[WorkingModel, WorkingModel, int, WeightBytes]:
    """Run torch steps, convert, run graph steps; also return the original model as converted (FP32), its FP32 IR
    size and weight bytes."""
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
            working.ov_model = to_openvino(working.torch_module, source.example_input, source.input_names,
                                           source.output_names)
            if "onnx" in formats:
                working.onnx_model = to_onnx(working.torch_module, source.example_input, source.input_names,
                                             source.output_names)
        else:
            working.ov_model = source.openvino_model()
            if "onnx" in formats:
                working.onnx_model = source.onnx_model()
    # Size baselines are the original model's, not the model after pruning.
    original_ov = working.ov_model if not torch_steps else to_openvino(source.torch_module, source.example_input,
                                                                       source.input_names)
    original_onnx = None
    if "onnx" in formats:
        original_onnx = working.onnx_model if not torch_steps else to_onnx(source.torch_module, source.example_input,
                                                                           source.input_names, source.output_names)
    # Some graph passes change the model in place (nncf.compress_weights on OpenVINO): keep copies.
    baseline = WorkingModel(source, ov_model=original_ov.clone(), onnx_model=_copy_onnx(original_onnx))
    fp32_ir_bytes = ir_bytes(original_ov, compress_to_fp16=False)
    fp32_weights = openvino_weight_bytes(original_ov)
    for step in graph_steps:
        with timer(step.name):
            run_step(step, working, ctx)
        with timer("step report"):
            observe(step.describe(), working)
    return working, baseline, fp32_ir_bytes, fp32_weights


def _copy_onnx(model):
    if model is None:
        return None
    import onnx

    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _evaluate(result: CompressResult, source: SourceModel, evaluation: SampleSet) -> None:
    """Measure the original in its own framework, then each artifact in its runtime, and apply the gate."""
    original = _original_predictor(source, result.eval_settings)
    reference = all_outputs(original, evaluation, source.output_names)
    token_ids = language_model_ids(original, evaluation)
    gated = result.gate.outputs
    result.reference = measure_outputs("original", reference, evaluation.labels, None, gated=gated)
    for artifact in result.artifacts:
        outputs = all_outputs(session_predictor(artifact.path, result.settings_for(artifact.runtime)), evaluation,
                              reference.names)
        if len(outputs.values) != len(reference.values):
            raise RuntimeError(f"{artifact.path.name} has {len(outputs.values)} outputs, the original "
                                f"{len(reference.values)}")
        quality = measure_outputs(artifact.format, outputs, evaluation.labels, reference, gated=gated,
                                  token_ids=token_ids)
        result.qualities[artifact.format] = quality
        result.gate_results[artifact.format] = result.gate.check(result.reference, quality)


def _check_gated_outputs(source: SourceModel, gate: QualityGate) -> None:
    unknown = [name for name in gate.outputs if name not in source.output_names]
    if unknown and source.output_names:
        raise BadInputError(f"--outputs names unknown output(s) {', '.join(unknown)}; the model's outputs are "
                            f"{', '.join(source.output_names)}")


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
