"""Executors for a fleet: ``local`` runs the pairs one after another in this process; ``ray`` runs every
candidate build and host measurement as a Ray task, the pairs side by side. Both hold the machine's slot
(``edgeopt.fleet.slots``) and record each build and measurement.

``ray`` starts a one-machine cluster here (``ray.init()``, one worker per CPU) or joins ``ray[=ADDRESS]``
(``ray start --head --resources='{"edgeopt_node_slot": 1}'`` on each node; ``auto`` finds the running one).
Every worker must see the cache folder at the same path (a shared file system): builds write their entries
there atomically, and this process reads them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from edgeopt.errors import BadInputError, EdgeoptError, first_line
from edgeopt.fleet.slots import SlotEvent, run_in_slot

T = TypeVar("T")
NODE_SLOT = "edgeopt_node_slot"
BUILD_SHARE = 0.001  # of a node's slot: up to 1000 builds side by side, none beside a measurement
RETRIES = 3  # a task whose worker died (killed, out of memory) runs again, up to this many times


class WorkerLost(EdgeoptError):
    """A build or measurement's worker died more often than it is retried (exit 1: the run is incomplete)."""


class LocalExecutor:
    """Pairs in order, each build and measurement here, under the machine's slot."""

    name = "local"

    def __init__(self):
        self.events: list[SlotEvent] = []

    def map(self, run_pair: Callable[[object], T], pairs: list) -> list[T]:
        return [run_pair(pair) for pair in pairs]

    def for_pair(self, pair: str) -> "_LocalPair":
        return _LocalPair(self, pair)

    def describe(self) -> dict:
        return {"name": self.name, "address": None, "nodes": 1, "build_slots": 1}

    def close(self) -> None:
        pass


class _LocalPair:
    def __init__(self, parent: LocalExecutor, pair: str):
        self.parent, self.pair = parent, pair

    def build(self, job: Callable[[], object], label: str) -> None:
        _, event = run_in_slot(job, "build", self.pair, label, keep_result=False)
        self.parent.events.append(event)

    def measure(self, job: Callable[[], T], label: str) -> T:
        result, event = run_in_slot(job, "measure", self.pair, label)
        self.parent.events.append(event)
        return result


CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """Refuse an address nothing answers at within ``CONNECT_TIMEOUT_S`` (``ray.init`` itself retries for
    minutes before it gives up)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise BadInputError(f"--executor ray={address}: the address must be HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise BadInputError(f"--executor ray={address}: no Ray cluster answers there ({first_line(exc)})") from None


class RayExecutor:
    """Builds and measurements as Ray tasks; the pairs' searches run side by side here, one thread each, taking
    turns on this process (``_driver``) and waiting for their tasks without it."""

    name = "ray"

    def __init__(self, address: str | None = None):
        if address and address != "auto":
            _check_reachable(address)
        try:
            import ray
        except ImportError:
            raise BadInputError("--executor ray needs Ray: pip install 'edgeopt[ray]'") from None
        self._ray = ray
        try:
            if address:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            else:
                ray.init(num_cpus=len(os.sched_getaffinity(0)), resources={NODE_SLOT: 1.0}, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise BadInputError(f"--executor ray{'=' + address if address else ''}: cannot start or join the Ray "
                                f"cluster ({first_line(exc)})") from None
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if not any(n["Resources"].get(NODE_SLOT) for n in nodes):
            ray.shutdown()
            raise BadInputError(f"the Ray cluster at {address} offers no '{NODE_SLOT}' resource: start each node "
                                f"with ray start ... --resources='{{\"{NODE_SLOT}\": 1}}'")
        self.address = address
        self.nodes = [n for n in nodes if n["Resources"].get(NODE_SLOT)]
        self.events: list[SlotEvent] = []
        self._driver = threading.Lock()
        # two functions, so a worker's process title says which it runs (ray::remote_build, ray::remote_measure)
        self._build = ray.remote(remote_build).options(num_cpus=1, resources={NODE_SLOT: BUILD_SHARE},
                                                       max_retries=RETRIES)
        self._measure = ray.remote(remote_measure).options(num_cpus=1, resources={NODE_SLOT: 1.0},
                                                           max_retries=RETRIES)

    def map(self, run_pair: Callable[[object], T], pairs: list) -> list[T]:
        def run(pair):
            with self._driver:
                return run_pair(pair)

        pool = ThreadPoolExecutor(max_workers=max(1, len(pairs)), thread_name_prefix="edgeopt-pair")
        try:
            return list(pool.map(run, pairs))
        except BaseException:  # interrupted: end the tasks now, so the pairs' threads stop waiting for them
            self._ray.shutdown()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def for_pair(self, pair: str) -> "_RayPair":
        return _RayPair(self, pair)

    def describe(self) -> dict:
        return {"name": self.name, "address": self.address, "nodes": len(self.nodes),
                "build_slots": int(sum(n["Resources"].get("CPU", 0) for n in self.nodes))}

    def close(self) -> None:
        self._ray.shutdown()

    def run(self, task, job: Callable[[], T], kind: str, pair: str, label: str) -> T:
        ref = task.remote(job, pair, label, _torch_threads())
        with _released(self._driver):
            try:
                result, event = self._ray.get(ref)
            except self._ray.exceptions.RayTaskError as exc:  # the job's own error, as raised there
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None
            except (self._ray.exceptions.WorkerCrashedError, self._ray.exceptions.NodeDiedError,
                    self._ray.exceptions.ObjectLostError) as exc:
                raise WorkerLost(f"{kind} of {pair} {label}: its Ray worker died {RETRIES + 1} times "
                                 f"({type(exc).__name__})") from None
        self.events.append(event)
        return result


class _RayPair:
    def __init__(self, parent: RayExecutor, pair: str):
        self.parent, self.pair = parent, pair

    def build(self, job: Callable[[], object], label: str) -> None:
        self.parent.run(self.parent._build, job, "build", self.pair, label)

    def measure(self, job: Callable[[], T], label: str) -> T:
        return self.parent.run(self.parent._measure, job, "measure", self.pair, label)


def remote_build(job: Callable[[], object], pair: str, label: str, threads: int | None):
    """A Ray task: a build under this machine's (shared) slot."""
    return _remote(job, "build", pair, label, threads)


def remote_measure(job: Callable[[], T], pair: str, label: str, threads: int | None):
    """A Ray task: a host measurement holding this machine's slot alone."""
    return _remote(job, "measure", pair, label, threads)


def _remote(job: Callable[[], object], kind: str, pair: str, label: str, threads: int | None):
    """The job under this machine's slot, with the driver's torch threads (so the build's bytes are the same)."""
    import ray

    if threads:
        import torch

        torch.set_num_threads(threads)
    node = ray.get_runtime_context().get_node_id()[:12]
    return run_in_slot(job, kind, pair, label, node, keep_result=kind == "measure")


def _torch_threads() -> int | None:
    """This process's torch threads, once the search has loaded torch (the workers build with as many)."""
    import sys

    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


@contextlib.contextmanager
def _released(lock: threading.Lock) -> Iterator[None]:
    lock.release()
    try:
        yield
    finally:
        lock.acquire()


def make_executor(spec: str) -> LocalExecutor | RayExecutor:
    """``local``, ``ray`` (a cluster on this machine) or ``ray=ADDRESS`` (``auto``, ``HOST:PORT``, ``ray://...``)."""
    name, _, address = spec.partition("=")
    if name == "local" and not address:
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address or None)
    raise BadInputError(f"--executor must be local, ray or ray=ADDRESS, got {spec!r}")

