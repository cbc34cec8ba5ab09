"""Torch pass ``prune``: removes whole channels (torch-pruning's dependency graph), so parameters, MACs, file
size and latency drop. (``sparsify`` zeroes single weights instead.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeopt.errors import BadInputError, first_line
from edgeopt.metrics import count_params_and_macs
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.config import StepConfig, number
from edgeopt.passes.registry import TORCH, register
from edgeopt.passes.training import plain_module

IMPORTANCES = ("l1", "l2", "fpgm", "lamp", "random")


@dataclass(frozen=True)
class PruneConfig(StepConfig):
    ratio: float = number(0.5, "[0, 1)")
    scope: Literal["layer", "global"] = "layer"
    importance: Literal[IMPORTANCES] = "l2"  # type: ignore[valid-type]
    ignored_layers: list[str] | None = None
    layer_ratios: dict[str, float] | None = None
    max_layer_ratio: float = number(0.9, "(0, 1]")
    round_to: int | None = number(None, "[1, inf)")

    def check(self) -> None:
        for name, value in (self.layer_ratios or {}).items():
            if not 0.0 <= value < 1.0:
                raise self.error(f"layer_ratios[{name}] must be in [0, 1), got {value!r}")


@register("prune", PruneConfig, stage=TORCH,
          summary="Structured channel pruning (torch-pruning): removes conv/linear channels")
def prune(model: WorkingModel, ctx: PassContext, config: PruneConfig) -> None:
    """Remove ``ratio`` of the output channels of every prunable layer (``scope="layer"``) or of the whole
    network ranked together (``scope="global"``); ``layer_ratios`` overrides the ratio per module name. The
    output layer and ``ignored_layers`` keep their channels, so the model's outputs keep their shape."""
    import torch
    import torch_pruning as tp

    ratio, scope, importance = config.ratio, config.scope, config.importance
    ignored_layers, layer_ratios = config.ignored_layers, config.layer_ratios
    max_layer_ratio, round_to = config.max_layer_ratio, config.round_to
    module = plain_module(model, "prune")
    example = model.source.example_input
    ignored = modules_named(module, ignored_layers or [], "ignored_layers") + [output_layer(module, example)]
    per_layer = {}
    for name, value in (layer_ratios or {}).items():
        per_layer[modules_named(module, [name], "layer_ratios")[0]] = float(value)
    with torch.no_grad():
        shapes_before = _output_shapes(module, example)
    params_before, macs_before = count_params_and_macs(module, example)
    try:
        pruner = tp.pruner.MetaPruner(module, example, importance=_importance(importance), pruning_ratio=ratio,
                                      pruning_ratio_dict=per_layer or None, global_pruning=scope == "global",
                                      max_pruning_ratio=max_layer_ratio, ignored_layers=ignored, round_to=round_to)
        pruner.step()
    except Exception as exc:  # torch-pruning raises plain errors on graphs it cannot trace
        raise BadInputError(f"prune: torch-pruning cannot prune this model ({first_line(exc)})") from exc
    with torch.no_grad():
        shapes_after = _output_shapes(module, example)
    if shapes_after != shapes_before:
        raise BadInputError(f"prune: pruning changed the output shapes {shapes_before} -> {shapes_after}; "
                            f"add the output layers to ignored_layers")
    params_after, macs_after = count_params_and_macs(module, example)
    model.notes.append(f"prune: {scope} ratio {ratio:g} ({importance} importance), kept "
                       f"{', '.join(module_name(module, m) for m in ignored)}; params {params_before:,} -> {params_after:,}, "
                       f"MACs {macs_before:,} -> {macs_after:,}")


def output_layer(module, example: tuple):
    """The last conv/linear layer the forward pass calls: the one whose channels are the model's outputs."""
    import torch
    from torch import nn

    called = []
    hooks = [m.register_forward_hook(lambda mod, *_: called.append(mod)) for m in module.modules()
             if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear))]
    try:
        with torch.no_grad():
            module(*example)
    finally:
        for hook in hooks:
            hook.remove()
    if not called:
        raise BadInputError("the model has no conv or linear layer to prune")
    return called[-1]


def _importance(name: str):
    import torch_pruning as tp

    return {"l1": lambda: tp.importance.MagnitudeImportance(p=1), "l2": lambda: tp.importance.MagnitudeImportance(p=2),
            "fpgm": tp.importance.FPGMImportance, "lamp": tp.importance.LAMPImportance,
            "random": tp.importance.RandomImportance}[name]()


def modules_named(module, names: list[str], option: str) -> list:
    by_name = dict(module.named_modules())
    unknown = [n for n in names if n not in by_name or not n]
    if unknown:
        known = ", ".join(n for n, m in module.named_modules() if n and not list(m.children()))
        raise BadInputError(f"{option}: no module named {', '.join(unknown)} (leaf modules: {known})")
    return [by_name[n] for n in names]


def module_name(module, target) -> str:
    return next(name for name, m in module.named_modules() if m is target)


def _output_shapes(module, example: tuple) -> list[tuple]:
    out = module(*example)
    return [tuple(o.shape) for o in (out if isinstance(out, (tuple, list)) else (out,))]
