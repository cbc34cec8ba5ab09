"""Torch passes that train: ``distill`` fine-tunes the working model against the original (the teacher);
``qat`` quantizes the PyTorch model with NNCF, fine-tunes it with the same loss, and strips it to native
FakeQuantize modules, which convert to OpenVINO FakeQuantize and ONNX QuantizeLinear/DequantizeLinear.

Training data: ``--train`` when given, else the calibration set.
"""

from __future__ import annotations

from edgeopt.distillation import DistillConfig, TrainingSet, evaluate_loss, fine_tune
from edgeopt.errors import BadInputError, first_line
from edgeopt.passes import PassContext, WorkingModel, register


@register("distill", stage="torch",
          summary="Knowledge distillation fine-tune against the original model (KL + task loss, or MSE)")
def distill(model: WorkingModel, ctx: PassContext, *, epochs: int = 10, lr: float = 1e-3, temperature: float = 4.0,
            alpha: float = 0.7, batch_size: int = 64) -> None:
    student = plain_module(model, "distill")
    config = distill_config(ctx, epochs=epochs, lr=lr, temperature=temperature, alpha=alpha, batch_size=batch_size)
    data = training_set(model, ctx)
    teacher = model.source.torch_module
    before = evaluate_loss(student, teacher, data, config)
    losses = fine_tune(student, teacher, data, config, label="distill", quiet=ctx.quiet)
    after = evaluate_loss(student, teacher, data, config)
    model.notes.append(f"distill: {epochs} epoch(s) on {len(data)} samples ({_loss_kind(data)}, T={temperature:g}, "
                       f"alpha={alpha:g}, lr={lr:g}, seed={ctx.seed}); loss {before:.4f} -> {after:.4f}"
                       + (f" (epoch means {losses[0]:.4f} -> {losses[-1]:.4f})" if losses else ""))


@register("qat", stage="torch",
          summary="Quantization-aware training: nncf.quantize on the PyTorch model, then distillation fine-tune")
def qat(model: WorkingModel, ctx: PassContext, *, epochs: int = 3, lr: float = 1e-5, temperature: float = 4.0,
        alpha: float = 0.7, batch_size: int = 64, preset: str = "performance", subset_size: int = 300) -> None:
    import nncf
    import torch

    student = plain_module(model, "qat")
    presets = {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}
    if preset not in presets:
        raise BadInputError(f"qat: preset must be one of {', '.join(presets)}")
    config = distill_config(ctx, epochs=epochs, lr=lr, temperature=temperature, alpha=alpha, batch_size=batch_size)
    _use_eager_fake_quantize()
    names = model.source.input_names

    def feed(sample: dict):
        tensors = tuple(torch.from_numpy(sample[name]) for name in names)
        return tensors[0] if len(tensors) == 1 else tensors

    dataset = nncf.Dataset(ctx.calibration.samples, feed)
    try:
        quantized = nncf.quantize(student, dataset, preset=presets[preset],
                                  subset_size=min(subset_size, len(ctx.calibration)))
    except nncf.ValidationError as exc:
        raise BadInputError(f"qat: {first_line(exc)}") from exc
    data = training_set(model, ctx)
    teacher = model.source.torch_module
    before = evaluate_loss(quantized, teacher, data, config)
    fine_tune(quantized, teacher, data, config, label="qat", quiet=ctx.quiet)
    after = evaluate_loss(quantized, teacher, data, config)
    model.torch_module = nncf.strip(quantized, do_copy=False, strip_format=nncf.StripFormat.NATIVE,
                                    example_input=model.source.example_input).eval()
    model.precision = "int8"
    model.notes.append(f"qat: nncf.quantize ({preset}, {min(subset_size, len(ctx.calibration))} calibration samples), "
                       f"{epochs} epoch(s) distillation fine-tune on {len(data)} samples; loss {before:.4f} -> "
                       f"{after:.4f}; exported through FakeQuantize (OpenVINO) / QDQ (ONNX)")


def plain_module(model: WorkingModel, step: str):
    """The working model as a trainable ``torch.nn.Module``, or a clear error for archives and non-torch inputs."""
    from torch import nn

    module = model.torch_module
    if module is None:
        raise BadInputError(f"{step}: needs a PyTorch model (file.py:factory); ONNX and OpenVINO IR have no "
                            f"training graph")
    if not isinstance(module, nn.Module) or type(module).__module__.startswith("torch.jit"):
        raise BadInputError(f"{step}: needs a PyTorch nn.Module from file.py:factory (given {type(module).__name__}, "
                            f"which cannot be pruned or trained)")
    return module


def distill_config(ctx: PassContext, **params) -> DistillConfig:
    try:
        return DistillConfig(seed=ctx.seed, **{k: type(getattr(DistillConfig, k))(v) for k, v in params.items()})
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"distillation parameters: {first_line(exc)}") from exc


def training_set(model: WorkingModel, ctx: PassContext) -> TrainingSet:
    return TrainingSet.from_samples(ctx.train or ctx.calibration, model.source.input_names)


def _loss_kind(data: TrainingSet) -> str:
    return "KL + cross-entropy" if data.labels is not None else "output MSE (no labels)"


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
