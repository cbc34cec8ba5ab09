"""The on-device validator (``python -m edgeopt.device``): lean imports, budgets, reports, runtime-only venvs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from bundle_support import digits_bundle, lean_edgeopt, runtime_venv
from conftest import ROOT

from edgeopt.bundle_writer import write_bundle
from edgeopt.device.bundle_reader import open_bundle

FAST = ("--runs", "50", "--warmup", "5", "--min-seconds", "0")
HEAVY = ("torch", "nncf", "click", "rich", "onnx", "sklearn", "matplotlib", "PIL", "torch_pruning", "psutil", "scipy")
# Put first on PYTHONPATH, this makes every import of a heavy package fail and be logged, in the validator's
# process and in the measuring process it starts (which inherits PYTHONPATH).
BLOCKER = f"""\
import os, sys
HEAVY = {set(HEAVY)!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY:
            with open(os.environ["EDGEOPT_BLOCK_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ImportError("the lean validator must not import " + name)
sys.meta_path.insert(0, _Block())
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """The digits bundle re-packed for a profile whose device is this host (its ``cpu_match`` names this CPU), as
    a bundle built for the device the validator runs on is."""
    from edgeopt.device.host import host_info

    folder = tmp_path_factory.mktemp("this-host")
    manifest = open_bundle(digits_bundle(tmp_path_factory), extract_to=folder / "files").manifest
    manifest["target"]["device"]["cpu_match"] = [host_info().cpu_model]
    files = {name: folder / "files" / name for name in manifest.pop("files")}
    return write_bundle(folder / "digits.tar.gz", manifest, files)


def test_a_generic_profile_is_never_measured_as_its_device(tmp_path_factory, tmp_path):
    """A bundle for a profile that names no CPU (``cpu_match``) to recognise its device by reads EMULATED on any
    host, as ``edgeopt validate`` reads it on the build host: an emulated figure is never a device pass."""
    result = subprocess.run([sys.executable, "-m", "edgeopt.device", "validate", digits_bundle(tmp_path_factory),
                             *FAST, "--json", tmp_path / "r.json"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert result.returncode in (0, 4), result.stderr  # 4: an emulated figure over budget on a busy host
    report = json.loads((tmp_path / "r.json").read_text())
    assert "no cpu_match: a generic profile" in report["emulation_note"] and report["emulated"]
    timing = [c for c in report["checks"] if c["name"] not in ("max_file_mb", "max_peak_rss_mb")]  # same arch:
    assert timing and all(c["verdict"] != "PASS" for c in timing)  # bytes and memory are this host's own


@pytest.fixture(scope="module")
def tight_bundle(bundle, tmp_path_factory) -> Path:
    """The digits bundle re-packed with a p50 budget no device meets (as if the device were slower)."""
    folder = tmp_path_factory.mktemp("tight")
    manifest = open_bundle(bundle, extract_to=folder / "files").manifest
    manifest["target"]["budgets"]["p50_ms"] = 1e-6
    files = {name: folder / "files" / name for name in manifest.pop("files")}
    return write_bundle(folder / "tight.tar.gz", manifest, files)


def blocked_env(tmp_path: Path) -> dict:
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "block"), "EDGEOPT_BLOCK_LOG": str(tmp_path / "imports.log")}


def run_validator(python: str, *args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "edgeopt.device", *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_validator_runs_without_torch_nncf_click_rich(bundle, tmp_path):
    env = blocked_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(ROOT)
    assert subprocess.run([sys.executable, "-c", "import click"], env=env, capture_output=True).returncode != 0
    (tmp_path / "imports.log").unlink()  # the blocker works; now the validator must not trip it
    result = run_validator(sys.executable, "validate", bundle, *FAST, "--json", tmp_path / "r.json", "--junit",
                           tmp_path / "r.xml", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "imports.log").exists(), (tmp_path / "imports.log").read_text()
    assert "PASS  p50_ms" in result.stdout and "\x1b[" not in result.stdout  # plain text, no colour codes
    report = json.loads((tmp_path / "r.json").read_text())
    manifest = open_bundle(bundle).manifest
    assert report["passed"] and report["target"] == manifest["target"]["name"]
    assert {c["name"] for c in report["checks"]} == set(manifest["target"]["budgets"])
    settings = report["measured_with"]["settings_effective"]
    assert settings["inference_precision"] == "f32" and str(settings["threads"]) == "2"
    assert report["latency_ms"]["runs"] >= 50 and report["memory"]["peak_rss_bytes"] > 0
    assert any(open_bundle(bundle).sha256 in note for note in report["notes"])
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) == len(manifest["target"]["budgets"]) and suite.get("failures") == "0"
    # --json - puts the report, and nothing else, on stdout.
    only_json = run_validator(sys.executable, "validate", bundle, *FAST, "--json", "-", env=env, cwd=tmp_path)
    assert only_json.returncode == 0 and json.loads(only_json.stdout)["passed"]


def test_failed_budget_exits_4_with_junit_failure(tight_bundle, tmp_path):
    env = blocked_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(ROOT)
    result = run_validator(sys.executable, "validate", tight_bundle, *FAST, "--junit", tmp_path / "r.xml", "--quiet",
                           env=env, cwd=tmp_path)
    assert result.returncode == 4 and result.stdout == ""
    assert result.stderr.strip() == "edgeopt-device: device budget failed: p50_ms (target ci-loose-openvino)"
    failures = ET.parse(tmp_path / "r.xml").getroot().findall(".//failure")
    assert [f.get("message").split(":")[0] for f in failures] == ["p50_ms"]
    assert not (tmp_path / "imports.log").exists()


def test_bad_bundle_and_usage_exit_2(bundle, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(bundle.read_bytes()[: len(bundle.read_bytes()) // 2])
    result = run_validator(sys.executable, "validate", cut, env=env, cwd=tmp_path)
    assert result.returncode == 2 and "truncated or corrupt" in result.stderr and "Traceback" not in result.stderr
    assert run_validator(sys.executable, "validate", tmp_path / "none.tar.gz", env=env, cwd=tmp_path).returncode == 2
    assert run_validator(sys.executable, "validate", bundle, "--runs", "0", env=env, cwd=tmp_path).returncode == 2


def megabytes(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_validator_in_a_runtime_only_venv(runtime, tmp_path_factory, tmp_path, record_property):
    bundle = digits_bundle(tmp_path_factory, runtime)
    venv = runtime_venv(runtime)
    python = str(venv / "bin" / "python")
    missing = subprocess.run([python, "-c", "import importlib.util as u; "
                              f"print([m for m in {HEAVY + ('edgeopt',)!r} if u.find_spec(m)])"],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
    assert missing.stdout.strip() == "[]"  # nothing but numpy and the runtime: not even edgeopt itself
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(lean_edgeopt(tmp_path / "lean")),
           "HOME": str(tmp_path)}
    start = time.perf_counter()
    result = run_validator(python, "validate", bundle, *FAST, "--json", tmp_path / "r.json", "--junit",
                           tmp_path / "r.xml", env=env, cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and report["measured_with"]["settings_requested"]["runtime"] == runtime
    assert not any("this device has" in note for note in report["notes"])  # same runtime version as packaged
    other = digits_bundle(tmp_path_factory, "onnxruntime" if runtime == "openvino" else "openvino")
    wrong = run_validator(python, "validate", other, *FAST, env=env, cwd=tmp_path)
    assert wrong.returncode == 2 and "this device has no" in wrong.stderr and "pip install" in wrong.stderr
    figures = {"venv_mb": round(megabytes(venv), 1), "validator_seconds": round(seconds, 2),
               "bundle_bytes": bundle.stat().st_size}
    record_property("footprint", figures)
    print(f"\n{runtime}-only venv: {figures}")
