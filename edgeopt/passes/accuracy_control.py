"""Accuracy-controlled INT8: ``nncf.quantize_with_accuracy_control`` on the OpenVINO model.

NNCF quantizes, measures the metric on the evaluation set, and reverts the layers that cost the most back to
float until the drop is within ``max_drop``. The metric is top-1 when the evaluation set has labels, otherwise
the mean cosine similarity to the FP32 model's outputs (allowed drop ``1 - min_cosine``).
"""

from __future__ import annotations

import numpy as np

from edgeopt.errors import BadInputError, first_line
from edgeopt.evaluate import compare_outputs
from edgeopt.passes import PassContext, WorkingModel, register


@register("int8_ac", stage="graph",
          summary="INT8 with accuracy control: layers that cost accuracy revert to float "
                  "(nncf.quantize_with_accuracy_control, needs --eval)")
def int8_ac(model: WorkingModel, ctx: PassContext, *, max_drop: float = 0.01, min_cosine: float = 0.99,
            preset: str = "performance", subset_size: int = 300, max_num_iterations: int = 10) -> None:
    import nncf

    if ctx.evaluation is None or len(ctx.evaluation) == 0:
        raise BadInputError("int8_ac: accuracy control needs evaluation data (--eval)")
    if model.onnx_model is not None:
        raise BadInputError("int8_ac: accuracy control runs on the OpenVINO model only; ask for --format openvino")
    presets = {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}
    if preset not in presets:
        raise BadInputError(f"int8_ac: preset must be one of {', '.join(presets)}")
    evaluation = ctx.evaluation
    labels = evaluation.labels
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
        model.ov_model = nncf.quantize_with_accuracy_control(
            model.ov_model, ctx.calibration.to_nncf(), validation, validation_fn=validate, max_drop=allowed,
            drop_type=nncf.DropType.ABSOLUTE, preset=presets[preset],
            subset_size=min(subset_size, len(ctx.calibration)),
            advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
                max_num_iterations=max_num_iterations),
        )
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8_ac: {first_line(exc)}") from exc
    model.precision = "int8"
    model.notes.append(f"int8_ac: {metric} on {len(evaluation)} evaluation samples, max drop {allowed:.4g} "
                       f"(absolute), preset={preset}, at most {max_num_iterations} layers reverted to float")


def _outputs(ov_model, samples: list[dict]) -> np.ndarray:
    """First output of the float model for every sample, computed in f32."""
    import openvino as ov

    compiled = ov.Core().compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.concatenate([np.asarray(compiled(feeds)[compiled.output(0)]).reshape(1, -1) for feeds in samples])
