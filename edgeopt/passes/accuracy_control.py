"""Accuracy-controlled INT8: ``nncf.quantize_with_accuracy_control`` on the OpenVINO model.

NNCF quantizes, measures the metric on the evaluation set, and reverts the layers that cost the most back to
float until the drop is within ``max_drop``. The metric follows the quality gate: its task metric when it has
one (NNCF's ``validation_fn`` computes it on every output and the evaluation targets; its allowed drop, absolute
or relative), else top-1 on the labelled output when the evaluation set has labels, else the worst, over the
gated outputs (every output unless the gate names some), of the mean cosine similarity to the FP32 model's
output (allowed drop ``1 - min_cosine``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.errors import BadInputError, first_line
from edgeopt.evaluate import Outputs, QualityGate, all_outputs, compare_outputs, labelled_output
from edgeopt.judge import compiled_predictor, predictor
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.quantize import Preset, nncf_preset
from edgeopt.passes.registry import GRAPH, register
from edgeopt.recurrent import OPENVINO_COMPUTE


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
    drop_type = nncf.DropType.ABSOLUTE
    if gate.metric is not None:
        validate, metric, allowed, relative = _metric_validation(gate, evaluation, model.source.output_names)
        drop_type = nncf.DropType.RELATIVE if relative else drop_type
    else:
        validate, metric, allowed = _output_validation(model.ov_model, gate, evaluation, model.source.output_names,
                                                       max_drop, min_cosine)

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
    floating, total = float_compute_ops(model.graphs["openvino"])
    model.decisions["int8_ac"] = {"float_operations": floating, "compute_operations": total}
    model.notes.append(f"int8_ac: {metric} on {len(evaluation)} evaluation samples, max drop {allowed:.4g} "
                       f"({kind}), preset={preset}, at most {max_num_iterations} layers reverted to float; float "
                       f"after it: {len(floating)} of {total} compute operations"
                       + (f" ({_listed(floating)})" if floating else ""))


def float_compute_ops(ov_model) -> tuple[list[str], int]:
    """Friendly names of ``ov_model``'s compute operations (Convolution, MatMul, ...) that no FakeQuantize feeds
    (directly or through a Convert/Reshape/Transpose: what accuracy control reverted, or NNCF never quantized),
    and how many compute operations it has."""
    compute = [op for op in ov_model.get_ordered_ops() if op.get_type_name() in OPENVINO_COMPUTE]
    return [op.get_friendly_name() for op in compute if not any(_quantized(port) for port in op.inputs())], \
        len(compute)


def _quantized(port) -> bool:
    node = port.get_source_output().get_node()
    while node.get_type_name() in ("Convert", "Reshape", "Transpose") and node.inputs():
        node = node.input(0).get_source_output().get_node()
    return node.get_type_name() in ("FakeQuantize", "FakeConvert")


def _listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _output_validation(ov_model, gate: QualityGate, evaluation, names: list[str], max_drop: float,
                       min_cosine: float):
    """NNCF's ``validation_fn`` without a task metric: top-1 on the labelled output when there are labels, else
    the worst gated output's cosine to the FP32 model's. Also the metric's label and its allowed drop."""
    labels = evaluation.labels
    reference = all_outputs(compiled_predictor(ov_model), evaluation, names)
    labelled = labelled_output(reference, gate.outputs) if labels is not None else None
    gated = [i for i, name in enumerate(reference.names) if not gate.outputs or name in gate.outputs]
    if labelled is not None:
        metric = "top-1" + (f" on output '{labelled}'" if len(reference.names) > 1 else "")
        allowed = max_drop

        def score(outputs: list[np.ndarray], indices: list[int]) -> float:
            return float(np.mean(outputs[reference.index(labelled)].argmax(axis=1) == labels[indices]))
    else:
        scored = len(gated or reference.names)
        metric = "cosine to FP32" + (f" (worst of {scored} outputs)" if scored > 1 else "")
        allowed = 1.0 - min_cosine

        def score(outputs: list[np.ndarray], indices: list[int]) -> float:
            return min(compare_outputs(outputs[i], reference.values[i][indices]).cosine
                       for i in gated or range(len(outputs)))

    def validate(compiled, items) -> float:
        outputs, indices = _picked_outputs(compiled, items, names)
        return score(outputs.values, indices)

    return validate, metric, allowed


def _metric_validation(gate: QualityGate, evaluation, names: list[str]):
    """NNCF's ``validation_fn`` for the task metric: every output of the compiled model on the items NNCF picks,
    by name, with their targets; NNCF assumes higher is better, so a lower-is-better metric is negated. Also the
    metric's label, its allowed drop for NNCF and whether that drop is relative."""
    from edgeopt.user_metric import evaluate_metric

    spec = gate.metric
    sign = 1.0 if spec.higher_is_better else -1.0
    targets = evaluation.targets

    def validate(compiled, items) -> float:
        outputs, indices = _picked_outputs(compiled, items, names)
        picked = None if targets is None else [targets[index] for index in indices]
        return sign * evaluate_metric(spec, outputs.per_sample(), picked).value

    relative = spec.max_drop is None
    allowed = spec.max_rel_drop if relative else spec.max_drop
    return validate, f"metric {spec.primary} ({spec.name})", allowed, relative


def _picked_outputs(compiled, items, names: list[str]) -> tuple[Outputs, list[int]]:
    """Every output of the model NNCF compiled, on the ``(feeds, index)`` items it picks (as the gate collects
    them), and the items' indices into the evaluation set."""
    items = list(items)
    picked = SampleSet([feeds for feeds, _ in items], None, "the items NNCF picked")
    return all_outputs(predictor(compiled), picked, names), [index for _, index in items]
