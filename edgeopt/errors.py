"""Typed exceptions. Library code raises these; only the CLI turns them into messages and exit codes.

Exit codes (see CONVENTIONS): 0 ok, 1 internal error, 2 bad input or usage, 3 quality gate failed,
4 device budget failed.
"""


class EdgeoptError(Exception):
    """Base class: carries the process exit code the CLI should use."""

    exit_code = 1


class BadInputError(EdgeoptError):
    """A model, data set, profile or option the user gave is missing, malformed or inconsistent."""

    exit_code = 2


class QualityGateError(EdgeoptError):
    """A compressed artifact lost more accuracy/fidelity than allowed."""

    exit_code = 3


class BudgetError(EdgeoptError):
    """An artifact does not meet a device profile's budgets."""

    exit_code = 4


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, for one-line error reports."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else type(exc).__name__
