"""Accuracy-controlled INT8: ``nncf.quantize_with_accuracy_control`` on the OpenVINO model.

NNCF quantizes, measures the metric on the evaluation set, and reverts the layers that cost the most back to
float until the drop is within ``max_drop``. The metric is the gate's task metric when it has one (NNCF's
``validation_fn`` computes it on every output and the evaluation targets; its allowed drop, absolute or
relative), else top-1 when the evaluation set has labels, else the mean cosine similarity to the FP32 model's
outputs (allowed drop ``1 - min_cosine``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeopt.errors import BadInputError, first_line
from edgeopt.evaluate import QualityGate, compare_outputs, output_names
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.quantize import Preset, nncf_preset
from edgeopt.passes.registry import GRAPH, register


@dataclass(frozen=True)
class Int8AcConfig(StepConfig):
    """``max_drop`` / ``min_cosine`` left out: the quality gate's values (``--max-drop`` / ``--min-cosine``)."""

    max_drop: float | None = number(None, "[0, 1]")
    min_cosine: float | None = number(None, "[-1, 1]")
    preset: Preset = "performance"
    subset_size: int = number(300, "[1, inf)")
    max_num_iterations: int = number(10, "[1, inf)")


@register("int8_ac", Int8AcConfig, stage=GRAPH, formats=("openvino",), sets_precision=True, needs_eval=True,
          summary="INT8 with accuracy control: layers that cost accuracy revert to float "
                  "(nncf.quantize_with_accuracy_control, needs --eval)")
def int8_ac(model: WorkingModel, ctx: PassContext, config: Int8AcConfig) -> None:
    import nncf

    gate = ctx.gate or QualityGate()
    max_drop = gate.max_drop if config.max_drop is None else config.max_drop
    min_cosine = gate.min_cosine if config.min_cosine is None else config.min_cosine
    preset, subset_size, max_num_iterations = config.preset, config.subset_size, config.max_num_iterations
    evaluation = ctx.evaluation
    labels = evaluation.labels
    drop_type = nncf.DropType.ABSOLUTE
    if gate.metric is not None:
        validate, metric, allowed, relative = _metric_validation(gate, evaluation, model.source.output_names)
        drop_type = nncf.DropType.RELATIVE if relative else drop_type
    else:
        if labels is not None:
            metric, allowed = "top-1", max_drop

            def score(outputs: np.ndarray, indices: list[int]) -> float:
                return float(np.mean(outputs.argmax(axis=1) == labels[indices]))
        else:
            reference = _outputs(model.ov_model, evaluation.samples)
            metric, allowed = "cosine to FP32", 1.0 - min_cosine

            def score(outputs: np.ndarray, indices: list[int]) -> float:
                return compare_outputs(outputs, reference[indices]).cosine

        def validate(compiled, items) -> float:
            items = list(items)
            outputs = np.concatenate([np.asarray(compiled(feeds)[compiled.output(0)]).reshape(1, -1)
                                      for feeds, _ in items])
            return score(outputs, [index for _, index in items])

    validation = nncf.Dataset([(feeds, i) for i, feeds in enumerate(evaluation.samples)], lambda item: item[0])
    try:
        model.graphs["openvino"] = nncf.quantize_with_accuracy_control(
            model.ov_model, ctx.calibration.to_nncf(), validation, validation_fn=validate, max_drop=allowed,
            drop_type=drop_type, preset=nncf_preset(preset),
            subset_size=min(subset_size, len(ctx.calibration)),
            advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
                max_num_iterations=max_num_iterations),
        )
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8_ac: {first_line(exc)}") from exc
    model.precision = "int8"
    model.float_weights_fp16 = True
    kind = "relative" if drop_type == nncf.DropType.RELATIVE else "absolute"
    model.notes.append(f"int8_ac: {metric} on {len(evaluation)} evaluation samples, max drop {allowed:.4g} "
                       f"({kind}), preset={preset}, at most {max_num_iterations} layers reverted to float")


def _metric_validation(gate: QualityGate, evaluation, names: list[str]):
    """NNCF's ``validation_fn`` for the task metric: every output of the compiled model on the items NNCF picks,
    by name, with their targets; NNCF assumes higher is better, so a lower-is-better metric is negated. Also the
    metric's label, its allowed drop for NNCF and whether that drop is relative."""
    from edgeopt.user_metric import evaluate_metric

    spec = gate.metric
    sign = 1.0 if spec.higher_is_better else -1.0
    targets = evaluation.targets

    def validate(compiled, items) -> float:
        items = list(items)
        outputs = []
        for feeds, _ in items:
            result = compiled(feeds)
            values = [np.asarray(result[port]) for port in compiled.outputs]
            outputs.append(dict(zip(output_names(names, len(values)), values)))
        picked = None if targets is None else [targets[index] for _, index in items]
        return sign * evaluate_metric(spec, outputs, picked).value

    relative = spec.max_drop is None
    allowed = spec.max_rel_drop if relative else spec.max_drop
    return validate, f"metric {spec.primary} ({spec.name})", allowed, relative


def _outputs(ov_model, samples: list[dict]) -> np.ndarray:
    """First output of the float model for every sample, computed in f32."""
    import openvino as ov

    compiled = ov.Core().compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.concatenate([np.asarray(compiled(feeds)[compiled.output(0)]).reshape(1, -1) for feeds in samples])
