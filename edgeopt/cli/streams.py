"""Keep stdout for results and stderr for one error line: libraries' progress bars and logs go to stderr only
when it is a terminal (and not --quiet); otherwise nowhere. ``warn`` still reaches the user's stderr."""

from __future__ import annotations

import contextlib
import os
import sys

import click

_user_stderr: list = []  # the stderr the user sees, while library output is redirected


@contextlib.contextmanager
def library_output(quiet: bool):
    """Within the block, anything printed to stdout (NNCF's progress bars, say; C++ code's too, such as torch's
    ONNX exporter's IR dump when an export fails, which broke ``--json -``) goes to stderr when that is a
    terminal; it is dropped with ``quiet`` or when stderr is a file or pipe (a log, a CI job)."""
    _user_stderr.append(sys.stderr)
    try:
        if quiet or not _isatty(sys.stderr):
            with (open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink),
                  _descriptor_1(sink)):
                yield
        else:
            with contextlib.redirect_stdout(sys.stderr), _descriptor_1(sys.stderr):
                yield
    finally:
        _user_stderr.pop()


@contextlib.contextmanager
def _descriptor_1(stream):
    """The process's file descriptor 1 pointed at ``stream``'s within the block: native code writes there, past
    ``sys.stdout``. Nothing changes where either has no descriptor (a test runner's captured streams)."""
    try:
        target = stream.fileno()
        sys.__stdout__.flush()
        saved = os.dup(1)
    except (AttributeError, OSError, ValueError):
        yield
        return
    _flush_native()
    os.dup2(target, 1)
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.__stdout__.flush()  # what Python code wrote to the real stdout within the block goes with it
        _flush_native()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_native() -> None:
    """Flush C's stdio buffers (C++'s std::cout shares them), so that nothing buffered crosses the switch."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def warn(message: str) -> None:
    """One ``edgeopt: warning: ...`` line on the user's stderr, even inside ``library_output``."""
    click.echo(f"edgeopt: warning: {message}", file=_user_stderr[0] if _user_stderr else sys.stderr)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
