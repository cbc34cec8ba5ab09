"""Recipes: an ordered list of compression steps, given inline (``prune,distill,int8``) or as a TOML file.

A recipe file::

    [[step]]
    name = "prune"
    ratio = 0.5

    [[step]]
    name = "int8"
    preset = "mixed"

A recipe file may also name the task metric the quality gate judges (``metric = "metrics.py:f1"``, a path
relative to the recipe; docs/metrics.md); ``--metric`` on the command line wins.

Every step is parsed into its pass's typed config (``edgeopt.passes.<pass>``): unknown steps, unknown
parameters and wrong types, ranges or choices are one-line errors here, before any model is loaded. The rules
between steps (PyTorch steps first, one step that decides the precision) are checked here too.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from edgeopt import jsonio
from edgeopt.device.task_metric import MetricSpec
from edgeopt.errors import BadInputError, first_line
from edgeopt.passes.config import StepConfig
from edgeopt.passes.registry import GRAPH, TORCH, PassInfo, get_pass


@dataclass(frozen=True)
class Step:
    """One recipe step: the parameters as given (for reports) and the typed config built from them."""

    name: str
    params: dict = field(default_factory=dict)
    config: StepConfig | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.config is None:
            object.__setattr__(self, "config", get_pass(self.name).config.from_params(self.params))

    @property
    def info(self) -> PassInfo:
        return get_pass(self.name)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({args})" if args else self.name


def make_step(name: str, params: dict | None = None, *, source: str = "") -> Step:
    """Build and check a step; errors name ``source`` (the recipe file, or the option that made the step)."""
    try:
        return Step(name, dict(params or {}))
    except BadInputError as exc:
        raise BadInputError(f"{source}: {exc}" if source else str(exc)) from None


@dataclass(frozen=True)
class Recipe:
    steps: tuple[Step, ...]
    metric: MetricSpec | None = None  # the task metric the recipe file names

    @property
    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    def describe(self) -> str:
        return " → ".join(step.describe() for step in self.steps) or "none (FP32)"

    def stage(self, stage: str) -> list[Step]:
        return [step for step in self.steps if step.info.stage == stage]

    @property
    def sets_precision(self) -> bool:
        """Whether a step decides the output precision (a graph quantizer, FP16, weights, QAT)."""
        return any(step.info.sets_precision for step in self.steps)

    @property
    def has_torch_steps(self) -> bool:
        return bool(self.stage(TORCH))

    def then(self, *steps: Step) -> "Recipe":
        """This recipe followed by ``steps``, checked as a whole."""
        return checked(Recipe(self.steps + steps, self.metric))

    def key(self) -> list:
        """Every parameter of every step, defaults included: what cache keys hash."""
        return [[step.name, step.config.to_dict()] for step in self.steps]


def checked(recipe: Recipe) -> Recipe:
    """Apply the rules between steps, from the passes' declared contracts."""
    torch_steps, graph_steps = recipe.stage(TORCH), recipe.stage(GRAPH)
    first_graph = min((recipe.steps.index(s) for s in graph_steps), default=len(recipe.steps))
    if any(recipe.steps.index(s) > first_graph for s in torch_steps):
        raise BadInputError(f"recipe '{recipe.describe()}': PyTorch steps must come before graph steps")
    deciding = [s for s in recipe.steps if s.info.sets_precision]
    if len(deciding) > 1:
        later = ", ".join(s.name for s in deciding[1:])
        raise BadInputError(f"recipe '{recipe.describe()}': {deciding[0].name} already sets the model's precision: "
                            f"more than one precision step ({', '.join(s.name for s in deciding)}); drop {later}")
    return recipe


def parse_recipe(text: str) -> Recipe:
    """Parse ``a,b,c`` or the path of a TOML recipe file into checked, typed steps."""
    path = Path(text)
    if path.suffix == ".toml":
        if not path.is_file():
            raise BadInputError(f"{path}: no such recipe file")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInputError(f"{path}: not valid TOML ({first_line(exc)})") from exc
        unknown = set(raw) - {"step", "metric"}
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (a recipe has [[step]] tables "
                                f"and an optional metric)")
        tables = raw.get("step", [])
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise BadInputError(f"{path}: 'step' must be an array of tables: write each step as [[step]], not [step]")
        steps = []
        for index, table in enumerate(tables):
            params = dict(table)
            name = params.pop("name", None)
            if not isinstance(name, str):
                raise BadInputError(f"{path}: step {index + 1} has no name")
            steps.append(make_step(name, params, source=f"{path}: step {index + 1}"))
        return checked(Recipe(tuple(steps), _recipe_metric(path, raw.get("metric"))))
    steps = [make_step(name.strip(), source=text) for name in text.split(",") if name.strip()]
    return checked(Recipe(tuple(steps)))


def _recipe_metric(path: Path, value) -> MetricSpec | None:
    if value is None:
        return None
    from edgeopt.user_metric import load_metric

    try:
        return load_metric(value, relative_to=path.parent)
    except BadInputError as exc:
        raise BadInputError(f"{path}: metric: {exc}") from None


def recipe_toml(steps: list[dict], comment: str = "") -> str:
    """A recipe file (``[[step]]`` tables) for ``steps`` given as ``{"name": ..., parameter: value}``; parameters
    that are ``None`` are left out (their defaults)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    for step in steps:
        lines += ["", "[[step]]"] + [f"{key} = {_toml_value(value)}" for key, value in step.items() if value is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return repr(value)
    if isinstance(value, str):
        return jsonio.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")  # a bug in the step that asked


PRECISION_STEPS = {"int8": "int8", "fp16": "fp16", "fp32": None}  # --precision shorthand -> the step it means


def build_recipe(recipe: str | Recipe | None = None, precision: str | None = None, *, weights: Step | None = None,
                 target=None, repair: bool = False) -> Recipe:
    """The recipe a compress run executes, from a recipe, the ``--precision`` shorthand, a ``weights`` step
    (``--weights``) and a device profile (its preferred precision when nothing else sets one); ``repair``
    (``--repair``) then replaces its ``int8`` step with ``int8_repair``."""
    built = _build_recipe(recipe, precision, weights=weights, target=target)
    if not repair:
        return built
    plain = [step for step in built.steps if step.name == "int8"]
    if not plain:
        raise BadInputError(f"--repair repairs an int8 step; recipe '{built.describe()}' has none")
    if plain[0].params:
        raise BadInputError(f"--repair: the ladder chooses the int8 step's parameters; drop "
                            f"{', '.join(sorted(plain[0].params))} or write an int8_repair step")
    return checked(Recipe(tuple(make_step("int8_repair", source="--repair") if step.name == "int8" else step
                                for step in built.steps)))


def _build_recipe(recipe: str | Recipe | None, precision: str | None, *, weights: Step | None, target) -> Recipe:
    parsed = recipe if isinstance(recipe, Recipe) else parse_recipe(recipe) if recipe else None
    if precision is not None and precision not in PRECISION_STEPS:
        raise BadInputError(f"--precision: must be one of {', '.join(PRECISION_STEPS)}, got {precision!r}")
    if target is not None and precision is not None and precision not in target.precisions:
        raise BadInputError(f"--precision {precision}: target {target.name} supports {', '.join(target.precisions)}")
    if weights is not None:
        if precision is not None:
            raise BadInputError("give either --precision or --weights, not both")
        base = parsed or Recipe(())
        if base.sets_precision:
            raise BadInputError("give either --weights or a recipe with a precision step, not both")
        return base.then(weights)
    if parsed is not None and parsed.sets_precision:
        if precision is not None:
            raise BadInputError("give either --precision or a recipe with a precision step, not both")
        return parsed
    if precision is None and parsed is not None and target is None:
        return parsed  # a recipe without a precision step keeps the model in FP32
    if precision is None:
        precision = target.precisions[0] if target is not None else "int8"
    step = PRECISION_STEPS[precision]
    return (parsed or Recipe(())).then(*([make_step(step)] if step else []))
