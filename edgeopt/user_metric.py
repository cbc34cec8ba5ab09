"""User task metrics on the build host: load ``file.py:function`` (``--metric``, a recipe's or a profile's
``metric``) and evaluate it on a model's outputs. The contract itself is ``edgeopt.device.task_metric``."""

from __future__ import annotations

import functools
from pathlib import Path

from edgeopt.device.task_metric import MetricSpec, MetricValues, call_metric, declared_spec
from edgeopt.errors import BadInputError
from edgeopt.user_code import is_function_spec, load_function


def load_metric(text: str, *, relative_to: Path | None = None, max_drop: float | None = None,
                max_rel_drop: float | None = None) -> MetricSpec:
    """The metric ``file.py:function`` declares (its file read now, so a bad one fails before any work);
    ``relative_to``: the folder a relative path is read from (a recipe's or profile's); ``max_drop`` /
    ``max_rel_drop`` replace the declared allowed drop."""
    if not isinstance(text, str) or not is_function_spec(text):
        raise BadInputError(f"metric must be file.py:function, got {text!r}")
    head, _, name = text.rpartition(":")
    path = Path(head)
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    spec = f"{path}:{name}"
    return declared_spec(spec, metric_function(spec)).with_drops(max_drop, max_rel_drop)


def metric_function(spec: str):
    """The function behind ``file.py:function`` (imported once per file version)."""
    head, _, name = spec.rpartition(":")
    path = Path(head)
    stamp = path.stat().st_mtime_ns if path.is_file() else None
    return _load(str(path.resolve()) if path.is_file() else head, name, stamp)


@functools.lru_cache(maxsize=32)
def _load(path: str, name: str, stamp: int | None):
    return load_function(Path(path), name, "metric")


def evaluate_metric(spec: MetricSpec, outputs: list[dict], targets: list | None) -> MetricValues:
    """The metric on per-sample outputs and the data's targets."""
    return call_metric(spec, metric_function(spec.name), outputs, targets)
