"""``fleet.toml``: the models (with their data, quality gate and recipe or plan) × the targets (with their
devices). Strict schema: unknown keys, wrong types and duplicate names are one-line errors. Paths are relative
to the file's folder. ::

    [settings]                      # optional; how every pair measures
    runs = 300
    warmup = 20
    min_seconds = 2.0
    seed = 0

    [[model]]
    name = "digits"                 # unique; letters, digits, '.', '_', '-'
    model = "samples/digits/model.py:build"
    calib = "calibration/digits/calib.npz"
    eval = "calibration/digits/eval.npz"
    plan = "my-plan.toml"           # or recipe = "int8" / "recipe.toml" (that one candidate); default: the plan
    max_drop = 1.0                  # quality gate, as edgeopt optimize's options (percentage points)
    min_cosine = 0.99
    objective = "p50_ms"            # default: the profile's
    input_shapes = { input = [1, 1, 8, 8] }

    [[target]]
    profile = "digits-tight"        # a profile name or .toml path
    name = "tight"                  # default: the profile's name
    devices = ["pi5-a", "pi5-b"]    # optional: measure on these devices (devices.toml), as a pool
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgeopt.errors import BadInputError
from edgeopt.evaluate import QualityGate
from edgeopt.targets import OBJECTIVES, Measuring
from edgeopt.tomlio import check_keys, read_toml

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_REQUIRED = ...

# key -> (types, default); _REQUIRED marks a required key
_SETTINGS = {"runs": ((int,), 300), "warmup": ((int,), 20), "min_seconds": ((int, float), 2.0), "seed": ((int,), 0)}
_MODEL = {"name": ((str,), _REQUIRED), "model": ((str,), _REQUIRED), "calib": ((str,), _REQUIRED),
          "eval": ((str,), _REQUIRED), "plan": ((str,), None), "recipe": ((str,), None),
          "max_drop": ((int, float), 1.0), "min_cosine": ((int, float), 0.99),
          "min_token_agreement": ((int, float), 0.9), "max_perplexity_ratio": ((int, float), 1.1),
          "outputs": ((list,), []), "objective": ((str,), None), "input_shapes": ((dict,), {})}
_TARGET = {"profile": ((str,), _REQUIRED), "name": ((str,), None), "devices": ((list,), [])}


@dataclass(frozen=True)
class FleetModel:
    name: str
    model: str  # a path (or file.py:function), resolved against the fleet file's folder
    calibration: str
    evaluation: str
    gate: QualityGate
    plan: str | None = None  # a plan file; None: edgeopt's plan (or the recipe's one-candidate plan)
    recipe: str | None = None  # "int8" or a recipe .toml: build exactly this
    objective: str | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetTarget:
    name: str
    profile: str  # a profile name, or a resolved .toml path
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetSpec:
    path: Path
    models: tuple[FleetModel, ...]
    targets: tuple[FleetTarget, ...]
    measuring: Measuring
    seed: int

    @property
    def pairs(self) -> list[tuple[FleetModel, FleetTarget]]:
        return [(model, target) for model in self.models for target in self.targets]


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and check ``fleet.toml``; every referenced file must exist (checked here, before any work)."""
    path = Path(path)
    raw = read_toml(path)
    check_keys(path, "fleet file", raw, {"settings", "model", "target"}, {"model", "target"})
    settings = _table(path, "[settings]", raw.get("settings", {}), _SETTINGS)
    for key in ("runs", "warmup"):
        if settings[key] < 1:
            raise BadInputError(f"{path}: [settings] {key} must be at least 1, got {settings[key]}")
    if settings["min_seconds"] < 0:
        raise BadInputError(f"{path}: [settings] min_seconds must be at least 0, got {settings['min_seconds']}")
    models = tuple(_model(path, table, number) for number, table in enumerate(_tables(path, raw, "model"), 1))
    targets = tuple(_target(path, table, number) for number, table in enumerate(_tables(path, raw, "target"), 1))
    for kind, items in (("model", models), ("target", targets)):
        names = [item.name for item in items]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise BadInputError(f"{path}: {kind} name(s) used twice: {', '.join(twice)}")
    return FleetSpec(path, models, targets, Measuring(settings["runs"], settings["warmup"],
                                                      float(settings["min_seconds"])), settings["seed"])


def _tables(path: Path, raw: dict, key: str) -> list[dict]:
    tables = raw[key]
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise BadInputError(f"{path}: '{key}' must be one or more [[{key}]] tables")
    return tables


def _model(path: Path, table: dict, number: int) -> FleetModel:
    where = f"[[model]] {table.get('name', number)}"
    values = _table(path, where, table, _MODEL)
    _name(path, where, values["name"])
    if values["plan"] and values["recipe"]:
        raise BadInputError(f"{path}: {where}: give a plan or a recipe, not both")
    if values["objective"] is not None and values["objective"] not in OBJECTIVES:
        raise BadInputError(f"{path}: {where}: objective must be one of {', '.join(OBJECTIVES)}")
    if not (0 <= values["max_drop"] <= 100 and -1 <= values["min_cosine"] <= 1):
        raise BadInputError(f"{path}: {where}: max_drop is in percentage points [0, 100], min_cosine in [-1, 1]")
    if not all(isinstance(o, str) for o in values["outputs"]):
        raise BadInputError(f"{path}: {where}: outputs must be a list of output names")
    shapes = {}
    for name, dims in values["input_shapes"].items():
        if not isinstance(dims, list) or not dims or not all(isinstance(d, int) and d > 0 for d in dims):
            raise BadInputError(f"{path}: {where}: input_shapes.{name} must be a list of positive integers")
        shapes[name] = tuple(dims)
    recipe = values["recipe"]
    if recipe is not None and recipe.endswith(".toml"):
        recipe = _file(path, where, "recipe", recipe)
    gate = QualityGate(max_drop=values["max_drop"] / 100.0, min_cosine=float(values["min_cosine"]),
                       min_token_agreement=float(values["min_token_agreement"]),
                       max_perplexity_ratio=float(values["max_perplexity_ratio"]),
                       outputs=tuple(values["outputs"]))
    return FleetModel(values["name"], _file(path, where, "model", values["model"]),
                      _file(path, where, "calib", values["calib"]), _file(path, where, "eval", values["eval"]),
                      gate, _file(path, where, "plan", values["plan"]) if values["plan"] else None, recipe,
                      values["objective"], shapes)


def _target(path: Path, table: dict, number: int) -> FleetTarget:
    where = f"[[target]] {table.get('name') or table.get('profile', number)}"
    values = _table(path, where, table, _TARGET)
    profile = values["profile"]
    if profile.endswith(".toml"):
        profile = _file(path, where, "profile", profile)
    name = values["name"] or Path(profile).stem
    _name(path, where, name)
    if not all(isinstance(d, str) and d for d in values["devices"]):
        raise BadInputError(f"{path}: {where}: devices must be a list of device names (devices.toml) or ssh:// URLs")
    return FleetTarget(name, profile, tuple(values["devices"]))


def _table(path: Path, where: str, table, schema: dict) -> dict:
    if not isinstance(table, dict):
        raise BadInputError(f"{path}: {where} must be a table")
    check_keys(path, where, table, set(schema), {k for k, (_, default) in schema.items() if default is _REQUIRED})
    values = {}
    for key, (types, default) in schema.items():
        value = table.get(key, default)
        if key in table and (not isinstance(value, types) or isinstance(value, bool)):
            wanted = " or ".join({int: "an integer", float: "a number", str: "a string", list: "a list",
                                  dict: "a table"}[t] for t in types)
            raise BadInputError(f"{path}: {where}: {key} must be {wanted}, got {value!r}")
        values[key] = value
    return values


def _name(path: Path, where: str, name: str) -> None:
    if not _NAME.match(name):
        raise BadInputError(f"{path}: {where}: name {name!r} must be 1-64 letters, digits, '.', '_' or '-' "
                            f"(it names an output folder)")


def _file(path: Path, where: str, key: str, value: str) -> str:
    """``value`` resolved against the fleet file's folder (a ``file.py:function`` spec keeps its function)."""
    from edgeopt.user_code import is_function_spec

    head, _, function = value.rpartition(":") if is_function_spec(value) else (value, "", "")
    resolved = (path.parent / Path(head).expanduser()).resolve() if not Path(head).is_absolute() else Path(head)
    if not resolved.exists():
        raise BadInputError(f"{path}: {where}: {key} {value!r}: no such file or folder ({resolved})")
    return f"{resolved}:{function}" if function else str(resolved)
