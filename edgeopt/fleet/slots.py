"""Clean measurement slots: a latency measurement never runs while a build runs on the same machine.

Builds share the machine's slot, a measurement holds it alone (``node_slot``): a pair of ``flock`` locks in a
machine-local folder (``$EDGEOPT_SLOT_DIR``, default the system's temp folder), with a turnstile so that a
waiting measurement keeps new builds out until it has run (no starvation). The kernel drops a killed
process's locks, so a worker killed mid-build never wedges the machine. On a Ray cluster each node also
offers the custom resource ``edgeopt_node_slot`` = 1: builds take a sliver of it, measurements all of it, so
Ray never places a measurement beside a build on the same node (the lock covers several Ray nodes on one
machine too).

Every build and measurement is recorded as a ``SlotEvent``: where it ran, when it held the slot, the load.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("build", "measure")


@dataclass(frozen=True)
class SlotEvent:
    """One build or host measurement: where it ran and when it held its slot (Unix seconds), under what load."""

    pair: str
    candidate: str
    kind: str  # build | measure
    host: str  # the machine (host name)
    node: str  # the Ray node id (first 12 hex digits), or "local"
    pid: int
    start: float  # slot acquired
    end: float  # slot released
    waited_s: float  # time spent waiting for the slot
    load_1min: float  # the machine's 1-minute load average when the slot was acquired
    cpus: int  # CPUs this process may use

    def describe(self) -> dict:
        return asdict(self)


def slot_dir() -> Path:
    return Path(os.environ.get("EDGEOPT_SLOT_DIR") or tempfile.gettempdir())


@contextlib.contextmanager
def node_slot(exclusive: bool) -> Iterator[None]:
    """Hold this machine's slot: shared (a build) or exclusive (a measurement)."""
    folder = slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"edgeopt-{os.getuid()}"
    with open(folder / f"{tag}-slot-turnstile.lock", "a") as turnstile, open(folder / f"{tag}-slot.lock", "a") as slot:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(slot, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:  # builds pass the turnstile; a measurement keeps it until it is done
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(slot, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


def run_in_slot(job: Callable[[], object], kind: str, pair: str, candidate: str, node: str = "local",
                keep_result: bool = True) -> tuple[object, SlotEvent]:
    """Run ``job`` holding the machine's slot (exclusively for a measurement); return its result (``None``
    unless ``keep_result``) and the event."""
    asked = time.time()
    with node_slot(exclusive=kind == "measure"):
        start = time.time()
        load = os.getloadavg()[0]
        result = job()
        end = time.time()
    event = SlotEvent(pair, candidate, kind, socket.gethostname(), node, os.getpid(), start, end,
                      round(start - asked, 4), round(load, 2), len(os.sched_getaffinity(0)))
    return (result if keep_result else None), event


def overlaps(events: list[SlotEvent]) -> list[tuple[SlotEvent, SlotEvent]]:
    """Pairs (measurement, build) on the same machine whose slot times overlap: empty when the slots held."""
    found = []
    for measure in (e for e in events if e.kind == "measure"):
        for build in (e for e in events if e.kind == "build" and e.host == measure.host):
            if build.start < measure.end and measure.start < build.end:
                found.append((measure, build))
    return found
