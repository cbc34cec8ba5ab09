"""Torch pass ``sparsify``: zeroes single weights (``nncf.prune``), which keeps the dense shapes (smaller only
once compressed, faster only on a runtime that exploits sparsity); fine-tuned against the original with the
distillation loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeopt.distillation import fine_tune
from edgeopt.errors import BadInputError, first_line
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.prune import module_name, modules_named, output_layer
from edgeopt.passes.registry import TORCH, register
from edgeopt.passes.training import distill_config, plain_module, training_set

SPARSITY_MODES = {"local": "UNSTRUCTURED_MAGNITUDE_LOCAL", "global": "UNSTRUCTURED_MAGNITUDE_GLOBAL",
                  "regularization": "UNSTRUCTURED_REGULARIZATION_BASED"}


@dataclass(frozen=True)
class SparsifyConfig(StepConfig):
    ratio: float = number(0.5, "[0, 1)")
    mode: Literal[tuple(SPARSITY_MODES)] = "local"  # type: ignore[valid-type]
    ignored_layers: list[str] | None = None
    epochs: int = number(2, "[0, inf)")
    lr: float = number(1e-4, "(0, inf)")
    temperature: float = number(4.0, "(0, inf)")
    alpha: float = number(0.7, "[0, 1]")
    batch_size: int = number(64, "[1, inf)")
    mask_lr: float = number(0.2, "(0, inf)")

    def check(self) -> None:
        if self.mode == "regularization" and self.epochs < 1:
            raise self.error("regularization-based sparsity learns its masks; give epochs >= 1")


@register("sparsify", SparsifyConfig, stage=TORCH,
          summary="Unstructured weight sparsity (nncf.prune: magnitude local/global or regularization-based)")
def sparsify(model: WorkingModel, ctx: PassContext, config: SparsifyConfig) -> None:
    """Mask ``ratio`` of the weights (magnitude ``local`` per layer or ``global``), or learn the masks with a
    sparsity regulariser (``regularization``, masks trained at ``mask_lr``); fine-tune against the original with
    the distillation loss for ``epochs``, then strip the masks into the weights."""
    import nncf
    from nncf.torch.function_hook.pruning.rb.algo import get_pruned_modules
    from nncf.torch.function_hook.pruning.rb.losses import RBLoss

    ratio, mode, epochs, mask_lr = config.ratio, config.mode, config.epochs, config.mask_lr
    module = plain_module(model, "sparsify")
    example = model.source.example_input
    skip = modules_named(module, config.ignored_layers or [], "ignored_layers") + [output_layer(module, example)]
    weights = [f"{module_name(module, m)}.weight" for m in skip]
    prune_mode = getattr(nncf.PruneMode, SPARSITY_MODES[mode])
    try:
        masked = nncf.prune(module, mode=prune_mode, ratio=None if mode == "regularization" else ratio,
                            ignored_scope=nncf.IgnoredScope(names=weights, validate=False), examples_inputs=example)
    except nncf.ValidationError as exc:
        raise BadInputError(f"sparsify: {first_line(exc)}") from exc
    regulariser = RBLoss(masked, target_ratio=ratio) if mode == "regularization" else None
    masks = [m.mask for m in get_pruned_modules(masked).values()] if regulariser else []
    losses = fine_tune(masked, model.source.torch_module, training_set(model, ctx),
                       distill_config(model, ctx, config), label="sparsify", quiet=ctx.quiet, extra_loss=regulariser,
                       extra_groups=[(masks, float(mask_lr))] if masks else [])
    model.torch_module = nncf.strip(masked, do_copy=False, strip_format=nncf.StripFormat.IN_PLACE)
    zeros, total = _sparsity(model.torch_module, skip)
    model.torch_module.eval()
    model.notes.append(f"sparsify: {mode} target {ratio:g}, reached {zeros / max(total, 1):.3f} of prunable weights "
                       f"zero; fine-tuned {epochs} epoch(s), loss {_span(losses)}; weights stay dense (same shapes)")


def _sparsity(module, skipped: list) -> tuple[int, int]:
    from torch import nn

    zeros = total = 0
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)) and m not in skipped:
            zeros += int((m.weight == 0).sum())
            total += m.weight.numel()
    return zeros, total


def _span(losses: list[float]) -> str:
    return f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "n/a"
