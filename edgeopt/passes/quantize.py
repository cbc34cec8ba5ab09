"""Graph passes: INT8 post-training quantization (NNCF) and FP16 weights, on OpenVINO and ONNX models."""

from __future__ import annotations

from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import TRANSFORMER, ModelType, detect_model_type
from edgeopt.passes import PassContext, WorkingModel, register
from edgeopt.passes.smooth_quant import quantize_choosing_smooth_quant, smooth_quant_parameters


@register("int8", stage="graph", summary="INT8 post-training quantization of weights and activations (nncf.quantize)")
def int8(model: WorkingModel, ctx: PassContext, *, preset: str = "auto", subset_size: int = 300,
         fast_bias_correction: bool = True, ignored_scope: list[str] | None = None,
         model_type: str = "auto", smooth_quant_alpha: float | None = None) -> None:
    """``preset = "auto"``: NNCF's choice for the model type (MIXED, asymmetric activations, for transformers;
    PERFORMANCE otherwise). ``model_type = "auto"``: ``edgeopt.model_type`` recognises transformers.
    ``smooth_quant_alpha`` (transformers; -1 turns it off): by default chosen by measurement
    (``edgeopt.passes.smooth_quant``)."""
    import nncf

    presets = {"auto": None, "performance": nncf.QuantizationPreset.PERFORMANCE,
               "mixed": nncf.QuantizationPreset.MIXED}
    if preset not in presets:
        raise BadInputError(f"int8: preset must be one of {', '.join(presets)}")
    if model_type not in ("auto", "transformer", "default"):
        raise BadInputError("int8: model_type must be one of auto, transformer, default")
    kind = (detect_model_type(model.source.model_type, model.ov_model) if model_type == "auto"
            else ModelType(model_type, "set by the recipe"))
    transformer = kind.name == TRANSFORMER
    kwargs = dict(
        preset=presets[preset],
        subset_size=min(subset_size, len(ctx.calibration)),
        fast_bias_correction=fast_bias_correction,
        model_type=kind.nncf(),
        ignored_scope=nncf.IgnoredScope(names=list(ignored_scope), validate=False) if ignored_scope else None,
    )
    dataset = ctx.calibration.to_nncf()
    smooth_quant = ""
    try:
        if transformer and smooth_quant_alpha is None:
            model.ov_model, smooth_quant_alpha, smooth_quant = quantize_choosing_smooth_quant(
                model.ov_model, ctx.calibration.samples,
                lambda m, advanced: nncf.quantize(m, dataset, **kwargs, advanced_parameters=advanced))
            kwargs["advanced_parameters"] = smooth_quant_parameters(smooth_quant_alpha)
        else:
            if transformer:
                kwargs["advanced_parameters"] = smooth_quant_parameters(smooth_quant_alpha)
                smooth_quant = f"SmoothQuant alpha {smooth_quant_alpha} (set by the recipe)"
            model.ov_model = nncf.quantize(model.ov_model, dataset, **kwargs)
        if model.onnx_model is not None:
            model.onnx_model = nncf.quantize(model.onnx_model, dataset, **kwargs)
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8: {first_line(exc)}") from exc
    model.precision = "int8"
    chosen = preset if preset != "auto" else ("mixed" if transformer else "performance")
    smooth_quant = f", {smooth_quant}" if smooth_quant else ""
    model.notes.append(f"int8: preset={chosen}, subset={kwargs['subset_size']} samples, "
                       f"model_type={kind.describe()}{smooth_quant}")


@register("fp16", stage="graph", summary="FP16 weights (OpenVINO IR compressed to FP16, ONNX converted to FP16)")
def fp16(model: WorkingModel, ctx: PassContext) -> None:
    if model.onnx_model is not None:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model.onnx_model = convert_float_to_float16(model.onnx_model, keep_io_types=True)
    model.precision = "fp16"
