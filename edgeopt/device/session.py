"""What a remote run of the validator needs on the device: a lock, so that one measurement at a time runs
per device slot, and an end tied to the SSH connection. Lean module: standard library only.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

from edgeopt.errors import BadInputError, first_line

_POLL_S = 0.2


def take_device_lock(path: str | Path, slots: int = 1, timeout_s: float = 3600.0):
    """Hold one of ``slots`` flock'd files ``path.0`` ... ``path.N-1`` until the process ends (the kernel
    releases a lock when its holder dies, however it dies). Waits up to ``timeout_s``; returns
    ``(slot_path, waited_s)`` and keeps the open file referenced in this module."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handles = [open(f"{path}.{i}", "a") for i in range(slots)]
    except OSError as exc:
        raise BadInputError(f"{path}: cannot create the device lock ({first_line(exc)})") from exc
    start = time.monotonic()
    while True:
        for i, handle in enumerate(handles):
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            for other in handles[:i] + handles[i + 1:]:
                other.close()
            _HELD.append(handle)
            return f"{path}.{i}", time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise BadInputError(f"{path}: the device stayed busy (locked by another measurement) for "
                                f"{timeout_s:.0f} s; try again later")
        time.sleep(_POLL_S)


_HELD: list = []


def exit_when_stdin_closes() -> None:
    """End this process and its children (the measuring process) when stdin reaches end-of-file: over SSH,
    when the connection drops or the host's edgeopt stops. Makes this process a process group leader."""
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)

    def watch() -> None:
        try:
            while os.read(0, 4096):  # the raw descriptor: no buffer lock held at interpreter shutdown
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="stdin-watch").start()
