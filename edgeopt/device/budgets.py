"""Device budgets (memory, latency, variance) and the check of measured figures against them.

Lean module: standard library only, so a bundle manifest can carry budgets as JSON to a device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

from edgeopt.errors import BadInputError

# budget field -> (measurement key, unit, what the budget limits)
BUDGET_FIELDS: dict[str, tuple[str, str, str]] = {
    "max_file_mb": ("file_mb", "MB", "artifact size on disk"),
    "max_peak_rss_mb": ("peak_rss_mb", "MB", "peak resident memory of the inference process"),
    "p50_ms": ("p50_ms", "ms", "median latency per call, at the measured input shapes"),
    "p95_ms": ("p95_ms", "ms", "95th percentile latency per call"),
    "p99_ms": ("p99_ms", "ms", "99th percentile latency per call"),
    "max_cv": ("cv", "", "coefficient of variation of latency (stddev / mean)"),
    "max_p99_over_p50": ("p99_over_p50", "", "tail ratio p99 / p50"),
}


@dataclass(frozen=True)
class Budgets:
    """Upper limits; ``None`` means no budget for that figure. MB are 10^6 bytes."""

    max_file_mb: float | None = None
    max_peak_rss_mb: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_cv: float | None = None
    max_p99_over_p50: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "budgets") -> "Budgets":
        """Build from a mapping of budget names to positive finite numbers; unknown keys and bad values are errors."""
        unknown = sorted(set(data) - set(BUDGET_FIELDS))
        if unknown:
            raise BadInputError(f"{source}: unknown budget key(s) {', '.join(unknown)} "
                                f"(known: {', '.join(BUDGET_FIELDS)})")
        values = {}
        for key, value in data.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise BadInputError(f"{source}: budget '{key}' must be a positive number, got {value!r}")
            values[key] = float(value)
        return cls(**values)

    def describe(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def items(self) -> list[tuple[str, float]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class BudgetCheck:
    """One budget against its measured figure; ``margin`` is budget - measured (negative when over budget)."""

    name: str
    budget: float
    measured: float | None
    unit: str
    passed: bool
    margin: float | None
    status: str = "measured"  # or "emulated" (figure from another machine), "unreliable" (noisy host)
    reason: str | None = None  # why emulated / unreliable

    @property
    def verdict(self) -> str:
        """PASS / FAIL for a figure of the device itself (or of the artifact); an emulated figure is never a
        PASS: EMULATED when within budget, FAIL (emulated) when not; UNRELIABLE for spread on a busy host."""
        if self.status == "emulated":
            return "EMULATED" if self.passed else "FAIL (emulated)"
        if self.status == "unreliable":
            return "UNRELIABLE"
        return "PASS" if self.passed else "FAIL"

    @property
    def margin_pct(self) -> float | None:
        return None if self.margin is None else 100.0 * self.margin / self.budget

    @property
    def description(self) -> str:
        return BUDGET_FIELDS[self.name][2]

    def describe(self) -> dict:
        return asdict(self) | {"margin_pct": self.margin_pct, "description": self.description,
                               "verdict": self.verdict}


LATENCY_BUDGETS = ("p50_ms", "p95_ms", "p99_ms", "max_cv", "max_p99_over_p50")  # timing: only the device's count
SPREAD_BUDGETS = ("max_cv", "max_p99_over_p50")


def mark_emulated(checks: list[BudgetCheck], reason: str, *, memory: bool) -> list[BudgetCheck]:
    """``checks`` with the timing budgets (and, with ``memory``, another architecture's, the memory budget)
    marked emulated with ``reason``: figures of a host that is not the device, never a device PASS."""
    emulated = set(LATENCY_BUDGETS) | ({"max_peak_rss_mb"} if memory else set())
    return [replace(c, status="emulated", reason=reason) if c.name in emulated else c for c in checks]


def check_budgets(budgets: Budgets, measurement: Mapping[str, float | None]) -> list[BudgetCheck]:
    """Compare each set budget with ``measurement[key]`` (keys: file_mb, peak_rss_mb, p50_ms, p95_ms,
    p99_ms, cv, p99_over_p50). A budget whose figure was not measured fails: it cannot be shown to hold."""
    checks = []
    for name, budget in budgets.items():
        key, unit, _ = BUDGET_FIELDS[name]
        measured = measurement.get(key)
        if measured is None:
            checks.append(BudgetCheck(name, budget, None, unit, False, None))
        else:
            checks.append(BudgetCheck(name, budget, float(measured), unit, measured <= budget, budget - measured))
    return checks
