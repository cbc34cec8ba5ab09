"""Typed exceptions. Library code raises these; only the CLI turns them into messages and exit codes.

Exit codes (see CONVENTIONS): 0 ok, 1 internal error, 2 bad input or usage, 3 quality gate failed,
4 device budget failed, 5 no device figures (the device could not be used, or a run that requires them has
only emulated ones).
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


class DeviceError(EdgeoptError):
    """No figures from the device: it is unreachable or was lost, refused the connection or key, lacks the
    runtime or disk space, or a run that requires device figures (``--require-device``) has only emulated ones."""

    exit_code = 5


_LOCATION_PREFIXES = ("Exception from ", "Check '", "FrontEnd API failed", "[ GENERAL_ERROR ]", "Traceback")


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first informative line of an exception's message, for one-line error reports.

    Runtimes written in C++ (OpenVINO) start their messages with source locations; those lines are skipped.
    TorchScript's interpreter starts with a line saying only that it failed, and names the cause last.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_LOCATION_PREFIXES)]
    chosen = informative[0] if informative else (lines[0] if lines else type(exc).__name__)
    if chosen.startswith(_TORCHSCRIPT_HEADER):
        chosen = informative[-1]
    key = next((line for line in informative if line.lstrip("- ").startswith(_KEY_LINES)), None)
    failed = _failed_operation(informative)
    if key:  # OpenVINO's conversion report: the summary line names the ops it has no rule for
        chosen = f"{chosen.rstrip(':').split('. Failed operations')[0]}: {key.lstrip('- ')}"
    elif failed:  # or the first op it failed on, with the last line of that op's message (the reason)
        chosen = f"{chosen.rstrip(':').split('. Failed operations')[0]}: {failed}"
    elif chosen.endswith(":") and len(informative) > 1:  # a header line: say what follows
        chosen = f"{chosen} {informative[1]}"
    return chosen[:limit]


_TORCHSCRIPT_HEADER = "The following operation failed in the TorchScript interpreter"
_KEY_LINES = ("No conversion rule found for operations",)


def _failed_operation(lines: list[str]) -> str | None:
    """From OpenVINO's "Failed operations detailed log", the first failed op and the last line of its message
    ("If-13: Rank of If condition input must be equal to 0 or 1"); None for any other message."""
    starts = [i for i, line in enumerate(lines) if line.startswith("-- ") and line.endswith(" with a message:")]
    if not starts:
        return None
    block = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("-- ") or line == "Summary:":
            break
        block.append(line)
    op = lines[starts[0]][3:].removesuffix(" with a message:")
    return f"{op}: {block[-1]}" if block else None
