"""A real OpenSSH server for the device tests: Debian's ``sshd`` on 127.0.0.1 at a free port, with a throwaway
host key and user key, serving the current user (key login only). Installed with apt-get where missing (as
root, like ./dev does); the tests skip with the reason where that cannot be done."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def sshd_binary() -> str:
    """The sshd binary, installing Debian's openssh-server first where it is missing and we may."""
    found = next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), None) or shutil.which("sshd")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("sshd is not installed and cannot be installed here (needs root and apt-get: "
                    "apt-get install openssh-server)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = subprocess.run(["apt-get", "install", "-y", "openssh-server"], capture_output=True, text=True,
                             env=env, timeout=600)
    if install.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=600)
        install = subprocess.run(["apt-get", "install", "-y", "openssh-server"], capture_output=True, text=True,
                                 env=env, timeout=600)
    found = next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), None)
    if not found:
        pytest.skip(f"apt-get install openssh-server failed: {install.stderr.strip()[-300:]}")
    return found


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgeopt-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Sshd:
    folder: Path
    port: int
    user: str
    user_key: Path  # authorised
    stranger_key: Path  # not authorised
    known_hosts: Path  # holds the server's real host key
    wrong_known_hosts: Path  # holds another key for the same address
    process: subprocess.Popen

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listening one)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rpartition(")")[2].split()[1]) == self.process.pid:
                    pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_sshd(folder: Path) -> Sshd:
    binary = sshd_binary()
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    host_key, other_host_key = keygen(folder / "host_key"), keygen(folder / "other_host_key")
    user_key, stranger_key = keygen(folder / "user_key"), keygen(folder / "stranger_key")
    (folder / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
    port = free_port()
    for name, key in (("known_hosts", host_key), ("wrong_known_hosts", other_host_key)):
        kind, blob = key.with_suffix(".pub").read_text().split()[:2]
        (folder / name).write_text(f"[127.0.0.1]:{port} {kind} {blob}\n")
    config = folder / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {folder / 'sshd.pid'}
AuthorizedKeysFile {folder / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxStartups 50
MaxSessions 50
Subsystem sftp internal-sftp
""")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation folder
    process = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=open(folder / "sshd.log", "w"))
    server = Sshd(folder, port, getpass.getuser(), user_key, stranger_key, folder / "known_hosts",
                  folder / "wrong_known_hosts", process)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"sshd did not start: {(folder / 'sshd.log').read_text().strip()[-300:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    pytest.skip("sshd did not listen within 20 s")
