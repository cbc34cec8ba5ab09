"""Devices as data: ``devices.toml`` names the real devices edgeopt measures on, and how to reach them.

One table per device::

    [devices.pi5-lab]
    host = "192.168.1.40"                 # required
    profile = "raspberry-pi-5"            # required: the device profile this board is an instance of
    user = "pi"                           # default: ssh's own (your login name or ~/.ssh/config)
    port = 22
    key_file = "~/.ssh/edgeopt_ed25519"   # default: the ssh agent and ssh's default keys
    known_hosts = "strict"                # or "accept-new" (trust on first use); never "off"
    known_hosts_file = "~/.ssh/known_hosts"   # default: ssh's own
    python = "/home/pi/edgeopt-venv/bin/python"   # default "python3"
    work_dir = ".cache/edgeopt-device"    # relative to the login directory, or absolute
    concurrency = 1                       # measurements at once on this device
    connect_timeout_s = 10
    timeout_s = 900                       # one measurement, end to end
    retries = 2                           # reconnects after a transient network error

Files are read from ``$EDGEOPT_DEVICES`` (files or folders holding ``devices.toml``, ``os.pathsep``-separated),
then ``./devices.toml`` (the project), then ``$XDG_CONFIG_HOME/edgeopt/devices.toml`` (the user,
default ``~/.config/edgeopt``); the first definition of a name wins. Unknown keys and bad values are errors.
``ssh://[user@]host[:port]`` names a device inline (with ``--target`` for its profile and ssh's defaults).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgeopt.errors import BadInputError
from edgeopt.tomlio import read_toml

KNOWN_HOSTS_POLICIES = ("strict", "accept-new")

# key -> (types, default); a default of ... means required
_SCHEMA: dict[str, tuple[tuple[type, ...], object]] = {
    "host": ((str,), ...), "profile": ((str,), ...), "user": ((str,), None), "port": ((int,), 22),
    "key_file": ((str,), None), "known_hosts": ((str,), "strict"), "known_hosts_file": ((str,), None),
    "python": ((str,), "python3"), "work_dir": ((str,), ".cache/edgeopt-device"), "concurrency": ((int,), 1),
    "connect_timeout_s": ((int, float), 10), "timeout_s": ((int, float), 900), "retries": ((int,), 2),
    "description": ((str,), ""),
}


@dataclass(frozen=True)
class Device:
    """A device reachable over SSH, an instance of a device profile."""

    name: str
    host: str
    profile: str | None  # None only for an inline ssh:// device without --target
    user: str | None = None
    port: int = 22
    key_file: Path | None = None
    known_hosts: str = "strict"
    known_hosts_file: Path | None = None
    python: str = "python3"
    work_dir: str = ".cache/edgeopt-device"
    concurrency: int = 1
    connect_timeout_s: float = 10
    timeout_s: float = 900
    retries: int = 2
    description: str = ""
    source: Path | None = None

    @property
    def address(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    def describe(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def search_path() -> list[Path]:
    env = [Path(p) for p in os.environ.get("EDGEOPT_DEVICES", "").split(os.pathsep) if p]
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    files = [p / "devices.toml" if p.is_dir() else p for p in env]
    return [*files, Path.cwd() / "devices.toml", config / "edgeopt" / "devices.toml"]


def list_devices() -> list[Device]:
    """Every device on the search path (the first of a name wins), sorted by name."""
    found: dict[str, Device] = {}
    for path in search_path():
        if path.is_file():
            for device in _read(path):
                found.setdefault(device.name, device)
    return [found[name] for name in sorted(found)]


def load_device(spec: str, profile: str | None = None) -> Device:
    """A device by name (from ``devices.toml``) or an inline ``ssh://[user@]host[:port]``; ``profile``
    (``--target``) names the profile of an inline device and must agree with a named device's."""
    if spec.startswith("ssh://"):
        return _from_url(spec, profile)
    for device in list_devices():
        if device.name == spec:
            if profile is not None and Path(profile).stem != device.profile:
                raise BadInputError(f"device '{spec}' is a {device.profile} ({device.source}), not {profile}; "
                                    f"drop --target or name another device")
            return device
    files = [str(p) for p in search_path() if p.is_file()]
    known = ", ".join(d.name for d in list_devices()) or "none"
    raise BadInputError(f"unknown device '{spec}' (known: {known}; read {', '.join(files) or 'no devices.toml'}; "
                        f"or give ssh://user@host:port)")


def _from_url(spec: str, profile: str | None) -> Device:
    parts = urlsplit(spec)
    try:
        port = parts.port or 22
    except ValueError:
        raise BadInputError(f"{spec}: bad port") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.password:
        raise BadInputError(f"{spec}: expected ssh://[user@]host[:port] (no password, path or options; put those "
                            f"in devices.toml)")
    return Device(name=spec, host=parts.hostname, profile=profile, user=parts.username, port=port)


def _read(path: Path) -> list[Device]:
    raw = read_toml(path)
    unknown = sorted(set(raw) - {"devices"})
    if unknown:
        raise BadInputError(f"{path}: unknown key(s) {', '.join(unknown)} (devices are [devices.NAME] tables)")
    tables = raw.get("devices", {})
    if not isinstance(tables, dict):
        raise BadInputError(f"{path}: 'devices' must be a table of [devices.NAME] tables")
    return [_device(path, name, table) for name, table in tables.items()]


def _device(path: Path, name: str, table) -> Device:
    where = f"{path}: devices.{name}"
    if not isinstance(table, dict):
        raise BadInputError(f"{where} must be a table")
    unknown = sorted(set(table) - set(_SCHEMA))
    if unknown:
        raise BadInputError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_SCHEMA)})")
    values = {}
    for key, (types, default) in _SCHEMA.items():
        if key not in table:
            if default is ...:
                raise BadInputError(f"{where}: missing key '{key}'")
            values[key] = default
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, types) or (isinstance(value, str) and not value):
            kind = "a non-empty string" if types == (str,) else "a number"
            raise BadInputError(f"{where}: '{key}' must be {kind}, got {value!r}")
        values[key] = value
    for key in ("port", "concurrency", "connect_timeout_s", "timeout_s"):
        if values[key] <= 0 or key == "port" and values[key] > 65535:
            raise BadInputError(f"{where}: '{key}' must be positive{' and at most 65535' if key == 'port' else ''}, "
                                f"got {values[key]!r}")
    if values["retries"] < 0:
        raise BadInputError(f"{where}: 'retries' must be 0 or more, got {values['retries']}")
    if values["known_hosts"] not in KNOWN_HOSTS_POLICIES:
        raise BadInputError(f"{where}: 'known_hosts' must be one of {', '.join(KNOWN_HOSTS_POLICIES)}, "
                            f"got {values['known_hosts']!r}")
    if values["host"].startswith("-") or (values["user"] or "").startswith("-"):
        raise BadInputError(f"{where}: host and user must not start with '-'")
    for key in ("key_file", "known_hosts_file"):
        if values[key] is not None:
            values[key] = (path.parent / Path(values[key]).expanduser()).resolve()
    return Device(name=name, source=path, **values)
