"""SIGINT, SIGTERM and SIGHUP all interrupt a run the same way: as an exception, so every ``finally`` and
context manager runs (temporary siblings and folders removed, measuring child processes killed by
``subprocess.run``), and the process exits with 128 + the signal number.

Lean module: standard library only (the device validator uses it too).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(KeyboardInterrupt):
    """The run was stopped by a signal; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {self.name}")


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within the block, the handled signals raise ``Terminated``; the previous handlers come back after."""
    try:
        previous = {sig: signal.signal(sig, _raise) for sig in HANDLED}
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise(signum, frame) -> None:
    for sig in HANDLED:  # a second signal must not cut the cleanup short
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def is_user_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a real interruption (a signal), not user code raising KeyboardInterrupt itself."""
    return isinstance(exc, Terminated)
