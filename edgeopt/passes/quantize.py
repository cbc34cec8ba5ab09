"""Graph passes: INT8 post-training quantization (NNCF) and FP16 weights, on OpenVINO and ONNX models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeopt.errors import BadInputError, first_line
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.registry import GRAPH, register

Preset = Literal["performance", "mixed"]


def is_transformer(ov_model) -> bool:
    """Heuristic: attention blocks show up as Softmax fed by MatMul."""
    ops = [op.get_type_name() for op in ov_model.get_ops()]
    return "Softmax" in ops and ops.count("MatMul") >= 2


def nncf_preset(preset: str):
    import nncf

    return {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}[preset]


@dataclass(frozen=True)
class Int8Config(StepConfig):
    preset: Preset = "performance"
    subset_size: int = number(300, "[1, inf)")
    fast_bias_correction: bool = True
    ignored_scope: list[str] | None = None
    model_type: Literal["auto", "transformer", "default"] = "auto"


@register("int8", Int8Config, stage=GRAPH, formats=("openvino", "onnx"), sets_precision=True,
          summary="INT8 post-training quantization of weights and activations (nncf.quantize)")
def int8(model: WorkingModel, ctx: PassContext, config: Int8Config) -> None:
    import nncf

    transformer = is_transformer(model.ov_model) if config.model_type == "auto" else config.model_type == "transformer"
    kwargs = dict(
        preset=nncf_preset(config.preset),
        subset_size=min(config.subset_size, len(ctx.calibration)),
        fast_bias_correction=config.fast_bias_correction,
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
        ignored_scope=(nncf.IgnoredScope(names=list(config.ignored_scope), validate=False)
                       if config.ignored_scope else None),
    )
    dataset = ctx.calibration.to_nncf()
    try:
        for fmt, graph in model.graphs.items():
            model.graphs[fmt] = nncf.quantize(graph, dataset, **kwargs)
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8: {first_line(exc)}") from exc
    model.precision = "int8"
    model.float_weights_fp16 = True
    model.notes.append(f"int8: preset={config.preset}, subset={kwargs['subset_size']} samples, "
                       f"model_type={'transformer' if transformer else 'default'}")


@dataclass(frozen=True)
class Fp16Config(StepConfig):
    pass


@register("fp16", Fp16Config, stage=GRAPH, formats=("openvino", "onnx"), sets_precision=True,
          summary="FP16 weights (OpenVINO IR compressed to FP16, ONNX converted to FP16)")
def fp16(model: WorkingModel, ctx: PassContext, config: Fp16Config) -> None:
    if "onnx" in model.graphs:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model.graphs["onnx"] = convert_float_to_float16(model.graphs["onnx"], keep_io_types=True)
    # OpenVINO: the IR writer stores float constants as FP16 (ov.save_model(compress_to_fp16=True)); the
    # runtime still computes in the inference precision the device settings pin.
    model.float_weights_fp16 = True
    model.precision = "fp16"
