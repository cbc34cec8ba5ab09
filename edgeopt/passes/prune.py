"""Torch passes that prune weights: ``prune`` removes whole channels (torch-pruning's dependency graph), so
parameters, MACs, file size and latency drop; ``sparsify`` zeroes single weights (``nncf.prune``), which keeps
the dense shapes (smaller only once compressed, faster only on a runtime that exploits sparsity).
"""

from __future__ import annotations

from edgeopt.distillation import fine_tune
from edgeopt.errors import BadInputError, first_line
from edgeopt.passes import PassContext, WorkingModel, register
from edgeopt.passes.distill import distill_config, plain_module, training_set

IMPORTANCES = ("l1", "l2", "fpgm", "lamp", "random")
SPARSITY_MODES = {"local": "UNSTRUCTURED_MAGNITUDE_LOCAL", "global": "UNSTRUCTURED_MAGNITUDE_GLOBAL",
                  "regularization": "UNSTRUCTURED_REGULARIZATION_BASED"}


@register("prune", stage="torch", summary="Structured channel pruning (torch-pruning): removes conv/linear channels")
def prune(model: WorkingModel, ctx: PassContext, *, ratio: float = 0.5, scope: str = "layer",
          importance: str = "l2", ignored_layers: list[str] | None = None, layer_ratios: dict | None = None,
          max_layer_ratio: float = 0.9, round_to: int | None = None) -> None:
    """Remove ``ratio`` of the output channels of every prunable layer (``scope="layer"``) or of the whole
    network ranked together (``scope="global"``); ``layer_ratios`` overrides the ratio per module name. The
    output layer and ``ignored_layers`` keep their channels, so the model's outputs keep their shape."""
    import torch
    import torch_pruning as tp

    module = plain_module(model, "prune")
    _check_ratio("prune", ratio, upper=1.0)
    if scope not in ("layer", "global"):
        raise BadInputError(f"prune: scope must be 'layer' or 'global' (given '{scope}')")
    if importance not in IMPORTANCES:
        raise BadInputError(f"prune: importance must be one of {', '.join(IMPORTANCES)} (given '{importance}')")
    example = model.source.example_input
    ignored = _modules(module, ignored_layers or [], "ignored_layers") + [output_layer(module, example)]
    per_layer = {}
    for name, value in (layer_ratios or {}).items():
        _check_ratio(f"prune: layer_ratios[{name}]", value, upper=1.0)
        per_layer[_modules(module, [name], "layer_ratios")[0]] = float(value)
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
                       f"{', '.join(_name(module, m) for m in ignored)}; params {params_before:,} -> {params_after:,}, "
                       f"MACs {macs_before:,} -> {macs_after:,}")


@register("sparsify", stage="torch",
          summary="Unstructured weight sparsity (nncf.prune: magnitude local/global or regularization-based)")
def sparsify(model: WorkingModel, ctx: PassContext, *, ratio: float = 0.5, mode: str = "local",
             ignored_layers: list[str] | None = None, epochs: int = 2, lr: float = 1e-4, temperature: float = 4.0,
             alpha: float = 0.7, batch_size: int = 64, mask_lr: float = 0.2) -> None:
    """Mask ``ratio`` of the weights (magnitude ``local`` per layer or ``global``), or learn the masks with a
    sparsity regulariser (``regularization``, masks trained at ``mask_lr``); fine-tune against the original with
    the distillation loss for ``epochs``, then strip the masks into the weights."""
    import nncf
    from nncf.torch.function_hook.pruning.rb.algo import get_pruned_modules
    from nncf.torch.function_hook.pruning.rb.losses import RBLoss

    module = plain_module(model, "sparsify")
    _check_ratio("sparsify", ratio, upper=1.0)
    if mode not in SPARSITY_MODES:
        raise BadInputError(f"sparsify: mode must be one of {', '.join(SPARSITY_MODES)} (given '{mode}')")
    if mode == "regularization" and epochs < 1:
        raise BadInputError("sparsify: regularization-based sparsity learns its masks; give epochs >= 1")
    example = model.source.example_input
    skip = _modules(module, ignored_layers or [], "ignored_layers") + [output_layer(module, example)]
    weights = [f"{_name(module, m)}.weight" for m in skip]
    prune_mode = getattr(nncf.PruneMode, SPARSITY_MODES[mode])
    try:
        masked = nncf.prune(module, mode=prune_mode, ratio=None if mode == "regularization" else ratio,
                            ignored_scope=nncf.IgnoredScope(names=weights, validate=False), examples_inputs=example)
    except nncf.ValidationError as exc:
        raise BadInputError(f"sparsify: {first_line(exc)}") from exc
    regulariser = RBLoss(masked, target_ratio=ratio) if mode == "regularization" else None
    masks = [m.mask for m in get_pruned_modules(masked).values()] if regulariser else []
    config = distill_config(ctx, epochs=epochs, lr=lr, temperature=temperature, alpha=alpha, batch_size=batch_size)
    losses = fine_tune(masked, model.source.torch_module, training_set(model, ctx), config, label="sparsify",
                       quiet=ctx.quiet, extra_loss=regulariser,
                       extra_groups=[(masks, float(mask_lr))] if masks else [])
    model.torch_module = nncf.strip(masked, do_copy=False, strip_format=nncf.StripFormat.IN_PLACE)
    zeros, total = _sparsity(model.torch_module, skip)
    model.torch_module.eval()
    model.notes.append(f"sparsify: {mode} target {ratio:g}, reached {zeros / max(total, 1):.3f} of prunable weights "
                       f"zero; fine-tuned {epochs} epoch(s), loss {_span(losses)}; weights stay dense (same shapes)")


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


def _modules(module, names: list[str], option: str) -> list:
    by_name = dict(module.named_modules())
    unknown = [n for n in names if n not in by_name or not n]
    if unknown:
        known = ", ".join(n for n, m in module.named_modules() if n and not list(m.children()))
        raise BadInputError(f"{option}: no module named {', '.join(unknown)} (leaf modules: {known})")
    return [by_name[n] for n in names]


def _name(module, target) -> str:
    return next(name for name, m in module.named_modules() if m is target)


def count_params_and_macs(module, example: tuple) -> tuple[int, int]:
    """Parameters and multiply-accumulates of one forward pass (torch-pruning's counter)."""
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(module, example)
    return int(params), int(macs)


def _output_shapes(module, example: tuple) -> list[tuple]:
    out = module(*example)
    return [tuple(o.shape) for o in (out if isinstance(out, (tuple, list)) else (out,))]


def _sparsity(module, skipped: list) -> tuple[int, int]:
    from torch import nn

    zeros = total = 0
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)) and m not in skipped:
            zeros += int((m.weight == 0).sum())
            total += m.weight.numel()
    return zeros, total


def _check_ratio(what: str, value, upper: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value < upper:
        raise BadInputError(f"{what}: ratio must be a number in [0, {upper:g}) (given {value!r})")


def _span(losses: list[float]) -> str:
    return f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "n/a"
