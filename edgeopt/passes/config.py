"""Typed step configs: one frozen dataclass per pass, checked when it is built (torchao's ``quantize_`` configs).

A field's type annotation is its contract: ``int``, ``float`` (an integer is accepted), ``bool``, ``str``,
``Literal[...]`` (an enum), ``list[str]``, ``dict[str, float]``, and ``X | None``. A numeric field may add an
interval with ``number(default, "[0, 1)")``. Cross-field rules go in ``check()``. Every violation is one
``BadInputError`` line naming the step and the parameter, raised before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from edgeopt.errors import BadInputError

_INTERVAL = "interval"


def number(default: Any, interval: str) -> Any:
    """A numeric field with its allowed interval, e.g. ``"[0, 1)"``, ``"(0, inf)"``, ``"[1, inf)"``."""
    _parse_interval(interval)
    return dataclasses.field(default=default, metadata={_INTERVAL: interval})


@dataclass(frozen=True)
class StepConfig:
    """Base of every step config; ``step`` is the recipe name of the pass the config belongs to."""

    step: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            problem = _type_problem(value, hints[item.name])
            if problem is None and _INTERVAL in item.metadata and value is not None:
                problem = _interval_problem(value, item.metadata[_INTERVAL])
            if problem:
                raise self.error(f"{item.name} must be {problem}, got {value!r}")
        self.check()

    def check(self) -> None:
        """Cross-field rules; raise ``self.error(...)``."""

    def error(self, message: str) -> BadInputError:
        return BadInputError(f"{self.step}: {message}")

    @classmethod
    def parameters(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_params(cls, params: dict) -> "StepConfig":
        unknown = set(params) - set(cls.parameters())
        if unknown:
            raise BadInputError(f"step '{cls.step}' has unknown parameter(s) {', '.join(sorted(unknown))} "
                                f"(accepted: {', '.join(sorted(cls.parameters())) or 'none'})")
        return cls(**params)

    def to_dict(self) -> dict:
        """Every parameter, defaults included (what cache keys hash)."""
        return dataclasses.asdict(self)


def _type_problem(value: Any, annotation: Any) -> str | None:
    """``None`` when ``value`` fits ``annotation``, else what was expected, in words."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        problems = [_type_problem(value, a) for a in options]
        if any(p is None for p in problems):
            return None
        return " or ".join(problems) + (" (or left out)" if len(options) < len(args) else "")
    if origin is Literal:
        if value in args and type(value) is type(args[0]):
            return None
        kind = f"a {_word(type(args[0]))}, " if not isinstance(value, type(args[0])) else ""
        return kind + "one of " + ", ".join(map(str, args))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return f"an array (a list of {_word(args[0])}s)"
        return next((f"a list of {_word(args[0])}s" for v in value if _type_problem(v, args[0])), None)
    if origin is dict:
        if not isinstance(value, dict):
            return f"a table of {_word(args[1])}s"
        return next((f"a table of {_word(args[1])}s" for k, v in value.items()
                     if _type_problem(k, args[0]) or _type_problem(v, args[1])), None)
    if annotation is bool:
        return None if isinstance(value, bool) else "true or false"
    if annotation is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "a number"
    if annotation is str:
        return None if isinstance(value, str) else "a string"
    raise TypeError(f"unsupported config annotation {annotation!r}")  # a bug in a config class


def _word(annotation: Any) -> str:
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(annotation, str(annotation))


def _parse_interval(text: str) -> tuple[bool, float, float, bool]:
    low, high = text[1:-1].split(",")
    return text[0] == "[", float(low), float(high), text[-1] == "]"


def _interval_problem(value: float, interval: str) -> str | None:
    closed_low, low, high, closed_high = _parse_interval(interval)
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    return None if above and below else f"in {interval}"


def interval_of(config: type[StepConfig], name: str) -> str | None:
    """The declared interval of a numeric field (for help texts and tests)."""
    item = next(f for f in dataclasses.fields(config) if f.name == name)
    return item.metadata.get(_INTERVAL)
