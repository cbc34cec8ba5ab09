"""Where the search runs its candidate builds and host measurements: the seam an executor plugs into.

``search`` hands each build and each host measurement to an executor as a picklable job (a
``functools.partial`` of a module-level function) with the candidate's label. ``Inline`` runs them here, one
after another; ``edgeopt.fleet.executors`` supplies executors that take a measurement slot on their node and
run the jobs in this process or as Ray tasks on a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Executor(Protocol):
    def build(self, job: Callable[[], object], label: str) -> None:
        """Run a build job (it writes its cache entry atomically); its return value is dropped."""

    def measure(self, job: Callable[[], T], label: str) -> T:
        """Run a host measurement job and return its result (a ``ValidationReport``)."""


class Inline:
    """Run every job here, in order."""

    def build(self, job: Callable[[], object], label: str) -> None:
        job()

    def measure(self, job: Callable[[], T], label: str) -> T:
        return job()
