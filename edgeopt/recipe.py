"""Recipes: an ordered list of compression steps, given inline (``prune,distill,int8``) or as a TOML file.

A recipe file::

    [[step]]
    name = "prune"
    ratio = 0.5

    [[step]]
    name = "int8"
    preset = "mixed"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from edgeopt.errors import BadInputError, first_line


@dataclass(frozen=True)
class Step:
    name: str
    params: dict = field(default_factory=dict)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({args})" if args else self.name


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]

    @property
    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    def describe(self) -> str:
        return " → ".join(step.describe() for step in self.steps) or "none (FP32)"


def parse_recipe(text: str) -> Recipe:
    """Parse ``a,b,c`` or the path of a TOML recipe file; step names are checked against the registry."""
    from edgeopt.passes import check_step

    path = Path(text)
    if path.suffix == ".toml":
        if not path.is_file():
            raise BadInputError(f"{path}: no such recipe file")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInputError(f"{path}: not valid TOML ({first_line(exc)})") from exc
        unknown = set(raw) - {"step"}
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (a recipe has [[step]] tables)")
        tables = raw.get("step", [])
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise BadInputError(f"{path}: 'step' must be an array of tables: write each step as [[step]], not [step]")
        steps = []
        for index, table in enumerate(tables):
            params = dict(table)
            name = params.pop("name", None)
            if not isinstance(name, str):
                raise BadInputError(f"{path}: step {index + 1} has no name")
            steps.append(Step(name, params))
    else:
        steps = [Step(name.strip()) for name in text.split(",") if name.strip()]
    for step in steps:
        check_step(step, source=text)
    _refuse_repeated_precision(steps, text)
    return Recipe(tuple(steps))


def _refuse_repeated_precision(steps: list[Step], source: str) -> None:
    """``int8,int8`` or ``int8,fp16``: a model gets one precision step; a second would be silently ignored
    or stacked."""
    from edgeopt.passes import get_pass

    graph = [s.name for s in steps if get_pass(s.name).stage == "graph"]
    if len(graph) > 1:
        raise BadInputError(f"recipe '{source}': more than one precision step ({', '.join(graph)}); give one")
