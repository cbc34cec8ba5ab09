"""Graph passes: INT8 post-training quantization (NNCF) and FP16 weights, on OpenVINO and ONNX models."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import TRANSFORMER, ModelType, detect_model_type, ffn_down_projections
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.closest import quantize_closest
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.onnx_int8 import quantize_onnx
from edgeopt.passes.registry import GRAPH, register
from edgeopt.passes.smooth_quant import quantize_choosing_smooth_quant, smooth_quant_parameters
from edgeopt.presets import SAMPLES as PRESET_SAMPLES
from edgeopt.presets import TOLERANCE as PRESET_TOLERANCE
from edgeopt.presets import PresetChoice, auto_presets
from edgeopt.recurrent import choose_scope, openvino_float_ops
from edgeopt.vs_fp32 import settings_for

Preset = Literal["auto", "performance", "mixed"]
# Fewer calibration samples than this get a word in the note: their activation ranges are noise (PP-OCRv6 tiny's
# recogniser in a new-user trial: ONNX cosine 0.91 calibrated on 1 sample, 0.98 on 64; NNCF's default is 300).
FEW_CALIBRATION_SAMPLES = 16


def nncf_preset(preset: str):
    import nncf

    return {"auto": None, "performance": nncf.QuantizationPreset.PERFORMANCE,
            "mixed": nncf.QuantizationPreset.MIXED}[preset]


@dataclass(frozen=True)
class Int8Config(StepConfig):
    """``preset = "auto"``: NNCF's for the model type (MIXED, asymmetric activations, for transformers;
    PERFORMANCE otherwise), and for a CNN whose activations have a negative tail (SiLU, GELU, PReLU...) both, the
    one closer to FP32 kept (``edgeopt.presets``).
    ``model_type = "auto"``: ``edgeopt.model_type`` recognises transformers.
    ``smooth_quant_alpha`` (transformers; -1 turns it off): by default chosen by measurement
    (``edgeopt.passes.smooth_quant``). ``ffn_down_float`` (transformers): the FFN's second projection, whose
    input carries outlier neurons, stays in float (``edgeopt.model_type.ffn_down_projections``).
    ``recurrent_float``: in a model with LSTM/GRU/RNN cells the IR keeps the cells (whose INT8 form in OpenVINO can
    lose the state) and the element-wise ops float when that measures more faithful read back from the file; ONNX
    quantizes only the compute ops there, the cells' weights int8 (``edgeopt.recurrent``).
    ``onnx_backend``: which quantizer writes the ONNX INT8 model; "auto" builds NNCF's and ONNX Runtime's (its
    static QDQ, ``ort``, and ``ort-conv`` with only the compute ops quantized; instead of them, for a CNN whose
    arithmetic says int8 kernels cannot pay (``edgeopt.onnx_work``), ``weights-only``: int8 weights, float
    compute; for transformers its dynamic
    quantization, ``ort-dynamic``, and where Conv weights are a substantial share ``ort-hybrid``: Convs static,
    MatMuls dynamic) and picks by fusability,
    fidelity and measured speed (``edgeopt.passes.onnx_int8``); naming one reproduces a choice exactly.
    ``ignored_patterns``: regular expressions (matched from the start of a name, as NNCF's ``IgnoredScope``
    matches them) for operations left in float beside ``ignored_scope``'s names: in the IR, its operations'
    names; in the ONNX file, its node names (a front end of 200 tf2onnx nodes is ``"model_1/cq_t2010v2_1/.*"``)."""

    preset: Preset = "auto"
    subset_size: int = number(300, "[1, inf)")
    fast_bias_correction: bool = True
    ignored_scope: list[str] | None = None
    ignored_patterns: list[str] | None = None
    model_type: Literal["auto", "transformer", "default"] = "auto"
    smooth_quant_alpha: float | None = None
    ffn_down_float: bool = True
    recurrent_float: bool = True
    onnx_backend: Literal["auto", "nncf", "ort", "ort-conv", "ort-dynamic", "ort-hybrid", "weights-only"] = "auto"


@register("int8", Int8Config, stage=GRAPH, formats=("openvino", "onnx"), sets_precision=True,
          summary="INT8 post-training quantization of weights and activations (nncf.quantize)")
def int8(model: WorkingModel, ctx: PassContext, config: Int8Config) -> None:
    onnx_nodes = _onnx_nodes(model)
    by_pattern = _matching(config.ignored_patterns or [], model.ov_model, onnx_nodes)
    ov_scope = _scope_in_openvino(model.ov_model, config.ignored_scope or [], {name for name, _ in onnx_nodes})
    ov_scope = list(dict.fromkeys(ov_scope + by_pattern["openvino"]))
    quantized = quantize_openvino(model.ov_model, model.source.model_type, ctx.calibration,
                                  replace(config, ignored_scope=ov_scope or None))
    model.graphs["openvino"] = quantized.model
    model.precision = "int8"
    model.float_weights_fp16 = True
    model.notes.append(f"int8: {quantized.note}")
    if config.ignored_patterns:
        one_sided = [f"{p} matches no {where}" for p in config.ignored_patterns
                     for where, fmt in (("IR operation", "openvino"), ("ONNX node", "onnx"))
                     if not any(re.match(p, name) for name in by_pattern[fmt])]
        model.notes.append(f"int8: ignored_patterns {', '.join(config.ignored_patterns)} keep "
                           f"{len(by_pattern['openvino'])} IR operation(s) and {len(by_pattern['onnx'])} ONNX "
                           f"node(s) in float" + (f" ({'; '.join(one_sided)})" if one_sided else ""))
    model.decisions["int8"] = {"preset": quantized.preset.describe(), "model_type": quantized.kind.name,
                               "normalisations": quantized.kind.normalisations}
    if "onnx" in model.graphs:
        onnx_options = {k: v for k, v in quantized.kwargs.items() if k not in ("subset_size", "ignored_scope")}
        picked = quantize_onnx(model.graphs["onnx"], ctx.calibration, subset_size=quantized.kwargs["subset_size"],
                               nncf_options=onnx_options,
                               ignored=list(dict.fromkeys([*(config.ignored_scope or []), *by_pattern["onnx"]])),
                               transformer=quantized.transformer, ffn_down_float=quantized.ffn_down_float,
                               recurrent_float=config.recurrent_float,
                               backends=None if config.onnx_backend == "auto" else (config.onnx_backend,),
                               held_out=ctx.evaluation, cosine_floor=_cosine_floor(ctx), hint_floor=_hint_floor(ctx),
                               dynamic=_declared_dynamic(model),
                               settings=settings_for("onnxruntime", ctx.target))
        model.graphs["onnx"] = picked.model
        model.decisions["onnx_int8"] = picked.describe()
        model.notes.append(f"onnx int8: {picked.backend} backend, {picked.reason} "
                           f"({', '.join(_summary(c) for c in picked.candidates)}; x FP32 = the median of the "
                           f"per-round ratios to the normalised FP32 graph they are built on (p50 "
                           f"{picked.fp32_p50_ms} ms), which a busy host can set apart from the ratio of the p50s; "
                           f"vs_fp32 compares with the unnormalised one)")


def _scope_in_openvino(ov_model, names: list[str], onnx_names: set[str]) -> list[str]:
    """The OpenVINO operations an ``ignored_scope`` names: the operation of that name, and for a node name of the
    ONNX graph the operations OpenVINO made of it (``NAME/WithoutBiases``, the Convolution of a Conv whose bias
    became the Add ``NAME``). A name found in neither graph is refused (NNCF, told not to validate, would ignore
    it silently)."""
    ops = [op.get_friendly_name() for op in ov_model.get_ops()]
    resolved, unknown = [], []
    for name in names:
        found = [op for op in ops if op == name or name in onnx_names and op.startswith(f"{name}/")]
        resolved += found
        if not found and name not in onnx_names:
            unknown.append(name)
    if unknown:
        raise BadInputError(f"int8 ignored_scope names no operation of the model: {', '.join(unknown)} (names are "
                            f"the ONNX file's node names or the OpenVINO IR's operation names)")
    return list(dict.fromkeys(resolved))


def _onnx_nodes(model: WorkingModel) -> list[tuple[str, str]]:
    """The (name, op type) of each node of the model's ONNX graph (the working one, else an ONNX source file's),
    in its order."""
    graph = model.graphs.get("onnx")
    if graph is None and model.source.kind == "onnx":
        import onnx

        graph = onnx.load(str(model.source.path), load_external_data=False)
    return [(node.name, node.op_type) for node in graph.graph.node] if graph is not None else []


def _matching(patterns: list[str], ov_model, onnx_nodes: list[tuple[str, str]]) -> dict[str, list[str]]:
    """By format, the operations ``patterns`` match (``re.match``, as NNCF's ``IgnoredScope`` does): the IR's
    and the ONNX graph's computing operations (not constants, parameters and results). A pattern that is no
    regular expression, or matches nothing in either, is refused."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise BadInputError(f"int8 ignored_patterns: {pattern!r} is not a regular expression ({exc})") from None
    plumbing = ("Constant", "Parameter", "Result")
    ops = [op.get_friendly_name() for op in ov_model.get_ops() if op.get_type_name() not in plumbing]
    onnx_names = [name for name, op_type in onnx_nodes if op_type not in plumbing]
    found = {"openvino": [n for n in ops if any(p.match(n) for p in compiled)],
             "onnx": [n for n in onnx_names if any(p.match(n) for p in compiled)]}
    idle = [p.pattern for p in compiled if not any(p.match(n) for n in (*ops, *onnx_names))]
    if idle:
        raise BadInputError(f"int8 ignored_patterns match no operation of the model: {', '.join(idle)} (matched "
                            f"from the start of the ONNX file's node names and the OpenVINO IR's operation names)")
    return found


def _declared_dynamic(model: WorkingModel) -> dict[str, list[int]] | None:
    """The input axes the source declares dynamic (``edgeopt.dynamic_axes``; an ONNX file's, a Hugging Face
    folder's), None where it declares none."""
    return model.source.export_axes() or None


def _cosine_floor(ctx: PassContext) -> float | None:
    """The quality gate's cosine when cosine is what it judges the ONNX artifact by: no task metric, and no labels
    unless the cosine judges the labelled output too (``QualityGate.cosine_on_labelled``)."""
    gate, held_out = ctx.gate, ctx.evaluation
    labelled = held_out is not None and held_out.labels is not None
    if gate is None or gate.metric is not None or (labelled and not gate.cosine_on_labelled):
        return None
    return gate.min_cosine


def _hint_floor(ctx: PassContext) -> float | None:
    """The gate's cosine where it judges the ONNX artifact by something else (a task metric, labels), for the
    weights-only hint (:func:`edgeopt.passes.onnx_int8.quantize_onnx`); None without evaluation data."""
    if ctx.gate is None or ctx.evaluation is None or _cosine_floor(ctx) is not None:
        return None
    return ctx.gate.min_cosine


@dataclass
class Quantized:
    model: object  # the INT8 openvino.Model
    kwargs: dict  # what nncf.quantize was given (but the data set and advanced parameters)
    note: str  # preset, subset, model type, SmoothQuant and FFN down-projections kept in float, in words
    transformer: bool
    ffn_down_float: bool  # the FFN down-projections were kept in float (``Int8Config.ffn_down_float``)
    smooth_quant_alpha: float | None = None  # the alpha used on MatMul inputs (transformers; -1: off), chosen or set
    preset: PresetChoice | None = None  # the preset used and why (edgeopt.presets)
    kind: ModelType | None = None  # the model type NNCF was given, and why


def quantize_openvino(ov_model, source_model_type: str | None, calibration, config: Int8Config, *,
                      compress_weights: bool = True) -> Quantized:
    """``nncf.quantize`` of an OpenVINO model as the ``int8`` step configures it. ``compress_weights=False``
    leaves the weights under FakeQuantize (what NNCF's accuracy control edits; ``compress_quantized_weights``
    finishes the model)."""
    import nncf

    kind = (detect_model_type(source_model_type, ov_model) if config.model_type == "auto"
            else ModelType(config.model_type, "set by the recipe"))
    transformer = kind.name == TRANSFORMER
    smooth_quant_alpha = config.smooth_quant_alpha
    ffn_down_float = transformer and config.ffn_down_float
    ffn = ffn_down_projections(ov_model=ov_model) if ffn_down_float else []
    ignored = list(config.ignored_scope or []) + ffn
    float_ops = ([n for n in openvino_float_ops(ov_model) if n not in ignored]
                 if config.recurrent_float and not transformer else [])
    auto = auto_presets(ov_model, transformer) if config.preset == "auto" else None
    preset = (PresetChoice(config.preset, "recipe", "set by the recipe") if auto is None else
              PresetChoice(auto.presets[0], "rule", auto.reason))
    kwargs = dict(
        preset=nncf_preset(preset.name),
        subset_size=min(config.subset_size, len(calibration)),
        fast_bias_correction=config.fast_bias_correction,
        model_type=kind.nncf(),
        ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
    )
    dataset = calibration.to_nncf()

    def advanced(alpha: float | None):
        parameters = smooth_quant_parameters(alpha) if alpha is not None else nncf.AdvancedQuantizationParameters()
        if not compress_weights:
            from nncf.openvino.quantization.backend_parameters import BackendParameters

            parameters.backend_params[BackendParameters.COMPRESS_WEIGHTS] = False
        return parameters

    def scoped(extra: list[str]) -> dict:
        names = ignored + extra
        return dict(kwargs, ignored_scope=nncf.IgnoredScope(names=names, validate=False) if names else None)

    smooth_quant = recurrent = ""
    try:
        if float_ops:
            quantized, kept_float, recurrent = choose_scope(
                ov_model, calibration.samples, float_ops,
                lambda m, extra: nncf.quantize(m, dataset, **scoped(extra), advanced_parameters=advanced(None)))
            kwargs = scoped(kept_float)
        elif transformer and smooth_quant_alpha is None:
            quantized, smooth_quant_alpha, smooth_quant = quantize_choosing_smooth_quant(
                ov_model, calibration.samples,
                lambda m, alpha: nncf.quantize(m, dataset, **kwargs, advanced_parameters=advanced(alpha)))
        elif auto is not None and len(auto.presets) > 1:
            closest = quantize_closest(ov_model, calibration.samples[:PRESET_SAMPLES], {p: p for p in auto.presets},
                                       lambda m, p: nncf.quantize(m, dataset, **dict(kwargs, preset=nncf_preset(p)),
                                                                  advanced_parameters=advanced(None)),
                                       tolerance=PRESET_TOLERANCE)
            quantized = closest.model
            preset = PresetChoice(closest.choice, "measurement", auto.reason, closest.cosines, closest.samples)
            kwargs["preset"] = nncf_preset(preset.name)
        else:
            if transformer:
                smooth_quant = f"SmoothQuant alpha {smooth_quant_alpha} (set by the recipe)"
            quantized = nncf.quantize(ov_model, dataset, **kwargs,
                                      advanced_parameters=advanced(smooth_quant_alpha if transformer else None))
    except nncf.ValidationError as exc:
        raise BadInputError(f"int8: {first_line(exc)}{_branch_hint(ov_model, exc)}") from exc
    except Exception as exc:  # NNCF has no typed error for a graph it cannot handle: name what it said
        raise BadInputError(f"int8: NNCF cannot quantize this model ({unsupported_message(ov_model, exc)})") from exc
    if transformer:
        kwargs["advanced_parameters"] = smooth_quant_parameters(smooth_quant_alpha)
    smooth_quant = f", {smooth_quant}" if smooth_quant else ""
    kept = f", {len(ffn)} FFN down-projection(s) kept in float" if ffn_down_float else ""
    if recurrent:
        kept += f", {recurrent}"
    few = (f" (few: activation ranges from fewer than {FEW_CALIBRATION_SAMPLES} samples are noisy; NNCF's default "
           "subset is 300)" if kwargs["subset_size"] < FEW_CALIBRATION_SAMPLES else "")
    note = (f"preset={preset.note()}, subset={kwargs['subset_size']} samples{few}, model_type={kind.describe()}"
            f"{smooth_quant}{kept}")
    return Quantized(quantized, kwargs, note, transformer, ffn_down_float,
                     smooth_quant_alpha if transformer else None, preset, kind)


def compress_quantized_weights(ov_model) -> None:
    """Store the FakeQuantized weights of a model quantized with ``compress_weights=False`` as INT8 constants
    (what ``nncf.quantize`` does by default), in place."""
    from openvino._offline_transformations import compress_quantize_weights_transformation

    compress_quantize_weights_transformation(ov_model)
    # NNCF records its parameters in the model; record what nncf.quantize would have, so that the int8 step with
    # the same parameters writes the same bytes
    path = ["nncf", "quantization", "advanced_parameters"]
    if ov_model.has_rt_info(path):
        recorded = ov_model.get_rt_info(path).astype(str)
        ov_model.set_rt_info(recorded.replace("'backend_params': {'compress_weights': False}", "'backend_params': {}"),
                             path)


def _summary(built) -> str:
    if built.error:
        return f"{built.backend} failed: {built.error[:160]}" + ("..." if len(built.error) > 160 else "")
    return (f"{built.backend}: cos {built.cosine:.4f}, unfused {built.unfused:.0%}, p50 {built.p50_ms} ms "
            f"({built.p50_ratio}x FP32), {built.bytes} B")


def unsupported_message(ov_model, exc: BaseException) -> str:
    """NNCF's error in one line, naming the node and op type (and the ``If`` whose branch holds it) when the
    message names a node of the model; the longest name found wins (``output`` is in many messages)."""
    text, message = first_line(exc), str(exc)
    found = [(name, op, where) for op, where in _ops_with_branches(ov_model)
             for name in (op.get_friendly_name(),) if len(name) > 2 and name in message]
    if not found:
        return text
    name, op, where = max(found, key=lambda f: len(f[0]))
    return f"node '{name}' (op {op.get_type_name()}{where}): {text}"


def _branch_hint(ov_model, exc: BaseException) -> str:
    """Why NNCF found no calibration data in a model with ``If`` ops: it calibrates each branch on the samples
    that take it, so a branch no calibration sample takes has none."""
    branching = [op.get_friendly_name() for op, _ in _ops_with_branches(ov_model) if op.get_type_name() == "If"]
    if not branching or "must not be empty" not in str(exc):
        return ""
    return (f" (NNCF calibrates each branch of If '{branching[0]}'"
            f"{f' and {len(branching) - 1} more' if len(branching) > 1 else ''} on the samples that take it, and "
            "no calibration sample takes one of them: give samples for every branch, e.g. a rank-0 input "
            "stacked per sample)")


def _ops_with_branches(ov_model, where: str = ""):
    """Every op of ``ov_model`` and of the bodies of its ``If`` ops, with where it sits."""
    for op in ov_model.get_ops():
        yield op, where
        if op.get_type_name() == "If":
            for index, branch in enumerate(("then", "else")):
                yield from _ops_with_branches(op.get_function(index),
                                              f", in the {branch} branch of If '{op.get_friendly_name()}'")


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
