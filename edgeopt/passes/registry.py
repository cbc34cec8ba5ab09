"""The pass registry: each pass declares its contract (Olive's pass metadata) and the pipeline, CLI and search
ask it instead of knowing pass names.

A pass is ``run(model: WorkingModel, ctx: PassContext, config: <its StepConfig>) -> None``, transforming the
working model in place. ``torch`` passes act on the PyTorch module before conversion; ``graph`` passes act on
the converted graphs of the formats they accept.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from edgeopt.errors import BadInputError
from edgeopt.passes.config import StepConfig

TORCH, GRAPH = "torch", "graph"
_BUILTIN = ("quantize", "accuracy_control", "repair", "weights", "prune", "sparsify", "distill", "qat")


@dataclass(frozen=True)
class PassInfo:
    name: str
    run: Callable
    config: type[StepConfig]
    summary: str
    stage: str  # TORCH (before conversion) or GRAPH (on the converted graphs)
    formats: tuple[str, ...] = ()  # graph passes: the formats they transform (others make the recipe fail early)
    sets_precision: bool = False  # decides the output precision: --precision and another such step are refused
    needs_eval: bool = False  # needs evaluation data (--eval)

    @property
    def needs_torch_module(self) -> bool:
        return self.stage == TORCH


REGISTRY: dict[str, PassInfo] = {}


def register(name: str, config: type[StepConfig], *, stage: str, summary: str, formats: tuple[str, ...] = (),
             sets_precision: bool = False, needs_eval: bool = False) -> Callable:
    """Decorator: add a pass function to the registry under ``name`` with its config type and contract."""
    if stage not in (TORCH, GRAPH):
        raise ValueError(f"stage must be {TORCH} or {GRAPH}")

    def wrap(func: Callable) -> Callable:
        config.step = name
        REGISTRY[name] = PassInfo(name, func, config, summary, stage, formats, sets_precision, needs_eval)
        return func

    return wrap


def get_pass(name: str) -> PassInfo:
    load_builtin_passes()
    if name not in REGISTRY:
        raise BadInputError(f"unknown recipe step '{name}' (known: {', '.join(sorted(REGISTRY))})")
    return REGISTRY[name]


def all_passes() -> list[PassInfo]:
    load_builtin_passes()
    return [REGISTRY[name] for name in sorted(REGISTRY)]


def load_builtin_passes() -> None:
    for module in _BUILTIN:
        importlib.import_module(f"edgeopt.passes.{module}")
