"""The user-metric contract: how a task metric is declared, called and judged (docs/metrics.md).

A metric is a plain function ``fn(outputs, targets)``: ``outputs`` is one dict per sample of every model output
by name (numpy arrays, as the model returns them for one sample); ``targets`` is one entry per sample of
whatever the data source provides (boxes, strings, arrays, class indices), or ``None`` when it provides none.
It returns a number, or a dict of named numbers of which one is the primary (the one the gate judges).
Declare the direction and the allowed drop with the ``metric`` decorator (``from edgeopt import metric``)::

    @metric(primary="f1", higher_is_better=True, max_drop=0.02)
    def detection_f1(outputs, targets): ...

Lean module (numpy and the standard library): the on-device validator calls a metric shipped in a bundle.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from edgeopt.errors import BadInputError, first_line

DEFAULT_MAX_REL_DROP = 0.01  # when neither the metric nor the command line says: 1% of the reference value
ATTRIBUTE = "edgeopt_metric"  # the function attribute the decorator sets


@dataclass(frozen=True)
class MetricSpec:
    """A metric as the gate uses it: where it lives and what it declares (thresholds resolved)."""

    name: str  # "file.py:function" as given (or a built-in's name)
    primary: str = "value"  # the returned value the gate judges
    higher_is_better: bool = True
    max_drop: float | None = None  # allowed drop in the metric's units
    max_rel_drop: float | None = None  # allowed drop as a fraction of the reference's value

    def __post_init__(self) -> None:
        for label, value in (("max_drop", self.max_drop), ("max_rel_drop", self.max_rel_drop)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not math.isfinite(value) or value < 0):
                raise BadInputError(f"metric {self.name}: {label} must be a finite number >= 0, got {value!r}")
        if self.max_drop is None and self.max_rel_drop is None:
            object.__setattr__(self, "max_rel_drop", DEFAULT_MAX_REL_DROP)

    def with_drops(self, max_drop: float | None = None, max_rel_drop: float | None = None) -> "MetricSpec":
        """The same metric with the allowed drop given on the command line (which replaces the declared one)."""
        if max_drop is None and max_rel_drop is None:
            return self
        return replace(self, max_drop=max_drop, max_rel_drop=max_rel_drop)

    def describe(self) -> dict:
        return {"name": self.name, "primary": self.primary,
                "direction": "higher" if self.higher_is_better else "lower",
                "max_drop": self.max_drop, "max_rel_drop": self.max_rel_drop}

    @classmethod
    def from_dict(cls, data: dict) -> "MetricSpec":
        return cls(data["name"], data["primary"], data["direction"] == "higher", data["max_drop"],
                   data["max_rel_drop"])

    def allowed_drop(self, reference: float) -> float:
        """The largest drop (in the metric's units, towards worse) allowed from ``reference``: the tighter of
        the absolute and the relative bound when both are given."""
        bounds = [b for b in (self.max_drop, None if self.max_rel_drop is None else self.max_rel_drop * abs(reference))
                  if b is not None]
        return min(bounds)

    def drop(self, reference: float, value: float) -> float:
        """How much worse ``value`` is than ``reference`` (negative: better)."""
        return reference - value if self.higher_is_better else value - reference

    def judge(self, reference: "MetricValues", candidate: "MetricValues") -> "MetricCheck":
        ref, value = reference.value, candidate.value
        drop, allowed = self.drop(ref, value), self.allowed_drop(ref)
        return MetricCheck(self, ref, value, drop, allowed, drop <= allowed + 1e-12)


@dataclass(frozen=True)
class MetricValues:
    """What one metric call returned: every named value, and which one is primary."""

    name: str
    primary: str
    values: dict[str, float]

    @property
    def value(self) -> float:
        return self.values[self.primary]

    def describe(self) -> dict:
        return {"name": self.name, "primary": self.primary, "value": self.value, "values": dict(self.values)}

    @classmethod
    def from_dict(cls, data: dict) -> "MetricValues":
        return cls(data["name"], data["primary"], dict(data["values"]))


@dataclass(frozen=True)
class MetricCheck:
    """The gate's verdict on a metric: reference and artifact values, the drop, the allowed drop."""

    spec: MetricSpec
    reference: float
    value: float
    drop: float
    allowed: float
    passed: bool

    def message(self) -> str:
        direction = "higher" if self.spec.higher_is_better else "lower"
        return (f"{self.spec.primary} {self.value:.6g} vs {self.reference:.6g} (drop {self.drop:.4g}, max "
                f"{self.allowed:.4g}; {direction} is better; metric {self.spec.name})")

    def describe(self) -> dict:
        return {**self.spec.describe(), "reference": self.reference, "value": self.value, "drop": self.drop,
                "threshold": self.allowed, "passed": self.passed}


def metric(function=None, *, primary: str | None = None, higher_is_better: bool = True,
           max_drop: float | None = None, max_rel_drop: float | None = None):
    """Declare a task metric: ``@metric`` or ``@metric(primary="f1", higher_is_better=True, max_drop=0.02)``.

    ``primary``: the key of the returned dict the gate judges (not needed when the function returns a number
    or a dict of one value); ``max_drop`` (metric units) / ``max_rel_drop`` (fraction of the reference's value):
    the allowed drop, unless the command line gives one (default: 1% relative)."""

    def declare(fn):
        setattr(fn, ATTRIBUTE, {"primary": primary, "higher_is_better": bool(higher_is_better),
                                "max_drop": max_drop, "max_rel_drop": max_rel_drop})
        return fn

    return declare(function) if callable(function) else declare


def declared_spec(name: str, function) -> MetricSpec:
    """The ``MetricSpec`` a function declares (defaults when undecorated)."""
    declared = getattr(function, ATTRIBUTE, None) or {}
    if not isinstance(declared, dict):
        raise BadInputError(f"metric {name}: its '{ATTRIBUTE}' attribute is not a declaration (use @edgeopt.metric)")
    return MetricSpec(name, declared.get("primary") or "value", declared.get("higher_is_better", True),
                      declared.get("max_drop"), declared.get("max_rel_drop"))


def call_metric(spec: MetricSpec, function, outputs: list[dict], targets: list | None) -> MetricValues:
    """Call ``function(outputs, targets)`` and check what it returns; anything but finite numbers (a number or
    a dict of named numbers holding the primary), or an exception inside it, is a ``BadInputError`` naming it."""
    try:
        result = function(outputs, targets)
    except Exception as exc:
        raise BadInputError(f"metric {spec.name} failed ({type(exc).__name__}: {first_line(exc)})") from exc
    except (SystemExit, KeyboardInterrupt) as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise BadInputError(f"metric {spec.name} raised SystemExit({exc.code!r}); edgeopt stopped") from exc
    if isinstance(result, dict):
        values = {str(k): _number(spec, f"'{k}'", v) for k, v in result.items()}
        if not values:
            raise BadInputError(f"metric {spec.name} returned an empty dict; expected named numbers")
        primary = spec.primary
        if primary not in values:
            if len(values) == 1 and primary == "value":
                primary = next(iter(values))
            else:
                raise BadInputError(f"metric {spec.name} returned {', '.join(sorted(values))} but no '{primary}' (its "
                                    f"primary value; declare it with @metric(primary=...))")
        return MetricValues(spec.name, primary, values)
    return MetricValues(spec.name, spec.primary, {spec.primary: _number(spec, "", result)})


def _number(spec: MetricSpec, key: str, value) -> float:
    where = f"metric {spec.name} returned {key + '=' if key else ''}"
    if hasattr(value, "item") and getattr(value, "size", 1) == 1 and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar or one-element array
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadInputError(f"{where}a {type(value).__name__} ({str(value)[:60]!r}); expected a number or a dict "
                            f"of named numbers")
    value = float(value)
    if not math.isfinite(value):
        raise BadInputError(f"{where}{value}; a metric must be finite")
    return value
