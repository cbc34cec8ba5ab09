"""Run commands on a device and copy files to it with the system's OpenSSH client (``ssh``, ``scp``).

Why OpenSSH rather than a Python SSH library: it is on every build host and CI image, and it honours what
users already set up for their devices — ``~/.ssh/config`` (ProxyJump, aliases), the ssh agent, hardware
keys, ``known_hosts`` — with no extra dependency. Every call is non-interactive (``BatchMode=yes``: a
missing key fails instead of prompting), checks the host key (``StrictHostKeyChecking=yes``, or
``accept-new`` when the device says so), and bounds connecting (``ConnectTimeout``) and a silent link
(``ServerAliveInterval``/``CountMax``). ssh's own diagnostics become one-line errors, and transient network
failures are retried where retrying is safe.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass

from edgeopt.errors import BadInputError, DeviceError
from edgeopt.remote.devices import Device

SSH_FAILED = 255  # ssh's own exit status when it, not the remote command, failed
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
_AUTH = ("Permission denied", "Too many authentication failures", "no mutual signature algorithm")
_HOST_KEY = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "host key for",
             "No matching host key")
_UNREACHABLE = ("Could not resolve hostname", "Name or service not known")
_TRANSIENT = ("Connection refused", "Connection timed out", "timed out", "No route to host", "Connection reset",
              "Connection closed", "closed by remote host", "Broken pipe", "kex_exchange_identification",
              "Network is unreachable", "Timeout, server", "lost connection")


class DeviceLost(DeviceError):
    """The connection dropped while a measurement ran: the candidate is unmeasured, not failed."""


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


class Ssh:
    """One device's connection settings; each call opens its own connection (no shared state to clean)."""

    def __init__(self, device: Device):
        for tool in ("ssh", "scp"):
            if shutil.which(tool) is None:
                raise BadInputError(f"the OpenSSH client ('{tool}') is not installed on this host "
                                    f"(Debian/Ubuntu: apt-get install openssh-client)")
        if device.key_file is not None and not device.key_file.is_file():
            raise BadInputError(f"device '{device.name}': key_file {device.key_file} does not exist")
        self.device = device

    def options(self) -> list[str]:
        d = self.device
        opts = {"BatchMode": "yes", "ConnectTimeout": str(max(1, round(d.connect_timeout_s))),
                "ServerAliveInterval": str(ALIVE_INTERVAL_S), "ServerAliveCountMax": str(ALIVE_COUNT),
                "StrictHostKeyChecking": "yes" if d.known_hosts == "strict" else "accept-new",
                "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no", "LogLevel": "ERROR"}
        if d.known_hosts_file is not None:
            opts["UserKnownHostsFile"] = str(d.known_hosts_file)
        if d.key_file is not None:
            opts |= {"IdentityFile": str(d.key_file), "IdentitiesOnly": "yes"}
        return [arg for key, value in opts.items() for arg in ("-o", f"{key}={value}")]

    def run(self, script: str, *, timeout_s: float, retry: bool = True, keep_stdin_open: bool = False) -> Result:
        """Run a POSIX sh ``script`` on the device. ``retry``: reconnect after a transient network failure
        (only for steps safe to repeat). ``keep_stdin_open``: the remote stdin stays open until this call
        ends, so a remote command watching it stops when the connection drops or this process dies."""
        d = self.device
        target = f"{d.user}@{d.host}" if d.user else d.host
        argv = ["ssh", *self.options(), "-p", str(d.port), "--", target, "sh -c " + shlex.quote(script)]
        return self._attempts(argv, timeout_s, retry, keep_stdin_open, "run a command")

    def put(self, sources: list[str], remote_dir: str, *, timeout_s: float) -> None:
        """Copy local files into ``remote_dir`` (absolute, on the device), retrying transient failures."""
        d = self.device
        host = f"[{d.host}]" if ":" in d.host else d.host
        target = f"{d.user}@{host}" if d.user else host
        argv = ["scp", "-q", *self.options(), "-P", str(d.port), "--", *sources, f"{target}:{remote_dir}/"]
        result = self._attempts(argv, timeout_s, True, False, "copy files")
        if result.returncode != 0:
            raise self.error(result, "copying files")

    def _attempts(self, argv: list[str], timeout_s: float, retry: bool, keep_stdin_open: bool, what: str) -> Result:
        attempts = 1 + (self.device.retries if retry else 0)
        for attempt in range(attempts):
            result = _call(argv, timeout_s, keep_stdin_open, self.device, what)
            transient = result.returncode == SSH_FAILED and _matches(result.stderr, _TRANSIENT) \
                and not _matches(result.stderr, _AUTH + _HOST_KEY)
            if not transient or attempt == attempts - 1:
                return result
            time.sleep(min(8.0, 1.0 * 2 ** attempt))
        raise AssertionError("unreachable")

    def error(self, result: Result, doing: str) -> DeviceError:
        """A one-line error for a failed ssh/scp call."""
        d, text = self.device, result.stderr
        where = f"device '{d.name}' ({d.address})"
        if _matches(text, _HOST_KEY):
            known = d.known_hosts_file or "~/.ssh/known_hosts"
            return DeviceError(f"{where}: host key mismatch or unknown host key (checked against {known}); if the "
                               f"device was re-imaged, verify its key and update known_hosts (ssh-keygen -R), or "
                               f"set known_hosts = \"accept-new\" for a first connection")
        if _matches(text, _AUTH):
            key = d.key_file or "the ssh agent / default keys"
            return DeviceError(f"{where}: authentication failed for user {d.user or '(ssh default)'} with "
                               f"{key}; add the public key to the device's ~/.ssh/authorized_keys")
        if "No space left on device" in text:
            return DeviceError(f"{where}: the device's disk is full (while {doing} to {d.work_dir}); free some "
                               f"space or point work_dir elsewhere")
        if _matches(text, _UNREACHABLE + _TRANSIENT) or result.returncode == SSH_FAILED:
            line = _last_line(text) or f"ssh exited {result.returncode}"
            return DeviceError(f"{where}: unreachable while {doing} ({line}; tried {1 + d.retries} times)")
        return DeviceError(f"{where}: {doing} failed (exit {result.returncode}): {_last_line(text) or 'no output'}")


def _call(argv: list[str], timeout_s: float, keep_stdin_open: bool, device: Device, what: str) -> Result:
    read_end, write_end = os.pipe() if keep_stdin_open else (subprocess.DEVNULL, None)
    try:
        proc = subprocess.run(argv, stdin=read_end, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"device '{device.name}' ({device.address}): no answer within {timeout_s:.0f} s "
                          f"(trying to {what}); timeout_s in devices.toml sets the limit") from None
    finally:
        if write_end is not None:
            os.close(read_end)
            os.close(write_end)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _matches(text: str, needles: tuple[str, ...]) -> bool:
    return any(n.lower() in text.lower() for n in needles)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
