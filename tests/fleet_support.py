"""Small fleets for the fleet tests and bench: the digits and ResNet digits samples on two targets, with small
data sets (calibration 64 samples, evaluation 200) and an INT8 recipe, so that each pair is one quick build."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")

SINGLE = """extends = "roomy"
description = "the roomy box with one inference thread"
[runtime]
threads = 1
"""

ROOMY = """extends = "generic-x86-avx2-2core"
description = "the generic box with room for the ResNet sample and a busy shared host's spread"
[budgets]
p50_ms = 200.0
p95_ms = 400.0
p99_ms = 800.0
max_cv = 50.0
max_p99_over_p50 = 1000.0
"""


def resnet_data(folder: Path) -> tuple[Path, Path]:
    """Calibration (64) and evaluation (200) sets of the ResNet sample, from its own data hooks."""
    sys.path.insert(0, str(ROOT / "samples" / "resnet_digits"))
    try:
        import datasets
    finally:
        sys.path.pop(0)
    paths = []
    for name, count in (("calib", 64), ("eval", 200)):
        x, y = datasets.splits()[name]
        path = folder / f"resnet-{name}.npz"
        np.savez(path, input=x[:count].astype(np.float32), labels=y[:count])
        paths.append(path)
    return paths[0], paths[1]


def write_fleet(folder: Path, models=("digits", "resnet"), targets=("tight", "roomy"), *, runs: int = 30,
                warmup: int = 5, min_seconds: float = 0.0) -> Path:
    """``fleet.toml`` (and its recipe, profile and data files) in ``folder``: models × targets, where "tight"
    is digits-tight (350 KB: the ResNet sample misses it), "roomy" passes both, "single" is roomy with one
    inference thread."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "int8.toml").write_text('[[step]]\nname = "int8"\nsubset_size = 64\n')
    (folder / "roomy.toml").write_text(ROOMY)
    (folder / "single.toml").write_text(SINGLE)
    text = [f"[settings]\nruns = {runs}\nwarmup = {warmup}\nmin_seconds = {min_seconds}\n"]
    if "digits" in models:
        text.append(f'[[model]]\nname = "digits"\nmodel = "{ROOT}/samples/digits/model.py:build"\n'
                    f'calib = "{ROOT}/calibration/digits/calib.npz"\neval = "{ROOT}/calibration/digits/eval.npz"\n'
                    f'recipe = "int8.toml"\n')
    if "resnet" in models:
        calib, evaluation = resnet_data(folder)
        text.append(f'[[model]]\nname = "resnet"\nmodel = "{ROOT}/samples/resnet_digits/model.py:build"\n'
                    f'calib = "{calib.name}"\neval = "{evaluation.name}"\nrecipe = "int8.toml"\n')
    profiles = {"tight": 'profile = "digits-tight"\nname = "tight"', "roomy": 'profile = "roomy.toml"',
                "single": 'profile = "single.toml"',
                "small": 'profile = "digits-tight"\nname = "small"'}
    text += [f"[[target]]\n{profiles[t]}\n" for t in targets]
    path = folder / "fleet.toml"
    path.write_text("\n".join(text))
    return path


def chosen_files(out: Path) -> dict:
    """(model, target) -> {file: sha256} of the chosen artifacts, from the matrix report."""
    report = json.loads((out / "report.json").read_text())
    return {(p["model"], p["target"]): p["chosen_files"] for p in report["pairs"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RayCluster:
    """A real Ray cluster on 127.0.0.1: a head node and a worker node (``ray start --block``, each in its own
    process group, one CPU and one measurement slot each); ``stop`` ends exactly those processes and removes
    the temporary folder. Token authentication with its own token: ``env`` is what a driver needs to join."""

    def __init__(self, cpus_per_node: int = 1):
        import secrets

        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths must stay short
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        token = self.temp / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        common = ["--num-cpus", str(cpus_per_node), "--resources", '{"edgeopt_node_slot": 1}', "--block",
                  "--disable-usage-stats"]
        env = {**os.environ, **self.env}
        try:
            self._start([str(RAY), "start", "--head", "--port", str(self.port), "--node-ip-address", "127.0.0.1",
                         "--temp-dir", str(self.temp), "--include-dashboard=false", *common], env)
            self._wait(1)
            self._start([str(RAY), "start", "--address", self.address, "--node-ip-address", "127.0.0.1", *common],
                        env)
            self._wait(2)
        except BaseException:
            self.stop()
            raise

    def _start(self, command: list[str], env: dict) -> None:
        log = open(self.temp / f"node{len(self.procs)}.log", "wb")
        self.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True))

    def _wait(self, nodes: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(1 for n in ray.nodes() if n['Alive'] and n['Resources'].get('edgeopt_node_slot')))")
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"ray start exited: {self.logs()}")
            found = subprocess.run([sys.executable, "-c", probe, self.address], capture_output=True, text=True,
                                   env={**os.environ, **self.env})
            if found.returncode == 0 and found.stdout.strip() == str(nodes):
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not come up with {nodes} node(s): {self.logs()}")

    @contextlib.contextmanager
    def joined(self):
        """This process's environment set to join the cluster, within the block."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            yield self.address
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def logs(self) -> str:
        return " | ".join(p.read_text(errors="replace")[-500:] for p in sorted(self.temp.glob("node*.log")))

    def own_pids(self) -> list[int]:
        """Every process of this cluster: the process groups started here, and any process naming its folder or
        holding its token in its environment (the workers, whose titles become ``ray::...``)."""
        import psutil

        groups = {p.pid for p in self.procs}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if (os.getpgid(proc.pid) in groups or str(self.temp) in " ".join(proc.info["cmdline"] or [])
                        or proc.environ().get("RAY_AUTH_TOKEN_PATH", "").startswith(str(self.temp))):
                    found.append(proc.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    def stop(self) -> None:
        import shutil

        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in self.procs:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            for pid in self.own_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + (5 if sig == signal.SIGTERM else 15)
            while self.own_pids() and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in self.procs:
            proc.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)
