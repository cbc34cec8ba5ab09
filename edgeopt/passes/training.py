"""What the PyTorch passes that fine-tune share: the trainable module, the training set, and the distillation
settings (``FineTuneConfig``: ``epochs`` / ``lr`` / ``temperature`` / ``alpha`` / ``batch_size``)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.distillation import DistillConfig, TrainingSet
from edgeopt.errors import BadInputError
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number


@dataclass(frozen=True)
class FineTuneConfig(StepConfig):
    """The distillation settings of a fine-tuning step; a step overrides the defaults it needs."""

    epochs: int = number(10, "[0, inf)")
    lr: float = number(1e-3, "(0, inf)")
    temperature: float = number(4.0, "(0, inf)")
    alpha: float = number(0.7, "[0, 1]")  # weight of the soft (teacher) loss; 1 - alpha weighs the task loss
    batch_size: int = number(64, "[1, inf)")


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


def distill_config(ctx: PassContext, config: FineTuneConfig) -> DistillConfig:
    """The fine-tuning settings of ``config`` (its fields were range-checked when it was parsed)."""
    return DistillConfig(epochs=config.epochs, lr=float(config.lr), temperature=float(config.temperature),
                         alpha=float(config.alpha), batch_size=config.batch_size, seed=ctx.seed)


def training_set(model: WorkingModel, ctx: PassContext) -> TrainingSet:
    return TrainingSet.from_samples(ctx.train or ctx.calibration, model.source.input_names)


def loss_kind(data: TrainingSet) -> str:
    return "KL + cross-entropy" if data.labels is not None else "output MSE (no labels)"
