"""How the search picks among candidates: lowest objective, a 3% tie band won by the smaller file, and the
closest miss when none passes. Plain fastest-wins would fail these."""

from __future__ import annotations

import pytest

from edgeopt.device.budgets import BudgetCheck
from edgeopt.errors import BadInputError
from edgeopt.optimization.candidate import TIE_TOLERANCE, Candidate, choose, closest


def candidate(label, p50, file_bytes, *, gate=True, eligible=True, over=(), measured=True) -> Candidate:
    checks = [BudgetCheck("p50_ms", 10.0, 10.0 * (1 + excess), "ms", excess <= 0, -10.0 * excess) for excess in over]
    return Candidate(label, "stage", "int8", label, eligible, file_bytes=file_bytes, gate_passed=gate,
                     figures={"p50_ms": p50}, checks=checks or [BudgetCheck("p50_ms", 10.0, p50, "ms", True, 10 - p50)],
                     validation={"latency_ms": {}} if measured else None)


def test_lowest_objective_wins_outside_the_tie_band():
    fast, slow = candidate("fast", 1.0, 900), candidate("slow", 1.0 * (1 + 2 * TIE_TOLERANCE), 100)
    assert choose([slow, fast], "p50_ms") is fast


def test_within_three_percent_the_smaller_file_wins():
    fast_big, near_small = candidate("fast-big", 1.00, 900), candidate("near-small", 1.025, 100)
    assert TIE_TOLERANCE == 0.03
    assert choose([fast_big, near_small], "p50_ms") is near_small  # fastest-wins would pick fast-big
    just_outside = candidate("outside", 1.031, 50)
    assert choose([fast_big, just_outside], "p50_ms") is fast_big


def test_only_passing_candidates_are_chosen():
    failed_gate = candidate("lossy", 0.5, 10, gate=False)
    ineligible = candidate("fp16", 0.5, 10, eligible=False)
    over_budget = candidate("big", 0.5, 10, over=(0.5,))
    ok = candidate("ok", 2.0, 1000)
    assert choose([failed_gate, ineligible, over_budget, ok], "p50_ms") is ok
    assert choose([failed_gate, ineligible, over_budget], "p50_ms") is None


def test_objective_not_measured_is_bad_input():
    c = candidate("c", 1.0, 10)
    c.figures = {"p50_ms": None}
    with pytest.raises(BadInputError, match="could not be measured"):
        choose([c], "p50_ms")


def test_closest_misses_fewest_budgets_by_least_and_prefers_measured():
    two_small = candidate("two-small", 1, 10, over=(0.1, 0.1))
    one_big = candidate("one-big", 1, 10, over=(0.9,))
    one_small = candidate("one-small", 1, 10, over=(0.2,))
    lossy = candidate("lossy", 1, 10, gate=False, over=(0.01,))
    unmeasured = candidate("unmeasured", 1, 10, measured=False)
    unmeasured.checks = []
    assert closest([two_small, one_big, one_small, lossy, unmeasured]) is one_small
    assert closest([two_small, one_big]) is one_big  # fewer failed budgets first, then the smaller excess
    assert closest([unmeasured, two_small]) is two_small
    assert closest([lossy]) is None
