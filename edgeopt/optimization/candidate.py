"""One candidate of the search: what was built, how good it is, how it measured against the device's budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgeopt.device.budgets import BudgetCheck
from edgeopt.errors import BadInputError

TIE_TOLERANCE = 0.03  # objective values within 3% count as a tie (measurement noise); ties go to the smaller file
BUILD_FAILED = "build failed: "  # how a candidate's ``skipped`` starts when its build refused the inputs


def build_failures(skipped) -> list[str]:
    """Why candidates could not be built (their ``skipped`` texts), each reason once, in the order met."""
    return list(dict.fromkeys(text[len(BUILD_FAILED):] for text in skipped if (text or "").startswith(BUILD_FAILED)))


@dataclass
class Candidate:
    label: str
    stage: str
    precision: str  # the model precision the device must run for this candidate (the plan's)
    recipe: str
    eligible: bool  # the device runs this precision (the FP32 baseline is measured even when it does not)
    skipped: str | None = None  # why it was not built or measured
    artifact: Path | None = None  # the model file the device's runtime loads (in the cache)
    file_bytes: int | None = None
    top1: float | None = None
    reference_top1: float | None = None
    cosine: float | None = None
    metric: dict | None = None  # the task metric's check (MetricCheck.describe()), when the gate has one
    gate_passed: bool | None = None
    gate_check: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)  # see budgets.BUDGET_FIELDS
    checks: list[BudgetCheck] = field(default_factory=list)
    validation: dict | None = None  # ValidationReport.to_dict()
    timings_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    built: str | None = None  # the precision label of what was built (e.g. "int4/int8 weights")
    repair: dict | None = None  # what int8_repair did (its decision in the compress report), when it ran
    reused: dict[str, bool] = field(default_factory=lambda: {"artifact": False, "measurement": False})
    evaluation: tuple | None = field(default=None, repr=False)  # (original, artifact) evaluate.Quality, once built

    @property
    def measured(self) -> bool:
        return self.validation is not None

    @property
    def budgets_passed(self) -> bool:
        return self.measured and all(check.passed for check in self.checks)

    @property
    def passed(self) -> bool:
        """Eligible, within the quality gate and every budget."""
        return self.eligible and bool(self.gate_passed) and self.budgets_passed

    @property
    def failing(self) -> list[BudgetCheck]:
        return [check for check in self.checks if not check.passed]

    @property
    def top1_drop(self) -> float | None:
        if self.top1 is None or self.reference_top1 is None:
            return None
        return self.reference_top1 - self.top1

    def overshoot(self) -> tuple[int, float]:
        """How far from passing: failed budgets, then the sum of their relative excess."""
        excess = sum(1.0 if c.measured is None else (c.measured - c.budget) / c.budget for c in self.failing)
        return len(self.failing), excess

    def describe(self) -> dict:
        return {
            "label": self.label, "stage": self.stage, "precision": self.precision, "built_precision": self.built,
            "recipe": self.recipe,
            "eligible": self.eligible, "skipped": self.skipped, "artifact": str(self.artifact) if self.artifact else None,
            "file_bytes": self.file_bytes,
            "quality": {"top1": self.top1, "reference_top1": self.reference_top1, "top1_drop": self.top1_drop,
                        "cosine": self.cosine, "metric": self.metric, "gate_passed": self.gate_passed, "gate_check": self.gate_check},
            "figures": self.figures, "checks": [c.describe() for c in self.checks],
            "budgets_passed": self.budgets_passed if self.measured else None, "passed": self.passed,
            "latency_ms": self.validation["latency_ms"] if self.validation else None,
            "measured_with": self.validation["measured_with"]["summary"] if self.validation else None,
            "notes": self.notes + (self.validation["notes"] if self.validation else []),
            "reused": self.reused, "timings_ms": self.timings_ms,
            **({"repair": self.repair} if self.repair else {}),
        }


def choose(candidates: list[Candidate], objective: str) -> Candidate | None:
    """The passing candidate with the best ``objective`` figure (lower is better); near-ties → smaller file."""
    passing = [c for c in candidates if c.passed]
    if not passing:
        return None
    passing = not_slower_than_float(passing)
    passing = [c for c in passing if c.figures.get(objective) is not None]
    if not passing:
        raise BadInputError(f"objective {objective} could not be measured on this host; choose another --objective")
    best = min(c.figures[objective] for c in passing)
    tied = [c for c in passing if c.figures[objective] <= best * (1 + TIE_TOLERANCE)]
    return min(tied, key=lambda c: (c.file_bytes, c.figures[objective]))


FLOAT_PRECISIONS = ("fp32", "fp16")


def not_slower_than_float(passing: list[Candidate]) -> list[Candidate]:
    """Drop quantized candidates whose p50 is above the fastest passing float candidate's (beyond the tie
    tolerance), with a note: whatever the objective, a smaller artifact that runs slower than float is no win."""
    floats = [c.figures["p50_ms"] for c in passing if c.precision in FLOAT_PRECISIONS and c.figures.get("p50_ms")]
    if not floats:
        return passing
    limit = min(floats) * (1 + TIE_TOLERANCE)
    kept = []
    for candidate in passing:
        p50 = candidate.figures.get("p50_ms")
        if candidate.precision not in FLOAT_PRECISIONS and p50 is not None and p50 > limit:
            candidate.notes.append(f"slower than float ({p50:.3f} ms p50 vs {min(floats):.3f} ms): not chosen")
            continue
        kept.append(candidate)
    return kept


def closest(candidates: list[Candidate]) -> Candidate | None:
    """Among eligible candidates within the quality gate, the one that misses the fewest budgets by least
    (measured ones first)."""
    pool = [c for c in candidates if c.eligible and c.gate_passed]
    return min(pool, key=lambda c: (not c.measured, c.overshoot())) if pool else None
