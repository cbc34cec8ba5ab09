"""Describe the machine a measurement ran on, so every reported figure says where it came from."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass


def not_the_device(device: dict, machine: str, cpu_model: str, usable_cpus: int | None = None) -> str:
    """Why a host (``machine``, ``cpu_model``, ``usable_cpus``) is not the profile's ``device`` (a manifest's
    ``target.device``): another architecture, a CPU its ``cpu_match`` does not name, or none named at all (a
    generic profile: no host is its device), or fewer usable CPUs than the device's cores; "" when it is."""
    if device.get("arch") and device["arch"] != machine:
        return f"the host is {machine}, the device {device['arch']}"
    matches = device.get("cpu_match") or []
    if not matches:
        return "the profile names no CPU to recognise its device by (no cpu_match: a generic profile)"
    if not any(m.lower() in cpu_model.lower() for m in matches):
        return f"the host's CPU ({cpu_model}) is not the profiled device's ({device.get('cpu')})"
    if usable_cpus is not None and device.get("cores") and usable_cpus < device["cores"]:
        return f"the host has {usable_cpus} usable CPUs, the device {device['cores']} cores"
    return ""


@dataclass(frozen=True)
class HostInfo:
    cpu_model: str
    logical_cpus: int
    usable_cpus: int
    memory_bytes: int | None
    os: str
    machine: str
    python: str
    cpu_flags: tuple[str, ...]

    def describe(self) -> dict:
        """JSON-shaped (lists, not tuples), so a report read back equals the one written."""
        return asdict(self) | {"cpu_flags": list(self.cpu_flags)}

    def has(self, flag: str) -> bool:
        return flag in self.cpu_flags


_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                      "amx_bf16", "avx512_fp16", "asimd", "asimddp", "fphp", "asimdhp", "bf16", "i8mm", "sve")


def host_info() -> HostInfo:
    cpu_model, flags = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return HostInfo(
        cpu_model=cpu_model,
        logical_cpus=os.cpu_count() or 1,
        usable_cpus=usable,
        memory_bytes=_memory_bytes(),
        os=f"{platform.system()} {platform.release()}",
        machine=platform.machine(),
        python=platform.python_version(),
        cpu_flags=tuple(f for f in _INTERESTING_FLAGS if f in flags),
    )


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "Hardware") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or "unknown CPU", flags


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
