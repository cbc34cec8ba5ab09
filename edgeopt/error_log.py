"""Where an internal error's traceback goes: a new private file per error, in a per-user folder.

``$XDG_STATE_HOME/edgeopt/errors`` (else ``~/.local/state/edgeopt/errors``), created with mode 0700 and
checked to be a real folder owned by this user; the file is created with ``O_EXCL | O_NOFOLLOW`` and mode
0600, so a planted file or symlink is never followed or overwritten. When that folder cannot be used, a new
``mkdtemp`` folder (also 0700) is.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
import traceback
from pathlib import Path


def log_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "edgeopt" / "errors"


def write_traceback(exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to a new private file; return its path (``None`` if nothing could be written)."""
    text = "".join(traceback.format_exception(exc))
    for folder in (_private_folder(log_dir()), None):
        try:
            folder = folder or Path(tempfile.mkdtemp(prefix="edgeopt-error-"))
            path = folder / f"error-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            return path
        except OSError:
            continue
    return None


def _private_folder(folder: Path) -> Path | None:
    """``folder``, created 0700 if missing, when it is a real folder of this user that others cannot write."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    return folder
