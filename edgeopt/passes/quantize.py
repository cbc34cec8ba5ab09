"""Graph passes: INT8 post-training quantization (NNCF) and FP16 weights, on OpenVINO and ONNX models."""

from __future__ import annotations

from edgeopt.errors import BadInputError, first_line
from edgeopt.passes import PassContext, WorkingModel, register


def is_transformer(ov_model) -> bool:
    """Heuristic: attention blocks show up as Softmax fed by MatMul."""
    ops = [op.get_type_name() for op in ov_model.get_ops()]
    return "Softmax" in ops and ops.count("MatMul") >= 2


@register("int8", stage="graph", summary="INT8 post-training quantization of weights and activations (nncf.quantize)")
def int8(model: WorkingModel, ctx: PassContext, *, preset: str = "performance", subset_size: int = 300,
         fast_bias_correction: bool = True, ignored_scope: list[str] | None = None,
         model_type: str = "auto") -> None:
    import nncf

    presets = {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}
    if preset not in presets:
        raise BadInputError(f"int8: preset must be one of {', '.join(presets)}")
    transformer = is_transformer(model.ov_model) if model_type == "auto" else model_type == "transformer"
    kwargs = dict(
        preset=presets[preset],
        subset_size=min(subset_size, len(ctx.calibration)),
        fast_bias_correction=fast_bias_correction,
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
        ignored_scope=nncf.IgnoredScope(names=list(ignored_scope), validate=False) if ignored_scope else None,
    )
    dataset = ctx.calibration.to_nncf()
    try:
        model.ov_model = nncf.quantize(model.ov_model, dataset, **kwargs)
        if model.onnx_model is not None:
            model.onnx_model = nncf.quantize(model.onnx_model, dataset, **kwargs)
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8: {first_line(exc)}") from exc
    model.precision = "int8"
    model.notes.append(f"int8: preset={preset}, subset={kwargs['subset_size']} samples, "
                       f"model_type={'transformer' if transformer else 'default'}")


@register("fp16", stage="graph", summary="FP16 weights (OpenVINO IR compressed to FP16, ONNX converted to FP16)")
def fp16(model: WorkingModel, ctx: PassContext) -> None:
    if model.onnx_model is not None:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model.onnx_model = convert_float_to_float16(model.onnx_model, keep_io_types=True)
    model.precision = "fp16"
