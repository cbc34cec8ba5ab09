"""Compression passes and their registry.

A pass is a function ``(model: WorkingModel, ctx: PassContext, **params) -> None`` that transforms the
working model in place. ``torch`` passes (pruning, distillation, QAT) act on the PyTorch module before it is
converted; ``graph`` passes (INT8 PTQ, FP16, weight compression) act on the converted OpenVINO and ONNX
models. The pipeline runs a recipe's torch passes first, converts, then runs its graph passes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeopt.data import SampleSet
from edgeopt.errors import BadInputError
from edgeopt.param_types import check_param_types
from edgeopt.recipe import Step
from edgeopt.source import SourceModel


@dataclass
class WorkingModel:
    """The model as it moves through a recipe."""

    source: SourceModel
    torch_module: Any = None  # current PyTorch module (torch sources only)
    ov_model: Any = None  # openvino.Model, set once converted
    onnx_model: Any = None  # onnx.ModelProto, set once converted (when ONNX output is wanted)
    precision: str = "fp32"  # weight precision label of the result: fp32, fp16, int8, int4/int8, ...
    notes: list[str] = field(default_factory=list)  # choices a pass made, for the report


@dataclass
class PassContext:
    calibration: SampleSet
    seed: int = 0
    quiet: bool = False  # no progress bars
    evaluation: SampleSet | None = None  # held-out data (with labels when given), for accuracy-aware passes
    train: SampleSet | None = None  # training data for torch passes that fine-tune (else the calibration set)


@dataclass(frozen=True)
class PassInfo:
    name: str
    stage: str  # "torch" | "graph"
    run: Callable
    summary: str


REGISTRY: dict[str, PassInfo] = {}


def register(name: str, stage: str, summary: str) -> Callable:
    """Decorator: add a pass function to the registry under ``name``."""

    def wrap(func: Callable) -> Callable:
        REGISTRY[name] = PassInfo(name, stage, func, summary)
        return func

    return wrap


def _load_builtin_passes() -> None:
    from edgeopt.passes import quantize  # noqa: F401  (registers int8, fp16)
    from edgeopt.passes import accuracy_control  # noqa: F401  (registers int8_ac)
    from edgeopt.passes import weights  # noqa: F401  (registers weights)
    from edgeopt.passes import distill, prune  # noqa: F401  (registers distill, qat, prune, sparsify)


def get_pass(name: str) -> PassInfo:
    _load_builtin_passes()
    if name not in REGISTRY:
        raise BadInputError(f"unknown recipe step '{name}' (known: {', '.join(sorted(REGISTRY))})")
    return REGISTRY[name]


def check_step(step: Step, source: str) -> None:
    """Reject unknown steps and unknown parameters before any work starts."""
    info = get_pass(step.name)
    accepted = {p.name for p in list(inspect.signature(info.run).parameters.values())[2:]}
    unknown = set(step.params) - accepted
    if unknown:
        raise BadInputError(f"{source}: step '{step.name}' has unknown parameter(s) {', '.join(sorted(unknown))} "
                            f"(accepted: {', '.join(sorted(accepted)) or 'none'})")
    check_param_types(info.run, step.params, f"{source}: step '{step.name}'")


def run_step(step: Step, model: WorkingModel, ctx: PassContext) -> None:
    info = get_pass(step.name)
    info.run(model, ctx, **step.params)
