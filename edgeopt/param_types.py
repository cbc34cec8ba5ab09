"""Check a recipe step's parameter values against the types its pass function declares, before any work."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from edgeopt.errors import BadInputError

_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list, tuple),
          "tuple": (list, tuple), "dict": (dict,), "None": (type(None),)}
_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "list": "an array",
          "tuple": "an array", "dict": "a table", "None": "absent"}


def check_param_types(function: Callable, params: dict, where: str) -> None:
    """Raise ``BadInputError`` for the first parameter whose value does not fit its annotation."""
    signature = inspect.signature(function)
    for name, value in params.items():
        parameter = signature.parameters.get(name)
        if parameter is None:
            continue
        allowed = _allowed(parameter)
        if not allowed:
            continue
        types = tuple(t for key in allowed for t in _TYPES[key])
        if isinstance(value, bool) and "bool" not in allowed or not isinstance(value, types):
            expected = " or ".join(_NAMES[key] for key in allowed if key != "None")
            raise BadInputError(f"{where}: parameter '{name}' must be {expected}, got {value!r}")
        if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            raise BadInputError(f"{where}: parameter '{name}' must be a finite number, got {value!r}")


def _allowed(parameter: inspect.Parameter) -> list[str]:
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:  # no annotation: the default's type, when it has one
        name = type(parameter.default).__name__
        return [name] if name in _TYPES and name != "NoneType" else []
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"\[[^\[\]]*\]", "", text))  # list[str] -> list (two levels)
    tokens = [t.strip() for t in text.split("|")]
    return tokens if tokens and all(t in _TYPES for t in tokens) else []
