"""Shared by the bundle tests: the INT8 digits artifact, a loose test profile, a validation report and a
bundle, each built once per test session (cached under pytest's session temp folder)."""

from __future__ import annotations

import fcntl
import io
import json
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import DIGITS_CALIB, DIGITS_EVAL, DIGITS_MODEL, ROOT

# Budgets no healthy run misses on a loaded 2-core CI box (these tests check plumbing, not speed), and the
# digits sample's input shape: the tail of every test profile.
LOOSE_TAIL = """\
[budgets]
max_file_mb = 50
max_peak_rss_mb = 4000
p50_ms = 1000
p95_ms = 2000
p99_ms = 3000
max_cv = 1000
max_p99_over_p50 = 10000

[model]
input_shapes = { input = [1, 1, 8, 8] }
"""
LOOSE_TARGET = """\
extends = "base-x86"
description = "test profile: 2-core x86-64, loose budgets"

[device]
name = "test box"
cpu = "any x86-64"
cores = 2
memory_mb = 4096
isa = ["avx2"]

[runtime]
name = "{runtime}"
threads = 2

"""
FAST = ("--runs", "20", "--warmup", "2", "--min-seconds", "0")
# What a device needs of edgeopt: copied alone onto a bare PYTHONPATH for the runtime-only venv.
LEAN_FILES = ("__init__.py", "errors.py", "atomic.py", "jsonio.py", "signals.py", "out_guard.py", "device")


def session_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "bundle-support"
    folder.mkdir(exist_ok=True)
    return folder


def loose_target(tmp_path_factory, runtime: str = "openvino") -> Path:
    path = session_dir(tmp_path_factory) / f"ci-loose-{runtime}.toml"
    if not path.exists():
        path.write_text(LOOSE_TARGET.format(runtime=runtime) + LOOSE_TAIL)
    return path


def digits_artifact(tmp_path_factory) -> Path:
    """``edgeopt compress`` output of the digits CNN: INT8 IR + ONNX + report.json with the quality figures."""
    out = session_dir(tmp_path_factory) / "digits-int8"
    if not out.exists():
        import edgeopt

        edgeopt.compress(DIGITS_MODEL, DIGITS_CALIB, out=out, recipe="int8", eval_data=DIGITS_EVAL)
    return out


def digits_report(tmp_path_factory, runtime: str = "openvino") -> Path:
    """A validation report (as ``edgeopt validate --json`` writes it) of the digits artifact on the loose target."""
    path = session_dir(tmp_path_factory) / f"validation-{runtime}.json"
    if not path.exists():
        from edgeopt.targets import Measuring, load_target, model_in, validate_on

        target = load_target(loose_target(tmp_path_factory, runtime))
        model = model_in(digits_artifact(tmp_path_factory), runtime)
        report = validate_on(target, model, measuring=Measuring(runs=20, warmup=2, min_seconds=0.0))
        path.write_text(json.dumps(report.to_dict()))
    return path


def digits_bundle(tmp_path_factory, runtime: str = "openvino") -> Path:
    path = session_dir(tmp_path_factory) / f"digits-{runtime}.tar.gz"
    if not path.exists():
        from edgeopt.packaging import package

        package(digits_artifact(tmp_path_factory), loose_target(tmp_path_factory, runtime), path,
                report=digits_report(tmp_path_factory, runtime), build_id="test-1")
    return path


def members(bundle: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Every entry of a bundle with its content, in archive order."""
    with tarfile.open(bundle, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]


def write_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A hand-made archive (any entry types and names), for tests of what the reader refuses."""
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    return info, data


def runtime_venv(runtime: str) -> Path:
    """A venv with only numpy and ``runtime`` (same versions as here), cached under .cache/ and rebuilt when
    missing or incomplete."""
    pins = [f"numpy=={version('numpy')}", f"{runtime}=={version(runtime)}"]
    tag = "-".join(p.replace("==", "") for p in pins)
    venv = ROOT / ".cache" / f"device-venv-py{sys.version_info.major}{sys.version_info.minor}-{tag}"
    venv.parent.mkdir(exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test session builds it, others wait and reuse it
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                  "--disable-pip-version-check", *pins], capture_output=True, text=True, timeout=600)
            if pip.returncode != 0:
                pytest.fail(f"pip install {' '.join(pins)} failed: {pip.stderr.strip()[-500:]}")
            (venv / ".complete").write_text("\n".join(pins) + "\n")
    return venv


def lean_edgeopt(folder: Path) -> Path:
    """``folder`` holding only what a device needs of edgeopt (``LEAN_FILES``), for a bare PYTHONPATH."""
    lean = folder / "edgeopt"
    lean.mkdir(parents=True)
    for name in LEAN_FILES:
        source = ROOT / "edgeopt" / name
        if source.is_dir():
            shutil.copytree(source, lean / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, lean / name)
    return folder
