"""Torch pass ``distill``: fine-tunes the working model against the original (the teacher).

Training data: ``--train`` when given, else the calibration set.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.distillation import evaluate_loss, fine_tune
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.registry import TORCH, register
from edgeopt.passes.training import FineTuneConfig, distill_config, loss_kind, plain_module, training_set


@dataclass(frozen=True)
class DistillStepConfig(FineTuneConfig):
    """The shared fine-tuning settings, at their defaults."""


@register("distill", DistillStepConfig, stage=TORCH,
          summary="Knowledge distillation fine-tune against the original model (KL + task loss, or MSE)")
def distill(model: WorkingModel, ctx: PassContext, config: DistillStepConfig) -> None:
    student = plain_module(model, "distill")
    epochs, temperature, alpha, lr = config.epochs, config.temperature, config.alpha, config.lr
    settings = distill_config(ctx, config)
    data = training_set(model, ctx)
    teacher = model.source.torch_module
    before = evaluate_loss(student, teacher, data, settings)
    losses = fine_tune(student, teacher, data, settings, label="distill", quiet=ctx.quiet)
    after = evaluate_loss(student, teacher, data, settings)
    model.notes.append(f"distill: {epochs} epoch(s) on {len(data)} samples ({loss_kind(data)}, T={temperature:g}, "
                       f"alpha={alpha:g}, lr={lr:g}, seed={ctx.seed}); loss {before:.4f} -> {after:.4f}"
                       + (f" (epoch means {losses[0]:.4f} -> {losses[-1]:.4f})" if losses else ""))
