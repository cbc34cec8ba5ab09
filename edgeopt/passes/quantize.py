"""Graph passes: INT8 post-training quantization (NNCF) and FP16 weights, on OpenVINO and ONNX models."""

from __future__ import annotations

from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import TRANSFORMER, ModelType, detect_model_type
from edgeopt.passes import PassContext, WorkingModel, register
from edgeopt.passes.smooth_quant import quantize_choosing_smooth_quant, smooth_quant_parameters
from edgeopt.passes.onnx_int8 import quantize_onnx


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
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8: {first_line(exc)}") from exc
    except Exception as exc:  # NNCF has no typed error for a graph it cannot handle: name what it said
        raise BadInputError(f"int8: NNCF cannot quantize this model ({unsupported_message(model.ov_model, exc)})") from exc
    model.precision = "int8"
    chosen = preset if preset != "auto" else ("mixed" if transformer else "performance")
    smooth_quant = f", {smooth_quant}" if smooth_quant else ""
    model.notes.append(f"int8: preset={chosen}, subset={kwargs['subset_size']} samples, "
                       f"model_type={kind.describe()}{smooth_quant}")
    if model.onnx_model is not None:
        onnx_options = {k: v for k, v in kwargs.items() if k != "subset_size"}
        picked = quantize_onnx(model.onnx_model, ctx.calibration, subset_size=kwargs["subset_size"],
                               nncf_options=onnx_options)
        model.onnx_model = picked.model
        model.decisions["onnx_int8"] = picked.describe()
        model.notes.append(f"onnx int8: {picked.backend} backend chosen by fusability, measured fidelity, size "
                           f"({', '.join(_summary(c) for c in picked.candidates)}; FP32 p50 {picked.fp32_p50_ms} ms)")


def _summary(built) -> str:
    if built.error:
        return f"{built.backend} failed: {built.error[:80]}"
    return (f"{built.backend}: cos {built.cosine:.4f}, unfused {built.unfused:.0%}, p50 {built.p50_ms} ms, "
            f"{built.bytes} B")


def unsupported_message(ov_model, exc: BaseException) -> str:
    """NNCF's error in one line, naming the node and op type when the message names a node of the model."""
    text = first_line(exc)
    for op in ov_model.get_ops():
        name = op.get_friendly_name()
        if len(name) > 2 and name in str(exc):
            return f"node '{name}' (op {op.get_type_name()}): {text}"
    return text


@register("fp16", stage="graph", summary="FP16 weights (OpenVINO IR compressed to FP16, ONNX converted to FP16)")
def fp16(model: WorkingModel, ctx: PassContext) -> None:
    if model.onnx_model is not None:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model.onnx_model = convert_float_to_float16(model.onnx_model, keep_io_types=True)
    model.precision = "fp16"
