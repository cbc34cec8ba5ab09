"""The search plan: stages of candidate recipes, in order, read from a TOML file (default: ``plan.toml`` here)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import BadInputError, first_line
from edgeopt.recipe import Recipe, checked, make_step
from edgeopt.targets import MODEL_PRECISIONS
from edgeopt.tomlio import check_keys

DEFAULT_PLAN = Path(__file__).with_name("plan.toml")
_STAGE_KEYS = {"name", "summary", "candidate", "stop_when_passed"}
_CANDIDATE_KEYS = {"label", "precision", "steps", "if_gate_failed"}


@dataclass(frozen=True)
class PlannedCandidate:
    label: str
    precision: str  # the model precision it produces; the device must list it
    recipe: Recipe
    if_gate_failed: tuple[str, ...] = ()  # build only when one of these candidates failed the quality gate


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    candidates: tuple[PlannedCandidate, ...]
    stop_when_passed: bool = True  # False: go on to the next stage even when a candidate already passes


def load_plan(path: str | Path | None = None) -> tuple[Stage, ...]:
    """Read and check a plan; unknown keys, duplicate labels and bad precisions are errors."""
    path = Path(path) if path else DEFAULT_PLAN
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read the search plan ({first_line(exc)})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{path}: not valid TOML ({first_line(exc)})") from exc
    if set(raw) != {"stage"} or not isinstance(raw["stage"], list) or not raw["stage"]:
        raise BadInputError(f"{path}: a search plan is a list of [[stage]] tables and nothing else")
    stages, labels = [], set()
    for number, table in enumerate(raw["stage"], 1):
        check_keys(path, f"stage {number}", table, _STAGE_KEYS, {"name", "candidate"})
        candidates = []
        for item in table["candidate"]:
            where = f"stage '{table['name']}'"
            check_keys(path, where, item, _CANDIDATE_KEYS, {"label", "precision", "steps"})
            label = item["label"]
            if label in labels:
                raise BadInputError(f"{path}: candidate label '{label}' is used twice")
            labels.add(label)
            if item["precision"] not in MODEL_PRECISIONS:
                raise BadInputError(f"{path}: {label}: precision must be one of {', '.join(MODEL_PRECISIONS)}")
            candidates.append(PlannedCandidate(label, item["precision"], _recipe(path, label, item["steps"]),
                                               tuple(item.get("if_gate_failed", ()))))
        stop = table.get("stop_when_passed", True)
        if not isinstance(stop, bool):
            raise BadInputError(f"{path}: stage '{table['name']}': stop_when_passed must be true or false")
        stages.append(Stage(table["name"], table.get("summary", ""), tuple(candidates), stop))
    for stage in stages:
        for candidate in stage.candidates:
            unknown = set(candidate.if_gate_failed) - labels
            if unknown:
                raise BadInputError(f"{path}: {candidate.label}: if_gate_failed names unknown candidate(s) "
                                    f"{', '.join(sorted(unknown))}")
    return tuple(stages)


def _recipe(path: Path, label: str, steps) -> Recipe:
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in steps):
        raise BadInputError(f"{path}: {label}: steps must be a list of tables with a name, e.g. [{{ name = \"int8\" }}]")
    return checked(Recipe(tuple(make_step(s["name"], {k: v for k, v in s.items() if k != "name"},
                                          source=f"{path}: {label}") for s in steps)))
