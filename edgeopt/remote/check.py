"""Is a device ready to measure on? Reachable, and its Python has numpy and the runtime its profile needs."""

from __future__ import annotations

from dataclasses import dataclass

from edgeopt.remote.devices import Device, load_device
from edgeopt.remote.run import facts, pip_line
from edgeopt.targets import Target, load_target


@dataclass(frozen=True)
class Readiness:
    device: Device
    target: Target
    facts: dict

    @property
    def missing(self) -> list[str]:
        packages = self.facts["packages"]
        return [name for name in ("numpy", self.target.settings.runtime) if not packages.get(name)]

    @property
    def ready(self) -> bool:
        return not self.missing

    @property
    def problem(self) -> str | None:
        if self.ready:
            return None
        return f"{self.device.python} lacks {', '.join(self.missing)}; on the device run: " \
               f"{pip_line(self.device.python, self.target.settings.runtime)}"

    def describe(self) -> dict:
        return {"device": self.device.describe(), "profile": self.target.name, "reachable": True,
                "ready": self.ready, "missing": self.missing, "install": self.problem and
                pip_line(self.device.python, self.target.settings.runtime), **self.facts}

    def lines(self) -> list[str]:
        host, packages = self.facts["host"], self.facts["packages"]
        memory = f"{host['memory_bytes'] / 2**30:.1f} GiB" if host.get("memory_bytes") else "unknown memory"
        versions = ", ".join(f"{k} {v or 'missing'}" for k, v in packages.items())
        lean = self.facts["lean_package"]
        return [
            f"{self.device.name} ({self.device.address}): reachable, instance of {self.target.name}",
            f"  cpu: {host['cpu_model']} ({host['machine']}, {host['usable_cpus']} CPUs usable; flags: "
            f"{' '.join(host['cpu_flags']) or 'none of note'}), {memory}, {host['os']}",
            f"  python: {self.facts['python_executable']} {host['python']}; {versions}",
            f"  work dir: {self.facts['work_dir']} ({self.facts['free_bytes'] / 1e9:.1f} GB free); lean package "
            f"{lean['bytes'] / 1e3:.1f} kB ({lean['files']} files)",
            "  ready to measure" if self.ready else f"  NOT READY: {self.problem}",
        ]


def check_device(spec: str, target: str | None = None) -> Readiness:
    device = load_device(spec, target)
    profile = load_target(target or device.profile) if (target or device.profile) else None
    if profile is None:
        from edgeopt.errors import BadInputError

        raise BadInputError(f"{spec}: an ssh:// device needs --target (the profile it is an instance of)")
    return Readiness(device, profile, facts(device))
