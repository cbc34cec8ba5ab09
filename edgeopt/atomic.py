"""Atomic outputs: write into a temporary sibling, rename into place only when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; on success it replaces ``target``.

    On any exception the temporary directory is removed and ``target`` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            os.replace(target, backup)
            os.replace(tmp, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary sibling of ``target`` for writing; rename it over ``target`` on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(target: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``target``."""
    with atomic_file(target, "w") as handle:
        handle.write(text)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
