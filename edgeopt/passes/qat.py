"""Torch pass ``qat``: quantizes the PyTorch model with NNCF, fine-tunes it against the original with the
distillation loss, and strips it to native FakeQuantize modules, which convert to OpenVINO FakeQuantize and ONNX
QuantizeLinear/DequantizeLinear.

Training data: ``--train`` when given, else the calibration set.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.distillation import evaluate_loss, fine_tune
from edgeopt.errors import BadInputError, first_line
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import number
from edgeopt.passes.quantize import Preset, nncf_preset
from edgeopt.passes.registry import TORCH, register
from edgeopt.passes.training import FineTuneConfig, distill_config, plain_module, training_set


@dataclass(frozen=True)
class QatConfig(FineTuneConfig):
    epochs: int = number(3, "[0, inf)")
    lr: float = number(1e-5, "(0, inf)")
    preset: Preset = "performance"
    subset_size: int = number(300, "[1, inf)")


@register("qat", QatConfig, stage=TORCH, sets_precision=True,
          summary="Quantization-aware training: nncf.quantize on the PyTorch model, then distillation fine-tune")
def qat(model: WorkingModel, ctx: PassContext, config: QatConfig) -> None:
    import nncf
    import torch

    student = plain_module(model, "qat")
    epochs, preset, subset_size = config.epochs, config.preset, config.subset_size
    settings = distill_config(ctx, config)
    _use_eager_fake_quantize()
    names = model.source.input_names

    def feed(sample: dict):
        tensors = tuple(torch.from_numpy(sample[name]) for name in names)
        return tensors[0] if len(tensors) == 1 else tensors

    dataset = nncf.Dataset(ctx.calibration.samples, feed)
    try:
        quantized = nncf.quantize(student, dataset, preset=nncf_preset(preset),
                                  subset_size=min(subset_size, len(ctx.calibration)))
    except nncf.ValidationError as exc:
        raise BadInputError(f"qat: {first_line(exc)}") from exc
    data = training_set(model, ctx)
    teacher = model.source.torch_module
    before = evaluate_loss(quantized, teacher, data, settings)
    fine_tune(quantized, teacher, data, settings, label="qat", quiet=ctx.quiet)
    after = evaluate_loss(quantized, teacher, data, settings)
    model.torch_module = nncf.strip(quantized, do_copy=False, strip_format=nncf.StripFormat.NATIVE,
                                    example_input=model.source.example_input).eval()
    model.precision = "int8"
    model.float_weights_fp16 = True
    model.notes.append(f"qat: nncf.quantize ({preset}, {min(subset_size, len(ctx.calibration))} calibration samples), "
                       f"{epochs} epoch(s) distillation fine-tune on {len(data)} samples; loss {before:.4f} -> "
                       f"{after:.4f}; exported through FakeQuantize (OpenVINO) / QDQ (ONNX)")


def _use_eager_fake_quantize() -> None:
    """Run NNCF's fake-quantize ops as its pure-torch reference kernels, eagerly.

    NNCF otherwise builds a C++ extension at first use (minutes on a small CPU, and a timeout error when it is
    slower than 60 s) or falls back to ``torch.compile`` of the same reference code; eager is quick to start and
    fast enough for the small models edgeopt fine-tunes on a CPU.
    """
    from nncf.torch.quantization.extensions import QuantizedFunctionsCPU
    from nncf.torch.quantization.reference import ReferenceBackendType, ReferenceQuantize

    executor = ReferenceQuantize(backend_type=ReferenceBackendType.TORCH)

    class EagerFunctions:
        Quantize_forward = staticmethod(executor.forward)
        Quantize_backward = staticmethod(executor.backward)

    if QuantizedFunctionsCPU._loaded_namespace is None:
        QuantizedFunctionsCPU._loaded_namespace = EagerFunctions
