"""Atomic outputs: write into a temporary sibling, rename into place only when complete.

Temporary siblings are named ``.NAME.edgeopt-PID-XXXX.tmp`` (a backup of the previous output during the final
swap ``.NAME.edgeopt-PID-old``), so a later run can tell the leftovers of a killed run (its PID is gone) from
those of a run still in progress, and clean them up (``clean_stale``). OS write errors (a full disk, a
read-only folder) become a one-line ``BadInputError`` "cannot write TARGET: ...".
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from edgeopt.errors import BadInputError

_TAG = "edgeopt"
# errno values that mean "this place cannot take the output", not "edgeopt has a bug"
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.ENOTDIR,
                errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.EIO, errno.ENOENT}
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO}  # whatever the operation


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; on success it replaces ``target``.

    On any exception (an interruption included) the temporary directory is removed and ``target`` is left
    untouched. Whether ``target`` may be replaced at all is the caller's question (``edgeopt.out_guard``).
    """
    target = Path(os.path.abspath(target))
    with write_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_TAG}-{os.getpid()}-", suffix=".tmp",
                                    dir=target.parent))
        os.chmod(tmp, 0o777 & ~_umask())
    try:
        with write_errors(target, DISK_ERRNOS):
            try:
                yield tmp
            except WriteError as exc:  # a file inside the temporary folder: name the output the user gave
                if exc.target != tmp and tmp not in exc.target.parents:
                    raise
                raise WriteError(target, exc.reason) from exc
        with write_errors(target):
            _swap(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary sibling of ``target`` for writing; rename it over ``target`` on success."""
    target = Path(os.path.abspath(target))
    with write_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{_TAG}-{os.getpid()}-", suffix=".tmp",
                                   dir=target.parent)
        os.chmod(tmp, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            with write_errors(target):
                handle.flush()
                os.fsync(handle.fileno())
        with write_errors(target):
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(target: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``target``."""
    with atomic_file(target, "w") as handle:
        handle.write(text)


@contextlib.contextmanager
def write_errors(target: Path, errnos: set[int] = WRITE_ERRNOS) -> Iterator[None]:
    """Turn an OS error about the place being written into a one-line ``WriteError``."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in errnos:
            raise
        raise WriteError(target, exc.strerror or str(exc)) from exc


class WriteError(BadInputError):
    """The output could not be written (full disk, read-only folder, a folder in the way): bad input, exit 2."""

    def __init__(self, target: Path, reason: str):
        super().__init__(f"cannot write {target}: {reason}")
        self.target, self.reason = Path(target), reason


def clean_stale(target: Path) -> list[Path]:
    """Remove temporary siblings of ``target`` left by edgeopt runs that no longer exist; if such a run was
    killed in the middle of its final swap, put the previous output back first. Returns what was removed."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.{_TAG}-(\d+)-(.*)$")
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for path in sorted(siblings):
        match = pattern.match(path.name)
        if not match or _alive(int(match.group(1))):
            continue
        if match.group(2) == "old" and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.replace(path, target)  # the swap was cut between its two renames: restore the old output
                continue
        _remove(path)
        removed.append(path)
    return removed


def _swap(tmp: Path, target: Path) -> None:
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    backup = target.with_name(f".{target.name}.{_TAG}-{os.getpid()}-old")
    _remove(backup)
    os.replace(target, backup)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(backup, target)
        raise
    _remove(backup)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
