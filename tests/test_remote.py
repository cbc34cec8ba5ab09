"""Measuring on a device over SSH, against a real OpenSSH server on 127.0.0.1 (no mocks): the device's Python is
a venv holding only numpy + openvino (or only numpy + onnxruntime) and edgeopt copies its lean package there."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from bundle_support import FAST, LOOSE_TAIL, digits_artifact, digits_bundle, runtime_venv
from sshd_support import free_port, start_sshd

from edgeopt.device.host import host_info
from edgeopt.errors import BadInputError
from edgeopt.remote.devices import list_devices, load_device
from edgeopt.remote.ssh import DeviceLost

HOST = host_info()
# The fixture's device is this very host, so a profile matching its CPU makes a local run "on the device"
# too: the two verdict tables must then agree. Budgets are loose: these tests check plumbing, not speed.
PROFILE = f"""\
extends = "base-x86"
description = "test: this host as a device"
[device]
name = "loopback device"
cpu = "{HOST.cpu_model}"
arch = "{HOST.machine}"
cores = {min(2, HOST.usable_cpus)}
memory_mb = 4096
isa = ["avx2"]
cpu_match = ["{HOST.cpu_model}"]
[runtime]
name = "{{runtime}}"
threads = {min(2, HOST.usable_cpus)}
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lab(sshd, tmp_path_factory):
    """Profiles and a devices.toml naming the fixture's server as several devices (good and broken ones)."""
    folder = tmp_path_factory.mktemp("lab")
    for runtime in ("openvino", "onnxruntime"):
        (folder / f"loopback-{runtime}.toml").write_text(PROFILE.format(runtime=runtime) + LOOSE_TAIL)
    ov, ort = (os.path.abspath(runtime_venv(r) / "bin" / "python") for r in ("openvino", "onnxruntime"))
    work = folder / "work"

    def device(name, profile="loopback-openvino", python=ov, key=sshd.user_key, known=sshd.known_hosts,
               port=sshd.port, work=work):
        return (f'[devices.{name}]\nhost = "127.0.0.1"\nport = {port}\nuser = "{sshd.user}"\n'
                f'profile = "{profile}"\npython = "{python}"\nkey_file = "{key}"\nknown_hosts_file = "{known}"\n'
                f'work_dir = "{work}"\nconnect_timeout_s = 5\ntimeout_s = 300\nretries = 1\n\n')

    (folder / "loopback-tight.toml").write_text(  # INT8 digits fits 0.5 MB, FP32 does not
        'extends = "loopback-openvino"\ndescription = "test: tight file budget"\n[budgets]\nmax_file_mb = 0.5\n'
        '[model]\nprecisions = ["int8", "fp32"]\n')
    (folder / "devices.toml").write_text(
        device("tight-a", "loopback-tight") + device("tight-b", "loopback-tight") + device("local-ssh")
        + device("ort-box", "loopback-onnxruntime", python=ort)
        + device("no-openvino", python=ort) + device("stranger", key=sshd.stranger_key)
        + device("impostor", known=sshd.wrong_known_hosts) + device("nowhere", port=free_port())
        + device("full", work=folder / "tiny"))
    return folder


@pytest.fixture
def env(lab, monkeypatch):
    monkeypatch.setenv("EDGEOPT_TARGETS", str(lab))
    monkeypatch.setenv("EDGEOPT_DEVICES", str(lab / "devices.toml"))
    return lab


def remote_processes(work: Path) -> list[int]:
    """Processes whose command line names the device's work folder (the validator and its probe)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(work).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def lock_is_free(work: Path) -> bool:
    with open(work / "device.lock.0", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def wait_until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_devices_toml_is_strict_and_searched(env, tmp_path, monkeypatch):
    assert [d.name for d in list_devices()] == ["full", "impostor", "local-ssh", "no-openvino", "nowhere",
                                                "ort-box", "stranger", "tight-a", "tight-b"]
    device = load_device("local-ssh")
    assert device.profile == "loopback-openvino" and device.concurrency == 1 and device.known_hosts == "strict"
    inline = load_device("ssh://pi@10.0.0.7:2222", "raspberry-pi-5")
    assert (inline.user, inline.host, inline.port, inline.profile) == ("pi", "10.0.0.7", 2222, "raspberry-pi-5")
    bad = tmp_path / "devices.toml"
    for text, words in (('[devices.x]\nhost = "h"\nprofile = "p"\ncolour = 1\n', "unknown key(s) colour"),
                        ('[devices.x]\nprofile = "p"\n', "missing key 'host'"),
                        ('[devices.x]\nhost = "h"\nprofile = "p"\nknown_hosts = "off"\n', "'known_hosts' must be"),
                        ('[devices.x]\nhost = "h"\nprofile = "p"\nport = 0\n', "'port' must be positive")):
        bad.write_text(text)
        monkeypatch.setenv("EDGEOPT_DEVICES", str(bad))
        with pytest.raises(BadInputError, match=words.replace("(", r"\(").replace(")", r"\)")):
            list_devices()
    monkeypatch.setenv("EDGEOPT_DEVICES", str(env / "devices.toml"))
    with pytest.raises(BadInputError, match="unknown device 'nope'"):
        load_device("nope")


def test_validate_on_the_device_gives_the_local_verdicts(env, cli, tmp_path_factory, tmp_path):
    artifact = digits_artifact(tmp_path_factory)
    local = cli("validate", artifact, "--target", "loopback-openvino", *FAST, "--json", tmp_path / "local.json")
    remote = cli("validate", artifact, "--device", "local-ssh", *FAST, "--json", tmp_path / "remote.json",
                 "--junit", tmp_path / "remote.xml")
    assert local.exit_code == 0 and remote.exit_code == 0, (local.output, remote.output)
    local_json, remote_json = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("local", "remote"))
    verdicts = [(c["name"], c["verdict"]) for c in local_json["checks"]]
    assert verdicts == [(c["name"], c["verdict"]) for c in remote_json["checks"]]
    assert {v for _, v in verdicts} == {"PASS"} and not remote_json["emulated"]
    assert remote_json["host"]["cpu_model"] == HOST.cpu_model
    assert "measured on the device itself" in remote.output and "measured on device 'local-ssh'" in remote.output
    assert remote_json["files"] == local_json["files"]
    suite = ET.parse(tmp_path / "remote.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "0"
    work = env / "work"
    assert list((work / "runs").iterdir()) == [] and len(list((work / "lib").iterdir())) == 1  # cleaned; reused
    assert lock_is_free(work)
    required = cli("validate", artifact, "--device", "local-ssh", *FAST, "--require-device", "--quiet")
    assert required.exit_code == 0, required.output


def test_devices_check_reports_facts_and_the_missing_runtime(env, cli):
    ready = cli("devices", "check", "local-ssh")
    assert ready.exit_code == 0, ready.output
    assert "reachable" in ready.output and HOST.cpu_model in ready.output and "ready to measure" in ready.output
    assert "openvino 2026" in ready.output or "openvino 20" in ready.output
    missing = cli("devices", "check", "no-openvino")
    assert missing.exit_code == 5 and "NOT READY" in missing.output
    assert "-m pip install numpy openvino==" in missing.stderr and "Traceback" not in missing.output


@pytest.mark.parametrize("name, words", [
    ("stranger", "authentication failed for user"),
    ("impostor", "host key mismatch or unknown host key"),
    ("no-openvino", "missing runtime"),
    ("nowhere", "unreachable while preparing the work folder"),  # nothing listens: retried, then one line
])
def test_device_failures_are_one_line_exit_5(env, cli, tmp_path_factory, name, words):
    result = cli("validate", digits_artifact(tmp_path_factory), "--device", name, *FAST)
    assert result.exit_code == 5, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.stderr
    if name == "no-openvino":
        assert "pip install numpy openvino==" in lines[0]


def test_onnxruntime_only_device(env, cli, tmp_path_factory, tmp_path):
    result = cli("validate", digits_artifact(tmp_path_factory), "--device", "ort-box", *FAST, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["measured_with"]["settings_requested"]["runtime"] == "onnxruntime" and report["passed"]


def _measure_in_thread(device_name: str, min_seconds: float, outcome: dict, tmp_path_factory):
    from edgeopt.remote.run import measure
    from edgeopt.targets import load_target, model_in

    target = load_target("loopback-openvino")
    model = model_in(digits_artifact(tmp_path_factory), "openvino")
    try:
        outcome["result"] = measure(load_device(device_name), target, model, runs=20, warmup=2,
                                    min_seconds=min_seconds)
    except Exception as exc:  # handed to the test thread
        outcome["error"] = exc


def test_connection_killed_mid_measurement_leaves_it_unmeasured_and_cleans_up(env, sshd, tmp_path_factory):
    digits_artifact(tmp_path_factory)  # built before the clock starts
    work = env / "work"
    outcome: dict = {}
    thread = threading.Thread(target=_measure_in_thread, args=("local-ssh", 60.0, outcome, tmp_path_factory))
    thread.start()
    try:
        assert wait_until(lambda: (work / "device.lock.0").exists() and not lock_is_free(work), 120), \
            "the measurement never started"
        time.sleep(1.0)  # well into the 60 s of timing
        probes = _probes()
        assert probes, "no measuring process"
        assert list((work / "runs").glob("*/edgeopt-probe-*")), "temporary files outside the run folder"
        for pid in sshd.session_pids():  # the server side of the connection dies
            os.kill(pid, 9)
    finally:
        thread.join(120)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), DeviceLost), outcome
    assert "unmeasured" in str(outcome["error"])
    assert wait_until(lambda: not _alive(remote_processes(work)), 30), "the remote validator kept running"
    assert wait_until(lambda: not _alive(probes), 30), "the measuring process kept running"
    assert wait_until(lambda: list((work / "runs").iterdir()) == [], 30)
    assert lock_is_free(work)


def _probes() -> list[int]:
    """Measuring processes (``python -m edgeopt.device.probe``) running now."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"edgeopt.device.probe" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return _alive(found)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def test_two_runs_on_one_device_are_serialised_by_its_lock(env, tmp_path_factory):
    digits_artifact(tmp_path_factory)
    outcomes: list[dict] = [{}, {}]
    threads = [threading.Thread(target=_measure_in_thread, args=("local-ssh", 1.5, o, tmp_path_factory))
               for o in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all("result" in o for o in outcomes), outcomes
    sessions = sorted((o["result"].result["session"] for o in outcomes), key=lambda s: s["started_unix"])
    assert sessions[0]["ended_unix"] <= sessions[1]["started_unix"]  # never timed at the same moment
    assert sessions[1]["lock_wait_s"] > 0


def test_import_device_results_checks_the_bundle(cli, tmp_path_factory, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    bundle = digits_bundle(tmp_path_factory)
    run = subprocess.run([sys.executable, "-m", "edgeopt.device", "validate", str(bundle), *FAST, "--json",
                          str(tmp_path / "results.json"), "--quiet"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["schema_version"] == "edgeopt-device-result/1" and len(result["bundle"]["sha256"]) == 64
    imported = cli("validate", bundle, "--import", tmp_path / "results.json", "--junit", tmp_path / "r.xml",
                   "--json", tmp_path / "judged.json")
    assert imported.exit_code == 0, imported.output
    judged = json.loads((tmp_path / "judged.json").read_text())
    assert [c["name"] for c in judged["checks"]] == [c["name"] for c in result["checks"]]
    assert judged["latency_ms"] == result["latency_ms"] and "imported from" in imported.output
    assert ET.parse(tmp_path / "r.xml").getroot().find("testsuite").get("tests") == str(len(judged["checks"]))
    other = digits_bundle(tmp_path_factory, "onnxruntime")
    wrong = cli("validate", other, "--import", tmp_path / "results.json")
    assert wrong.exit_code == 2 and "refused" in wrong.stderr and "sha256" in wrong.stderr


def test_the_device_validator_on_another_machine_reads_emulated(cli, tmp_path_factory, tmp_path):
    """A bundle for an aarch64 board validated on this x86 host: the device validator says its figures are this
    host's (never a PASS), and a result imported from it is no device figure for --require-device."""
    import subprocess
    import sys

    from conftest import ROOT

    from edgeopt.device.bundle_reader import open_bundle

    board = tmp_path / "board.toml"
    board.write_text('extends = "base-x86"\ndescription = "an arm board"\n[device]\nname = "arm board"\n'
                     'cpu = "Cortex-A76"\narch = "aarch64"\ncores = 2\nmemory_mb = 4096\nisa = []\n'
                     '[runtime]\nname = "openvino"\nthreads = 2\n' + LOOSE_TAIL)
    bundle = tmp_path / "arm.tar.gz"
    packaged = cli("package", digits_artifact(tmp_path_factory), "--target", board, "--out", bundle, *FAST)
    assert packaged.exit_code == 0, packaged.output
    assert open_bundle(bundle).manifest["validation"]["emulated"]
    run = subprocess.run([sys.executable, "-m", "edgeopt.device", "validate", str(bundle), *FAST, "--json",
                          str(tmp_path / "results.json")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert run.returncode in (0, 4), run.stderr  # 4: an emulated figure over budget on a busy host
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["emulation_note"].startswith(f"not the profiled device (arm board): the host is "
                                               f"{host_info().machine}, the device aarch64")
    assert all(c["status"] == "emulated" for c in result["checks"] if c["name"] != "max_file_mb")
    assert "PASS  p50_ms" not in run.stdout
    imported = cli("validate", bundle, "--import", tmp_path / "results.json", "--json", tmp_path / "judged.json")
    assert imported.exit_code in (0, 4), imported.output  # judged again here: still emulated, never a PASS
    judged = json.loads((tmp_path / "judged.json").read_text())
    assert all(c["verdict"] != "PASS" for c in judged["checks"] if c["name"] != "max_file_mb"), judged["checks"]
    required = cli("validate", bundle, "--import", tmp_path / "results.json", "--require-device", "--quiet")
    assert required.exit_code == 5 and "--require-device: no device figures" in required.stderr
    assert "p50_ms" in required.stderr  # the emulated checks are named
    legacy = {**result, "emulation_note": None}  # a result from a validator that did not check its host
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    required = cli("validate", bundle, "--import", tmp_path / "legacy.json", "--require-device", "--quiet")
    assert required.exit_code == 5, required.output


def test_cross_isa_profile_without_device_never_passes_timing(cli, tiny_ir, tmp_path):
    result = cli("validate", tiny_ir, "--target", "raspberry-pi-5", *FAST, "--json", tmp_path / "r.json",
                 "--junit", tmp_path / "r.xml", "--input-shape", "input=1,1,8,8")
    report = json.loads((tmp_path / "r.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert result.exit_code in (0, 4), result.output  # 4: an emulated figure over budget (a busy host)
    assert all(v != "PASS" for name, v in verdicts.items() if name != "max_file_mb"), verdicts
    assert verdicts["max_file_mb"] == "PASS"  # the artifact's bytes are the device's bytes
    assert all(c["reason"] and "emulated on" in c["reason"] for c in report["checks"] if c["status"] == "emulated")
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    # every timing check is an emulated figure: skipped in JUnit within budget, a failure over it (exit 4)
    failures = int(suite.get("failures"))
    assert int(suite.get("skipped")) + failures == len(verdicts) - 1 and (failures > 0) == (result.exit_code == 4)
    required = cli("validate", tiny_ir, "--target", "raspberry-pi-5", *FAST, "--require-device", "--quiet",
                   "--input-shape", "input=1,1,8,8")
    assert required.exit_code == 5 and "--require-device: no device figures" in required.stderr


@pytest.mark.slow
def test_optimize_picks_from_device_figures_of_a_pool(env, cli, tmp_path):
    from conftest import DIGITS_CALIB, DIGITS_EVAL, DIGITS_MODEL

    plan = tmp_path / "plan.toml"
    plan.write_text('[[stage]]\nname = "baseline"\nstop_when_passed = false\n[[stage.candidate]]\nlabel = "fp32"\n'
                    'precision = "fp32"\nsteps = []\n[[stage]]\nname = "cheap wins"\n[[stage.candidate]]\n'
                    'label = "int8"\nprecision = "int8"\nsteps = [{ name = "int8" }]\n')
    args = ("optimize", DIGITS_MODEL, "--target", "loopback-tight", "--calib", DIGITS_CALIB, "--eval", DIGITS_EVAL,
            "--plan", plan, "--cache", tmp_path / "cache", *FAST, "--device", "tight-a", "--device", "tight-b",
            "--require-device")
    result = cli(*args, "--out", tmp_path / "out", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["chosen"] == "int8" and [d["device"] for d in report["devices"]] == ["tight-a", "tight-b"]
    by_label = {c["label"]: c for c in report["candidates"]}
    assert any("measured on device 'tight-" in n for n in by_label["int8"]["notes"])
    assert {c["verdict"] for c in by_label["int8"]["checks"]} == {"PASS"}  # device figures: real verdicts
    assert [c["name"] for c in by_label["fp32"]["checks"] if not c["passed"]] == ["max_file_mb"]
    again = cli(*args, "--out", tmp_path / "out2", "--json", tmp_path / "r2.json")
    assert again.exit_code == 0, again.output
    notes = json.loads((tmp_path / "r2.json").read_text())["candidates"][1]["notes"]
    assert any("reused: measured on device" in n for n in notes)  # cached by artifact, device and settings
    emulated = cli("optimize", DIGITS_MODEL, "--target", "raspberry-pi-5", "--calib", DIGITS_CALIB, "--eval",
                   DIGITS_EVAL, "--require-device", "--out", tmp_path / "out3")  # this host is no Pi: nothing to do
    assert emulated.exit_code == 5 and "--require-device: this host is not a raspberry-pi-5" in emulated.stderr
    assert not (tmp_path / "out3").exists()


def test_compress_validates_on_the_device(env, cli, tmp_path):
    from conftest import DIGITS_CALIB, DIGITS_MODEL

    result = cli("compress", DIGITS_MODEL, "--calib", DIGITS_CALIB, "--target", "loopback-openvino", "--format",
                 "openvino", "--device", "local-ssh", "--require-device", "--validate-runs", "20",
                 "--validate-seconds", "0", "--out", tmp_path / "out", "--quiet")
    assert result.exit_code == 0, result.output
    validation = json.loads((tmp_path / "out" / "report.json").read_text())["validation"]["reports"][0]
    assert not validation["emulated"] and any("measured on device 'local-ssh'" in n for n in validation["notes"])
    assert {c["verdict"] for c in validation["checks"]} == {"PASS"}


def test_a_packaged_bundle_is_sent_as_it_is(env, cli, tmp_path_factory, tmp_path):
    from edgeopt.packaging import package
    from edgeopt.targets import Measuring
    from edgeopt.remote.results import sha256_file

    bundle = package(digits_artifact(tmp_path_factory), "loopback-openvino", tmp_path / "m.tar.gz",
                     measuring=Measuring(runs=20, warmup=2, min_seconds=0)).path
    result = cli("validate", bundle, "--device", "local-ssh", *FAST, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert any(sha256_file(bundle) in note for note in report["notes"])  # the user's bundle, byte for byte
    other = cli("validate", digits_bundle(tmp_path_factory), "--device", "local-ssh", *FAST)
    assert other.exit_code == 2 and "packaged for ci-loose-openvino" in other.stderr


def test_a_full_disk_on_the_device_is_one_line(env, cli, tmp_path_factory):
    import subprocess

    tiny = env / "tiny"  # the "full" device's work_dir: a real 300 kB file system, smaller than the bundle needs
    tiny.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(tiny)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()[:200]}")
    try:
        result = cli("validate", digits_artifact(tmp_path_factory), "--device", "full", *FAST)
        assert result.exit_code == 5, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "the device's disk is full" in lines[0] and "MB free" in lines[0]
        assert list((tiny / "runs").iterdir()) == []  # the run folder it made was removed
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True)
