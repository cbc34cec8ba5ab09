"""Graph pass ``weights``: weight-only compression (INT8, INT4, mixed INT4/INT8) with ``nncf.compress_weights``.

Activations stay in floating point; MatMul/Conv/Gather weights become INT8 (per channel) or INT4 (per group of
``group_size`` input channels) with FP16 scales. ``mode="auto"`` picks per model and device profile
(``default_weight_compression``). Runs on the OpenVINO model and, when ONNX output is wanted, on the ONNX model
(NNCF's ONNX backend writes INT8 as DequantizeLinear, put in the form ONNX Runtime runs fastest by
``fold_weight_dequantize``: a MatMul's fused into an 8-bit MatMulNBits, which at ONNX Runtime's default accuracy
level 4 quantizes its activation to int8 per block of 32 inside the kernel (about 1% relative error), the others
folded to float at load; and INT4 as ONNX Runtime's MatMulNBits; INT4 asym is refused for ONNX because ONNX
Runtime rejects the zero points NNCF writes for it, and GPTQ because NNCF's ONNX backend lacks it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from typing import Literal

from edgeopt.errors import BadInputError, first_line
from edgeopt.model_type import detect_model_type
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.registry import GRAPH, register

MODES = ("int8_sym", "int8_asym", "int4_sym", "int4_asym")
SENSITIVITY = ("weight_quantization_error", "hessian_input_activation", "mean_activation_variance",
               "max_activation_variance", "mean_activation_magnitude")
DATA_SENSITIVITY = SENSITIVITY[1:]  # these need calibration data
BACKUP = ("none", "int8_sym", "int8_asym")
GROUP_FALLBACK = ("error", "ignore", "adjust")
FORMAT_NAMES = {"openvino": "OpenVINO", "onnx": "ONNX"}

# A device is memory-tight when it has at most this much RAM, or when INT8 weights would take more than this
# share of its smallest memory budget (file size or peak RSS).
TIGHT_DEVICE_MB = 4096
TIGHT_BUDGET_SHARE = 0.25
TIGHT_DEFAULTS = {"mode": "int4_sym", "group_size": 128, "ratio": 0.8}  # sym: ONNX Runtime loads it too
ROOMY_DEFAULTS = {"mode": "int8_asym"}


@dataclass(frozen=True)
class WeightChoice:
    """Parameters ``mode="auto"`` resolved to, and why (recorded in the report)."""

    params: dict
    reason: str


def default_weight_compression(target, ov_model) -> WeightChoice:
    """INT4 (group 128, ratio 0.8) for transformers on memory-tight targets, INT8 weights otherwise."""
    from edgeopt.weight_bytes import openvino_weight_bytes

    if not detect_model_type(ov_model=ov_model).is_transformer:
        return WeightChoice(dict(ROOMY_DEFAULTS), "not a transformer (no attention in the graph): INT8 weights")
    if target is None:
        return WeightChoice(dict(ROOMY_DEFAULTS), "transformer, no target profile: INT8 weights")
    int8_mb = openvino_weight_bytes(ov_model).total / 4 / 1e6
    budgets = [b for b in (target.budgets.max_file_mb, target.budgets.max_peak_rss_mb) if b]
    tight = []
    if target.device.memory_mb <= TIGHT_DEVICE_MB:
        tight.append(f"{target.device.memory_mb} MB RAM ≤ {TIGHT_DEVICE_MB} MB")
    if budgets and int8_mb > TIGHT_BUDGET_SHARE * min(budgets):
        tight.append(f"INT8 weights {int8_mb:.1f} MB > {TIGHT_BUDGET_SHARE:.0%} of the {min(budgets):g} MB budget")
    if tight:
        return WeightChoice(dict(TIGHT_DEFAULTS), f"transformer on memory-tight target {target.name} "
                            f"({'; '.join(tight)}): INT4 group 128, ratio 0.8 (rest INT8)")
    return WeightChoice(dict(ROOMY_DEFAULTS), f"transformer on target {target.name} with room "
                        f"({target.device.memory_mb} MB RAM): INT8 weights")


@dataclass(frozen=True)
class WeightsConfig(StepConfig):
    """``mode="auto"`` resolves per model and target (``default_weight_compression``); ``target`` names a
    profile for that choice when the run has none (``--target``)."""

    mode: Literal[("auto", *MODES)] = "auto"  # type: ignore[valid-type]
    group_size: int | None = None
    ratio: float | None = number(None, "(0, 1]")
    sensitivity_metric: Literal[SENSITIVITY] | None = None  # type: ignore[valid-type]
    awq: bool = False
    scale_estimation: bool = False
    gptq: bool = False
    all_layers: bool = False
    backup_mode: Literal[BACKUP] | None = None  # type: ignore[valid-type]
    subset_size: int = number(128, "[1, inf)")
    group_fallback: Literal[GROUP_FALLBACK] = "error"  # type: ignore[valid-type]
    target: str | None = None

    def check(self) -> None:
        if self.group_size is not None and self.group_size < 1 and self.group_size != -1:
            raise self.error(f"group_size must be a positive integer or -1 (per channel), got {self.group_size!r}")
        if self.target is not None:
            if self.mode != "auto":
                raise self.error("'target' only applies to mode=auto")
            from edgeopt.targets import load_target

            load_target(self.target)
        if self.mode != "auto":
            _check(self.mode, self.group_size, self.ratio, self.sensitivity_metric, self.data_aware,
                   self.backup_mode)

    @property
    def data_aware(self) -> list[str]:
        return [name for name in ("awq", "scale_estimation", "gptq") if getattr(self, name)]


@register("weights", WeightsConfig, stage=GRAPH, formats=("openvino", "onnx"), sets_precision=True,
          summary="weight-only INT8/INT4/mixed compression (nncf.compress_weights); mode=auto picks per target")
def weights(model: WorkingModel, ctx: PassContext, config: WeightsConfig) -> None:
    mode, group_size, ratio = config.mode, config.group_size, config.ratio
    sensitivity_metric, awq, scale_estimation, gptq = (config.sensitivity_metric, config.awq,
                                                       config.scale_estimation, config.gptq)
    all_layers, backup_mode, subset_size = config.all_layers, config.backup_mode, config.subset_size
    group_fallback = config.group_fallback
    reason = None
    if mode == "auto":
        target = ctx.target
        if config.target is not None:
            from edgeopt.targets import load_target

            target = load_target(config.target)
        choice = default_weight_compression(target, model.ov_model)
        reason = choice.reason
        mode = choice.params["mode"]
        group_size = choice.params.get("group_size") if group_size is None else group_size
        ratio = choice.params.get("ratio") if ratio is None else ratio
    data_aware = config.data_aware
    try:
        _check(mode, group_size, ratio, sensitivity_metric, data_aware, backup_mode)
    except BadInputError as exc:
        raise BadInputError(f"{exc} (mode=auto chose {mode}: {reason})" if reason else str(exc)) from None
    if mode == "int4_asym" and "onnx" in model.graphs:
        raise BadInputError("weights: int4_asym cannot be saved as ONNX (NNCF's ONNX backend writes MatMulNBits "
                            "zero points that ONNX Runtime rejects); use int4_sym, or --format openvino")
    if gptq and "onnx" in model.graphs:
        raise BadInputError("weights: NNCF's ONNX backend has no GPTQ; use --format openvino, or awq / "
                            "scale_estimation")
    uses_data = bool(data_aware) or sensitivity_metric in DATA_SENSITIVITY
    if sensitivity_metric is None and mode.startswith("int4"):  # NNCF's own default, made explicit for the report
        sensitivity_metric = "max_activation_variance" if uses_data else "weight_quantization_error"
    kwargs = _nncf_kwargs(mode, group_size, ratio, sensitivity_metric, awq, scale_estimation, gptq, all_layers,
                          backup_mode, group_fallback)
    if uses_data:
        kwargs |= {"dataset": ctx.calibration.to_nncf(), "subset_size": min(subset_size, len(ctx.calibration))}
    skipped: list[str] = []
    if "onnx" in model.graphs:  # Constant-node weights as initializers, opset >= 13 for per-channel scales
        from edgeopt.onnx_prep import normalise

        prepared = normalise(model.graphs["onnx"], optimise=False, simplify=False)
        model.graphs["onnx"] = prepared.model
        skipped += [f"weights (ONNX): {step}" for step in prepared.steps]
    for fmt, graph in model.graphs.items():
        model.graphs[fmt] = _compress(graph, kwargs, FORMAT_NAMES[fmt], skipped)
    if "onnx" in model.graphs:
        from edgeopt.passes.onnx_int8 import quantize_weights
        from edgeopt.passes.onnx_weights_only import fold_weight_dequantize

        cells = quantize_weights(model.graphs["onnx"], [], recurrent=True)
        if cells:  # NNCF leaves LSTM/GRU/RNN weights alone; OpenVINO's CPU plugin runs them only float
            skipped.append(f"weights (ONNX): {cells} recurrent weight(s) (LSTM/GRU/RNN W, R) int8 per row; float in "
                           "the IR (edgeopt.recurrent)")
        folded, requantized = fold_weight_dequantize(model.graphs["onnx"])
        if folded:
            skipped.append(f"weights (ONNX): {len(folded)} int8 weight(s) in the form ONNX Runtime runs fastest: a "
                           "MatMul's behind a DequantizeLinear on its output axis (fused into an 8-bit MatMulNBits), "
                           "the others rebuilt in float by Cast and Mul when the session loads (a DequantizeLinear "
                           "would run on every call)")
        if requantized:
            skipped.append(f"weights (ONNX): {len(requantized)} weight(s) ({', '.join(requantized[:3])}"
                           f"{', ...' if len(requantized) > 3 else ''}) requantized per output channel from the "
                           "values NNCF stored (its scales ran along another axis too, or only along the input one)")
    int4 = mode.startswith("int4")
    mixed = int4 and ((ratio is not None and ratio < 1) or not all_layers)
    rest = "float" if backup_mode == "none" else "int8"
    model.float_weights_fp16 = True
    model.precision = (f"int4/{rest}" if mixed else "int4" if int4 else "int8") + " weights"
    model.notes.append(_describe(mode, group_size, ratio, sensitivity_metric, data_aware, all_layers, backup_mode,
                                 kwargs.get("subset_size") if uses_data else None, reason))
    model.notes.extend(skipped)


def _check(mode, group_size, ratio, sensitivity, data_aware, backup) -> None:
    """Rules between parameters once the mode is known (at parse time, or after ``mode=auto`` resolved)."""
    def bad(message: str) -> BadInputError:
        return BadInputError(f"weights: {message}")

    int4 = mode.startswith("int4")
    if group_size not in (None, -1) and not int4:
        raise bad(f"group_size applies to INT4 modes only ({mode} is per channel)")
    if ratio is not None and ratio < 1 and not int4:
        raise bad(f"ratio < 1 mixes INT4 with a backup precision; {mode} has no INT4 part")
    options = [*data_aware, *(["sensitivity_metric"] if sensitivity else []), *(["backup_mode"] if backup else [])]
    if options and not int4:
        raise bad(f"{', '.join(options)} apply to INT4 modes only ({mode} compresses every weight to INT8)")


def _nncf_kwargs(mode, group_size, ratio, sensitivity, awq, scale_estimation, gptq, all_layers, backup,
                 group_fallback) -> dict:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    kwargs = {"mode": nncf.CompressWeightsMode(mode)}
    if mode.startswith("int4"):  # INT8 modes take none of these: every MatMul/Gather weight becomes INT8
        kwargs |= {"group_size": group_size, "ratio": ratio, "all_layers": all_layers,
                   "sensitivity_metric": nncf.SensitivityMetric(sensitivity),
                   "backup_mode": nncf.BackupMode(backup) if backup else None,
                   "advanced_parameters": AdvancedCompressionParameters(
                       group_size_fallback_mode=GroupSizeFallbackMode(group_fallback))}
        # only switched-on options: NNCF's ONNX backend rejects gptq=False as "not supported"
        kwargs |= {name: True for name, on in (("awq", awq), ("scale_estimation", scale_estimation), ("gptq", gptq))
                   if on}
    return {k: v for k, v in kwargs.items() if v is not None}


def _compress(graph, kwargs: dict, backend: str, notes: list[str]):
    """``nncf.compress_weights``; NNCF's messages that an algorithm was skipped go into ``notes``."""
    import nncf

    try:
        with _nncf_skips() as skipped:
            compressed = nncf.compress_weights(graph, **kwargs)
        notes.extend(f"weights ({backend}): NNCF: {message}" for message in dict.fromkeys(skipped))
        return compressed
    except (nncf.ValidationError, nncf.ParameterNotSupportedError, nncf.UnsupportedModelError,
            nncf.InvalidGroupSizeError, nncf.UnsupportedBackendError) as exc:
        hint = " (use --format openvino to skip the ONNX output)" if backend == "ONNX" else ""
        raise BadInputError(f"weights ({backend}): {first_line(exc)}{hint}") from exc


@contextlib.contextmanager
def _nncf_skips() -> Iterator[list[str]]:
    """Collect NNCF's log messages that say an algorithm was skipped, without printing them."""
    logger = logging.getLogger("nncf")
    found: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "skipped" in record.getMessage():
                found.append(record.getMessage().strip())

    saved = logger.level, logger.handlers[:], logger.propagate
    logger.setLevel(logging.INFO)
    logger.handlers[:] = [Collect()]
    logger.propagate = False
    try:
        yield found
    finally:
        logger.setLevel(saved[0])
        logger.handlers[:] = saved[1]
        logger.propagate = saved[2]


def _describe(mode, group_size, ratio, sensitivity, data_aware, all_layers, backup, subset, reason) -> str:
    parts = [mode]
    if mode.startswith("int4"):
        parts.append(f"group {group_size or 128}" if group_size != -1 else "per channel")
        parts.append(f"ratio {ratio if ratio is not None else 1.0}")
        parts.append(f"sensitivity {sensitivity}")
        parts.append(f"backup {backup or 'int8_asym'}")
    parts.append("all layers" if all_layers else "first embedding and last layer in backup precision"
                 if mode.startswith("int4") else "all MatMul/Conv/Gather weights")
    if data_aware:
        parts.append(f"data-aware {'+'.join(data_aware)} on {subset} calibration samples")
    elif subset:
        parts.append(f"sensitivity on {subset} calibration samples")
    note = "weights: " + ", ".join(parts)
    return note + (f" — auto: {reason}" if reason else "")
