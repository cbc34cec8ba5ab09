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
        steps = []
        for index, table in enumerate(raw.get("step", [])):
            params = dict(table)
            name = params.pop("name", None)
            if not isinstance(name, str):
                raise BadInputError(f"{path}: step {index + 1} has no name")
            steps.append(Step(name, params))
    else:
        steps = [Step(name.strip()) for name in text.split(",") if name.strip()]
    for step in steps:
        check_step(step, source=text)
    return Recipe(tuple(steps))
