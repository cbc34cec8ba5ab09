"""Measure an artifact on a real device: bundle it, copy the bundle and the lean ``edgeopt.device`` package
over SSH, run ``python -m edgeopt.device validate`` there, bring the JSON back, judge the budgets here.

On the device, under its ``work_dir``::

    lib/<digest>/edgeopt/...     the lean package (numpy + runtime only), copied once per edgeopt version
    runs/run.XXXXXX/             one measurement's bundle and result; removed when it ends, however it ends
    device.lock.<slot>           flock'd by the validator while it measures: one measurement per slot

The validator runs with its stdin tied to the SSH connection, so a dropped connection (or this process
ending) stops the measurement, frees the lock and removes the run folder.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shlex
import tarfile
import tempfile
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from edgeopt import __version__
from edgeopt.bundle_writer import write_bundle
from edgeopt.device.runtime import runtime_version
from edgeopt.device.validate import ValidationReport
from edgeopt.errors import BadInputError, DeviceError, first_line
from edgeopt.jsonio import dumps
from edgeopt.remote.devices import Device
from edgeopt.file_digest import sha256_file
from edgeopt.remote.results import checked, to_report
from edgeopt.remote.ssh import SSH_FAILED, DeviceLost, Ssh
from edgeopt.targets import Target

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
LEAN_FILES = ("__init__.py", "errors.py", "atomic.py", "jsonio.py", "signals.py", "out_guard.py", "device")
SETUP_TIMEOUT_S = 120
STALE_RUN_MINUTES = 24 * 60
MEASUREMENT_SCHEMA = "edgeopt-bundle/1"  # a throwaway bundle to measure: no provenance record (that is /2's)
RUNTIME_PIP = {"openvino": "openvino", "onnxruntime": "onnxruntime"}


@dataclass(frozen=True)
class LeanPackage:
    """The part of edgeopt a device needs, as a deterministic .tar.gz; ``digest`` names its folder there."""

    data: bytes
    digest: str
    files: int


def lean_package() -> LeanPackage:
    paths = []
    for name in LEAN_FILES:
        path = PACKAGE_ROOT / name
        paths += sorted(p for p in path.rglob("*.py")) if path.is_dir() else [path]
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for path in paths:
                data = path.read_bytes()
                info = tarfile.TarInfo("edgeopt/" + path.relative_to(PACKAGE_ROOT).as_posix())
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    return LeanPackage(data, hashlib.sha256(data).hexdigest()[:16], len(paths))


def measurement_bundle(model: Path, target: Target, out: Path, input_shapes: dict | None = None) -> Path:
    """A bundle of ``model`` for ``target`` holding no host measurement: made to be measured on the device."""
    from edgeopt.packaging import VALIDATION, _describe_model, _model_files

    runtime = target.settings.runtime
    shapes = {k: list(v) for k, v in {**target.input_shapes, **(input_shapes or {})}.items()}
    placeholder = {"measured": False, "reason": "bundle built to be measured on the device itself"}
    manifest = {
        "schema": MEASUREMENT_SCHEMA, "edgeopt_version": __version__, "build_id": None,
        "target": {"name": target.name, "description": target.description,
                   "device": target.describe()["device"], "runtime": target.settings.describe(),
                   "budgets": target.budgets.describe(), "input_shapes": shapes},
        "runtime": {"name": runtime, "version": runtime_version(runtime)},
        "model": model.name, "models": [_describe_model(model, model, runtime, None)],
        "recipe": None, "preprocessing": None, "quality": None,
        "validation": {"passed": False, "measured": {}, "checks": [], "emulated": False, "report": VALIDATION,
                       "measured_with": "not measured on the build host: made to be measured on the device"},
    }
    files = {f.name: f for f in _model_files(model)} | {VALIDATION: dumps(placeholder).encode()}
    return write_bundle(out, manifest, files)


@dataclass(frozen=True)
class DeviceMeasurement:
    report: ValidationReport  # judged here against the target's budgets
    result: dict  # the device's JSON as it came back
    bundle_sha256: str


def measure(device: Device, target: Target, model: Path, *, runs: int = 300, warmup: int = 20,
            min_seconds: float = 2.0, input_shapes: dict | None = None) -> DeviceMeasurement:
    """Measure ``model`` on ``device`` with ``target``'s settings; raises ``DeviceError`` (``DeviceLost`` when
    the connection dropped mid-measurement) when the device gives no figures."""
    ssh = Ssh(device)
    lean = lean_package()
    with tempfile.TemporaryDirectory(prefix="edgeopt-remote-") as tmp:
        bundle = Path(tmp) / "bundle.tar.gz"
        if str(model).endswith(".tar.gz"):  # a packaged bundle goes as it is (its sha256 stays the user's)
            _check_packaged(Path(model), target)
            bundle.symlink_to(Path(model).resolve())
        else:
            measurement_bundle(Path(model), target, bundle, input_shapes)
        (Path(tmp) / "lean.tar.gz").write_bytes(lean.data)
        work, run_dir, have_lib, free = _prepare(ssh, lean)
        needed = bundle.stat().st_size * 3 + len(lean.data) * 4  # the bundle, its extraction, the lean package
        if free is not None and free < needed:
            _remove(ssh, run_dir)
            raise DeviceError(f"device '{device.name}': the device's disk is full ({free / 1e6:.1f} MB free in "
                              f"{work}, {needed / 1e6:.1f} MB needed); free some space or point work_dir elsewhere")
        try:
            ssh.put([str(bundle)] + ([] if have_lib else [str(Path(tmp) / "lean.tar.gz")]), run_dir,
                    timeout_s=device.timeout_s)
        except DeviceError:
            _remove(ssh, run_dir)
            raise
        sha = sha256_file(bundle)
        result = _validate(ssh, target, work, run_dir, lean, have_lib, runs, warmup, min_seconds)
    if result.get("bundle", {}).get("sha256") != sha:
        raise DeviceError(f"device '{device.name}': the result names another bundle than the one sent")
    note = (f"measured on device '{device.name}' ({device.address}, {result['host']['cpu_model']}, "
            f"{result['host']['machine']}) over SSH; bundle sha256 {sha}")
    report = replace(to_report(result, target.budgets, device_note=note), artifact=f"{model} on {device.name}")
    return DeviceMeasurement(report, result, sha)


def _check_packaged(bundle: Path, target: Target) -> None:
    from edgeopt.device.bundle_reader import open_bundle

    packaged = open_bundle(bundle).manifest["target"]["name"]
    if packaged != target.name:
        raise BadInputError(f"{bundle}: packaged for {packaged}, but the device is a {target.name}")


def _prepare(ssh: Ssh, lean: LeanPackage) -> tuple[str, str, bool, int | None]:
    """Create the work folders and this run's folder; say whether the lean package is there; free bytes."""
    work = ssh.device.work_dir
    script = f"""set -e
mkdir -p {shlex.quote(work)}/lib {shlex.quote(work)}/runs
cd {shlex.quote(work)}
find runs -mindepth 1 -maxdepth 1 -name 'run.*' -mmin +{STALE_RUN_MINUTES} -exec rm -rf {{}} + 2>/dev/null || true
echo "work=$(pwd)"
echo "run=$(pwd)/$(mktemp -d runs/run.XXXXXX)"
if [ -d lib/{lean.digest} ]; then echo lib=1; else echo lib=0; fi
echo "free_kb=$(df -Pk . | awk 'NR==2 {{print $4}}')"
"""
    result = ssh.run(script, timeout_s=SETUP_TIMEOUT_S)
    if result.returncode != 0:
        raise ssh.error(result, "preparing the work folder")
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    try:
        free = int(values["free_kb"]) * 1024
    except (KeyError, ValueError):
        free = None
    return values["work"], values["run"], values.get("lib") == "1", free


def _preamble(device: Device, work: str, run_dir: str, lean: LeanPackage, have_lib: bool) -> tuple[str, str]:
    """The start of a run's script: remove the run folder however the script ends (SIGPIPE and SIGHUP are
    ignored so that, with the connection gone, the shell lives to run its EXIT trap), keep every temporary
    file inside it (the validator is SIGKILLed when the connection drops, so its own clean-up never runs),
    install the lean package when missing, check the device's python. Returns the script text and the
    package's folder."""
    q = shlex.quote
    lib = f"{work}/lib/{lean.digest}"
    install = "" if have_lib else f"""tmp=$(mktemp -d {q(work)}/lib/.install.XXXXXX)
tar xzf {q(run_dir)}/lean.tar.gz -C "$tmp" || {{ rm -rf "$tmp"; echo "cannot unpack edgeopt" >&2; exit 90; }}
[ -d {q(lib)} ] || mv "$tmp" {q(lib)}
rm -rf "$tmp"
"""
    missing = f"edgeopt: no python '{device.python}' on the device"
    return f"""trap '' PIPE HUP
trap 'rm -rf {q(run_dir)}' EXIT
export TMPDIR={q(run_dir)}
{install}command -v {q(device.python)} >/dev/null 2>&1 || {{ echo {q(missing)} >&2; exit 91; }}
""", lib


def _validate(ssh: Ssh, target: Target, work: str, run_dir: str, lean: LeanPackage, have_lib: bool, runs: int,
              warmup: int, min_seconds: float) -> dict:
    d = ssh.device
    q = shlex.quote
    preamble, lib = _preamble(d, work, run_dir, lean, have_lib)
    script = f"""{preamble}cd {q(run_dir)}
PYTHONPATH={q(lib)} {q(d.python)} -m edgeopt.device validate bundle.tar.gz --json result.json --quiet \
  --runs {runs} --warmup {warmup} --min-seconds {min_seconds} --lock {q(work)}/device.lock --slots {d.concurrency} \
  --lock-timeout {max(1, round(d.timeout_s))} --exit-on-stdin-eof
rc=$?
[ -f result.json ] && cat result.json
exit $rc
"""
    result = ssh.run(script, timeout_s=d.timeout_s, retry=False, keep_stdin_open=True)
    if result.returncode == SSH_FAILED:
        error = ssh.error(result, "measuring")
        if "unreachable while" not in str(error):  # authentication, host key: not a lost device
            raise error
        raise DeviceLost(f"device '{d.name}' ({d.address}): connection lost while measuring "
                         f"({_last(result.stderr)}); the candidate is unmeasured")
    text = result.stderr.strip()
    line = text.splitlines()[-1] if text else f"exit {result.returncode}"
    line = line.removeprefix("edgeopt-device: ").removeprefix("edgeopt: ")
    where = f"device '{d.name}' ({d.address})"
    if result.returncode == 91:
        raise DeviceError(f"{where}: {line}; set python in devices.toml to an interpreter with numpy and "
                          f"{target.settings.runtime}")
    if "No module named 'numpy'" in text or "this device has no" in text:
        raise DeviceError(f"{where}: missing runtime: {d.python} lacks "
                          f"{'numpy' if 'numpy' in text else target.settings.runtime}; on the device run: "
                          f"{pip_line(d.python, target.settings.runtime)}")
    if "No space left on device" in text:
        raise DeviceError(f"{where}: the device's disk is full ({line}); free some space or point work_dir elsewhere")
    if result.returncode not in (0, 4):
        raise DeviceError(f"{where}: the validator failed (exit {result.returncode}): {line}")
    try:
        return checked(json.loads(result.stdout), f"{where}: result")
    except json.JSONDecodeError as exc:
        raise DeviceError(f"{where}: the validator's result is not JSON ({first_line(exc)})") from exc


def _last(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def pip_line(python: str, runtime: str) -> str:
    """What to run on the device so that ``python`` has numpy and ``runtime`` (this host's version)."""
    return f"{python} -m pip install numpy {RUNTIME_PIP[runtime]}=={metadata.version(runtime)}"


def _remove(ssh: Ssh, run_dir: str) -> None:
    """Best effort: a run folder left behind (device lost) is removed by a later run after a day."""
    try:
        ssh.run(f"rm -rf {shlex.quote(run_dir)}", timeout_s=SETUP_TIMEOUT_S, retry=False)
    except (DeviceError, BadInputError):
        pass


def facts(device: Device) -> dict:
    """What the device is and has (``edgeopt.device.facts``), installing the lean package when missing."""
    ssh = Ssh(device)
    lean = lean_package()
    work, run_dir, have_lib, _ = _prepare(ssh, lean)
    try:
        if not have_lib:
            with tempfile.TemporaryDirectory(prefix="edgeopt-remote-") as tmp:
                (Path(tmp) / "lean.tar.gz").write_bytes(lean.data)
                ssh.put([str(Path(tmp) / "lean.tar.gz")], run_dir, timeout_s=device.timeout_s)
        preamble, lib = _preamble(device, work, run_dir, lean, have_lib)
        q = shlex.quote
        script = f"{preamble}PYTHONPATH={q(lib)} {q(device.python)} -m edgeopt.device.facts {q(work)}\n"
        result = ssh.run(script, timeout_s=SETUP_TIMEOUT_S)
    except DeviceError:
        _remove(ssh, run_dir)
        raise
    if result.returncode != 0:
        raise ssh.error(result, "reading the device's facts")
    try:
        return json.loads(result.stdout) | {"lean_package": {"digest": lean.digest, "bytes": len(lean.data),
                                                             "files": lean.files}}
    except json.JSONDecodeError as exc:
        raise DeviceError(f"device '{device.name}': unreadable facts ({first_line(exc)})") from exc
