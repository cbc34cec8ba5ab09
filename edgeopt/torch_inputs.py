"""PyTorch example inputs as users write them, and outputs as modules return them.

A factory's example input may be a tensor or a tuple of tensors (named after ``forward()``'s parameters;
``input``, ``input0``, ... where it takes ``*args``), a dict of tensors by parameter name, or
``(args..., kwargs_dict)``; Python scalars become rank-0 tensors. Outputs may
be a tensor, a tuple, a dict or a ``transformers`` ``ModelOutput`` (named by their keys). Where the module is
called by keyword or returns a dict, it is wrapped in ``NamedCall`` so that the rest of edgeopt calls it with
positional tensors and gets a tuple back.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from edgeopt.device.runtime import SINGLE_INPUT
from edgeopt.errors import BadInputError, first_line


@dataclass
class TorchCall:
    """A module ready to be called positionally, its example inputs, and the names of its inputs and outputs."""

    module: Any
    example: tuple
    input_names: list[str]
    output_names: list[str]


def _nn_module():
    from torch import nn

    return nn.Module


class NamedCall(_nn_module()):
    """Calls ``module(**dict(zip(names, args)))`` (or ``module(*args)`` without names) and returns its outputs as
    a flat tuple of tensors."""

    def __init__(self, module, names: list[str] | None = None):
        super().__init__()
        self.module = module
        self.names = tuple(names or ())

    def forward(self, *args):
        out = self.module(**dict(zip(self.names, args))) if self.names else self.module(*args)
        return flat_outputs(out)[1]


def flat_outputs(out) -> tuple[list[str] | None, tuple]:
    """``(keys or None, tensors)`` of a module's result: a tensor, tuple/list, dict, named tuple or ModelOutput."""
    import torch

    if isinstance(out, torch.Tensor):
        return None, (out,)
    if isinstance(out, dict):  # also transformers' ModelOutput (an OrderedDict without its None fields)
        items = [(k, v) for k, v in out.items() if isinstance(v, torch.Tensor)]
        return [k for k, _ in items], tuple(v for _, v in items)
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return list(out._fields), tuple(out)
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return None, tuple(out)
    raise BadInputError(f"the model returns {type(out).__name__}; edgeopt needs a tensor, a tuple or a dict of "
                        f"tensors (nested outputs such as a key-value cache are not supported)")


def parameter_names(module) -> list[str] | None:
    """Names of ``forward()``'s positional parameters, where Python or TorchScript can tell them."""
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is not None:  # a TorchScript method
        return [arg.name for arg in schema.arguments if arg.name != "self"]
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError, AttributeError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def _tensor(value, where: str):
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (bool, int, float, np.ndarray, np.generic)):
        return torch.as_tensor(value)
    raise BadInputError(f"{where}: the example input must be a tensor, a tuple or a dict of tensors (or Python "
                        f"numbers), got {type(value).__name__}")


def torch_call(module, example, where: str, names: list[str] | None = None) -> TorchCall:
    """Normalise ``example`` (see the module docstring) and name inputs and outputs. ``names`` overrides the
    input names of a positional example."""
    import torch

    keywords: dict = {}
    if isinstance(example, dict):
        positional, keywords = (), dict(example)
    elif isinstance(example, (tuple, list)):
        positional = tuple(example)
        if positional and isinstance(positional[-1], dict):
            positional, keywords = positional[:-1], dict(positional[-1])
    else:
        positional = (example,)
    if not positional and not keywords:
        raise BadInputError(f"{where}: the example input is empty")
    if not all(isinstance(k, str) and k.isidentifier() for k in keywords):
        raise BadInputError(f"{where}: the keys of a dict example input must be parameter names of forward()")
    positional = tuple(_tensor(v, where) for v in positional)
    keywords = {k: _tensor(v, where) for k, v in keywords.items()}
    declared = parameter_names(module) or []
    fallback = default_input_names(len(positional), alone=not keywords)
    named = names is not None
    if not named:
        names = declared[:len(positional)] if len(declared) >= len(positional) else []
        if len(names) != len(positional) or set(names) & set(keywords):
            names = fallback
    if keywords:
        unknown = [k for k in keywords if declared and k not in declared and not _takes_kwargs(module)]
        if unknown:
            raise BadInputError(f"{where}: forward() has no parameter(s) {', '.join(unknown)} "
                                f"(it takes {', '.join(declared)})")
    example = positional + tuple(keywords.values())
    try:
        with torch.no_grad():
            out = module(*positional, **keywords)
    except Exception as exc:
        raise does_not_run(where, positional + tuple(keywords.values()), exc) from exc
    keys, tensors = flat_outputs(out)
    if keywords:
        names = list(names) + list(keywords)
        module = NamedCall(module, names)
    elif keys is not None:
        module = NamedCall(module)
    if keys is None:
        keys = ["output"] if len(tensors) == 1 else [f"output{i}" for i in range(len(tensors))]
    if not named and not keywords and set(names) & set(keys):  # forward(self, output): an input may not share
        names = fallback  # an output's name (the exported graph would rename one of them)
    return TorchCall(module, example, list(names), keys)


def default_input_names(count: int, *, alone: bool = True) -> list[str]:
    """Names for ``count`` positional inputs where ``forward()`` gives none: ``input`` for one (``alone``: no
    keyword inputs beside it), else ``input0``, ``input1``, ..."""
    return [SINGLE_INPUT] if count == 1 and alone else [f"input{i}" for i in range(count)]


def _takes_kwargs(module) -> bool:
    try:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return False


def does_not_run(where: str, example: tuple, exc: Exception, shapes_from: str | None = None) -> BadInputError:
    """The one-line refusal of a model that does not run on ``example``, with its cause."""
    shapes = ", ".join(str(list(t.shape)) for t in example)
    check = f"check {shapes_from}: " if shapes_from else ""
    return BadInputError(f"{where}: the model does not run on inputs of shape {shapes} ({check}"
                         f"{first_line(exc, 200)})")
