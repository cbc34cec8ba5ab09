"""Run user-supplied Python (``file.py:function`` specs for model factories and data hooks)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from edgeopt.device.pyfile import import_file
from edgeopt.errors import BadInputError, first_line
from edgeopt.signals import is_user_interrupt


def is_function_spec(text: str) -> bool:
    """True for ``something.py:identifier``."""
    head, sep, tail = text.rpartition(":")
    return bool(sep) and head.endswith(".py") and tail.isidentifier()


def load_function(path: Path, name: str, what: str) -> Callable:
    """Import the Python file ``path`` and return its function ``name``; every failure is a ``BadInputError``.
    The file's folder comes first on ``sys.path``, as ``python path`` puts it, so the file (and the function,
    when called) can import its neighbours."""
    if not path.is_file():
        raise BadInputError(f"{path}: no such {what} file")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = import_file(path, "edgeopt_user")
    except Exception as exc:
        raise BadInputError(f"{path}: cannot import ({first_line(exc)})") from exc
    except (SystemExit, KeyboardInterrupt) as exc:
        if is_user_interrupt(exc):
            raise
        raise BadInputError(f"{path}: importing it raised {_exit_text(exc)}; edgeopt stopped") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise BadInputError(f"{path}: has no function '{name}'")
    return function


def call(path: Path, name: str, function: Callable):
    """Call a user function; an exception inside it becomes a one-line ``BadInputError``."""
    try:
        return function()
    except Exception as exc:
        raise BadInputError(f"{path}:{name} failed ({first_line(exc)})") from exc
    except (SystemExit, KeyboardInterrupt) as exc:  # user code must not end (or fake the success of) the run
        if is_user_interrupt(exc):
            raise
        raise BadInputError(f"{path}:{name} raised {_exit_text(exc)}; edgeopt stopped") from exc


def _exit_text(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (sys.exit)"
    return "KeyboardInterrupt"
