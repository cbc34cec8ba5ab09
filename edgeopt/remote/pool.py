"""A pool of devices of one profile measuring candidates in parallel: one measurement per device slot at a
time here (and, across edgeopt runs, per the device's own lock), results cached by (artifact hash, device
identity, runtime version, settings)."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from pathlib import Path

from edgeopt.device.validate import ValidationReport
from edgeopt.errors import BadInputError, DeviceError
from edgeopt.optimization.cache import Cache, digest, files_digest
from edgeopt.remote.check import Readiness
from edgeopt.remote.devices import Device, load_device
from edgeopt.remote.results import to_report
from edgeopt.remote.run import facts, measure
from edgeopt.targets import Target


@dataclass(frozen=True)
class PooledDevice:
    device: Device
    identity: str  # the device itself: machine id (or host name) and CPU, not just its address
    runtime_version: str


class DevicePool:
    """Devices measuring for one profile; ``measure`` blocks until a slot is free (thread-safe)."""

    def __init__(self, specs: list[str], target: Target, cache: Cache | None = None):
        if not specs:
            raise BadInputError("a device pool needs at least one device")
        self.target, self.cache = target, cache
        self.members: list[PooledDevice] = []
        for spec in dict.fromkeys(specs):
            device = load_device(spec, target.name if spec.startswith("ssh://") else None)
            if device.profile is not None and device.profile != target.name:
                raise BadInputError(f"device '{device.name}' is a {device.profile}, not {target.name}: a pool "
                                    f"serves one profile")
            found = facts(device)
            readiness = Readiness(device, target, found)
            if not readiness.ready:
                raise DeviceError(f"device '{device.name}' is not ready: {readiness.problem}")
            identity = f"{found['machine_id'] or found['hostname']}/{found['host']['cpu_model']}"
            self.members.append(PooledDevice(device, identity, found["packages"][target.settings.runtime]))
        self._slots: queue.Queue[PooledDevice] = queue.Queue()
        for member in self.members:
            for _ in range(member.device.concurrency):
                self._slots.put(member)

    @property
    def slots(self) -> int:
        return sum(m.device.concurrency for m in self.members)

    def describe(self) -> list[dict]:
        return [{"device": m.device.name, "address": m.device.address, "identity": m.identity,
                 "runtime_version": m.runtime_version, "concurrency": m.device.concurrency} for m in self.members]

    def measure(self, model: Path, *, runs: int, warmup: int, min_seconds: float,
                input_shapes: dict | None = None) -> ValidationReport:
        settings = {"runtime": self.target.settings.describe(), "runs": runs, "warmup": warmup,
                    "min_seconds": float(min_seconds), "input_shapes": {k: list(v) for k, v in
                                                                        (input_shapes or {}).items()}}
        artifact = files_digest(model)
        if self.cache is not None:
            for member in self.members:  # measured before on any device of the pool
                stored = self.cache.load_measurement(f"device-{artifact}", self._key(member, settings))
                if stored is not None:
                    return to_report(stored, self.target.budgets,
                                     device_note=f"reused: measured on device '{member.device.name}' before")
        member = self._slots.get()
        try:
            result = measure(member.device, self.target, model, runs=runs, warmup=warmup, min_seconds=min_seconds,
                             input_shapes=input_shapes)
        finally:
            self._slots.put(member)
        if self.cache is not None:
            self.cache.store_measurement(f"device-{artifact}", self._key(member, settings), result.result)
        return result.report

    @staticmethod
    def _key(member: PooledDevice, settings: dict) -> str:
        return digest({"device": member.identity, "runtime_version": member.runtime_version, **settings})
