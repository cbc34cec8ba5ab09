"""Device bundles: deterministic packaging, verification, and refusal of tampered, truncated or unsafe bundles."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tarfile

import pytest
from bundle_support import (FAST, digits_artifact, digits_bundle, digits_report, entry, loose_target, members,
                            write_tar)
from conftest import ROOT

from edgeopt.bundle_writer import write_bundle
from edgeopt.device.bundle_reader import MANIFEST, canonical_json, open_bundle
from edgeopt.errors import BadInputError


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return digits_bundle(tmp_path_factory)


def test_two_builds_of_the_digits_bundle_are_byte_identical(tmp_path, tmp_path_factory, cli):
    artifact, target, report = (digits_artifact(tmp_path_factory), loose_target(tmp_path_factory),
                                digits_report(tmp_path_factory))
    paths = []
    for name, build in (("a", "fw-7"), ("b", "fw-7"), ("c", "fw-8")):
        paths.append(tmp_path / f"{name}.tar.gz")
        result = cli("package", artifact, "--target", target, "--out", paths[-1], "--report", report,
                     "--build-id", build, "--format", "openvino,onnx", "--quiet")
        assert result.exit_code == 0, result.output
    first, second, other_build = (p.read_bytes() for p in paths)
    assert first == second
    assert other_build != first  # the build id is recorded ...
    manifests = [json.loads(members(p)[0][1]) for p in paths]
    for manifest in manifests:  # the provenance statement records the build id too
        del manifest["files"]["provenance.intoto.json"]
    assert {k: v for k, v in manifests[0].items() if k != "build_id"} == \
           {k: v for k, v in manifests[2].items() if k != "build_id"}  # ... and is the only difference
    # Reproducible by construction, not by luck: fixed headers, canonical order, canonical JSON.
    assert first[3] & 0x08 == 0 and first[4:8] == b"\0\0\0\0"  # gzip: no file name, mtime 0
    entries = members(paths[0])
    names = [m.name for m, _ in entries]
    assert names[0] == MANIFEST and names[1:] == sorted(names[1:])
    assert {"model.xml", "model.bin", "model.onnx", "validation.json", "compress_report.json",
            "provenance.intoto.json"} == set(names[1:])
    assert all(m.isreg() and m.mtime == 0 and m.uid == m.gid == 0 and m.mode == 0o644 and not m.uname
               for m, _ in entries)
    assert entries[0][1] == canonical_json(json.loads(members(paths[0])[0][1]))


def test_manifest_describes_model_target_and_validation(bundle, tmp_path_factory):
    checked = open_bundle(bundle)
    manifest = checked.manifest
    report = json.loads(digits_report(tmp_path_factory).read_text())
    assert manifest["model"] == "model.xml" and manifest["runtime"]["name"] == "openvino"
    assert manifest["runtime"]["version"] == report["measured_with"]["runtime_version"]
    (model,) = manifest["models"]
    assert model["precision"] == "int8" and model["files"] == ["model.xml", "model.bin"]
    assert model["inputs"] == [{"name": "x", "shape": [None, 1, 8, 8], "dtype": "float32"}]  # batch dynamic
    assert model["outputs"][0]["shape"][-1] == 10
    assert manifest["recipe"] == "int8" and manifest["build_id"] == "test-1"
    assert manifest["target"]["name"] == "ci-loose-openvino"
    assert manifest["target"]["runtime"]["inference_precision"] == "f32"
    assert manifest["target"]["budgets"] == report["budgets"]
    assert manifest["validation"]["checks"] == report["checks"] and manifest["validation"]["passed"]
    assert report["measured_with"]["summary"] == manifest["validation"]["measured_with"]
    assert manifest["quality"]["artifacts"]["openvino"]["passed"]
    assert set(manifest["quality"]["artifacts"]) == {"openvino"}  # only the bundled format
    assert checked.sha256 == __import__("hashlib").sha256(bundle.read_bytes()).hexdigest()


def test_verify_cli_json_on_stdout_and_exit_codes(bundle, tmp_path):
    ok = _run("verify", bundle, "--json", "-")
    assert ok.returncode == 0 and ok.stderr == ""
    assert json.loads(ok.stdout)["ok"] is True
    quiet = _run("verify", bundle, "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(bundle.read_bytes()[:-4])
    bad = _run("verify", truncated, "--json", "-")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "truncated or corrupt" in bad.stderr and "Traceback" not in bad.stderr
    lean = subprocess.run([sys.executable, "-m", "edgeopt.device", "verify", str(truncated)], capture_output=True,
                          text=True, cwd=ROOT)
    assert lean.returncode == 2 and "truncated or corrupt" in lean.stderr


@pytest.mark.parametrize("keep", [0.5, 0.97, -4, -1])
def test_truncated_bundle_fails(bundle, tmp_path, keep):
    data = bundle.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[:int(len(data) * keep)] if keep > 0 else data[:keep])
    with pytest.raises(BadInputError, match="truncated or corrupt"):
        open_bundle(cut, extract_to=tmp_path / "x")


def test_tampered_file_fails(bundle, tmp_path):
    entries = members(bundle)
    tampered = []
    for info, data in entries:
        if info.name == "model.bin":
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        tampered.append((info, data))
    with pytest.raises(BadInputError, match="'model.bin' fails its sha256 check"):
        open_bundle(write_tar(tmp_path / "t.tar.gz", tampered))
    # A file swapped for one of another size, and a file removed, fail as well.
    resized = [(e if e[0].name != "validation.json" else entry("validation.json", b"{}")) for e in entries]
    with pytest.raises(BadInputError, match="'validation.json' has 2 bytes, the manifest says"):
        open_bundle(write_tar(tmp_path / "r.tar.gz", resized))
    missing = [e for e in entries if e[0].name != "model.xml"]
    with pytest.raises(BadInputError, match="missing file.*model.xml"):
        open_bundle(write_tar(tmp_path / "m.tar.gz", missing))


@pytest.mark.parametrize("extra, message", [
    (entry("../evil.txt", b"x"), "unsafe path '../evil.txt'"),
    (entry("/etc/evil.txt", b"x"), "unsafe path '/etc/evil.txt'"),
    (entry("a/../../evil.txt", b"x"), "unsafe path"),
    (entry("link", kind=tarfile.SYMTYPE, link="/etc/passwd"), "'link' is a link"),
    (entry("hard", kind=tarfile.LNKTYPE, link="model.xml"), "'hard' is a link"),
    (entry("dev", kind=tarfile.CHRTYPE), "'dev' is a special file"),
    (entry("model.xml", b"<net/>"), "'model.xml' appears twice"),
    (entry("extra.txt", b"x"), "'extra.txt' is not listed in manifest.json"),
])
def test_unsafe_or_unlisted_entries_are_refused(bundle, tmp_path, extra, message):
    out = tmp_path / "out"
    with pytest.raises(BadInputError, match=message):
        open_bundle(write_tar(tmp_path / "bad.tar.gz", [*members(bundle), extra]), extract_to=out)
    assert not (tmp_path / "evil.txt").exists() and not list(tmp_path.glob("**/evil.txt"))
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_manifest_must_come_first(bundle, tmp_path):
    entries = members(bundle)
    with pytest.raises(BadInputError, match="first entry must be manifest.json"):
        open_bundle(write_tar(tmp_path / "b.tar.gz", entries[1:] + entries[:1]))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("runtime"), "manifest.json: missing key 'runtime'"),
    (lambda m: m.update(schema="edgeopt-bundle/99"), "schema 'edgeopt-bundle/99' is not supported"),
    (lambda m: m.update(colour="red"), "unknown key\\(s\\) colour"),
    (lambda m: m["models"][0].update(inputs="input"), "models\\[0\\].inputs: expected a list"),
    (lambda m: m["validation"].update(passed="yes"), "validation.passed: expected bool"),
    (lambda m: m["files"]["model.xml"].update(sha256="beef"), "files.model.xml: needs bytes >= 0 and a 64-digit"),
    (lambda m: m.update(model="other.xml"), "model 'other.xml' is not one of models"),
])
def test_manifest_schema_errors_are_clear(bundle, tmp_path, edit, message):
    entries = members(bundle)
    manifest = json.loads(entries[0][1])
    edit(manifest)
    broken = write_tar(tmp_path / "s.tar.gz", [entry(MANIFEST, canonical_json(manifest)), *entries[1:]])
    with pytest.raises(BadInputError, match=message):
        open_bundle(broken)
    result = _run("verify", broken)
    assert result.returncode == 2 and result.stderr.startswith("edgeopt: ") and result.stderr.count("\n") == 1


def test_not_json_and_not_gzip(tmp_path, bundle):
    not_json = write_tar(tmp_path / "j.tar.gz", [entry(MANIFEST, b"{not json")])
    with pytest.raises(BadInputError, match="manifest.json is not valid JSON"):
        open_bundle(not_json)
    plain = tmp_path / "plain.tar.gz"
    plain.write_bytes(gzip.decompress(bundle.read_bytes()))
    with pytest.raises(BadInputError, match="truncated or corrupt"):
        open_bundle(plain)


def test_writer_refuses_what_the_reader_would(tmp_path, bundle):
    manifest = json.loads(members(bundle)[0][1])
    with pytest.raises(BadInputError, match="unsafe path"):
        write_bundle(tmp_path / "w.tar.gz", manifest, {"../model.xml": b"x"})
    with pytest.raises(BadInputError, match="which files does not list"):
        write_bundle(tmp_path / "w.tar.gz", manifest, {"validation.json": b"{}"})
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file


def test_package_refuses_failed_budget_and_gate(tmp_path, tmp_path_factory, cli):
    artifact = digits_artifact(tmp_path_factory)
    tight = tmp_path / "tight.toml"
    tight.write_text(loose_target(tmp_path_factory).read_text().replace("p50_ms = 1000", "p50_ms = 0.000001"))
    out = tmp_path / "b.tar.gz"
    verdict = tmp_path / "verdict.json"
    result = cli("package", artifact, "--target", tight, "--out", out, "--json", verdict, *FAST)
    assert result.exit_code == 4 and "p50_ms" in result.output and not out.exists()
    assert "FAIL" in result.output and "latency ms: p50" in result.output  # the figures that failed, printed
    refused = json.loads(verdict.read_text())  # and machine-readable for a build pipeline
    assert refused["packaged"] is False and refused["bundle"] is None and refused["exit_code"] == 4
    failed = [c for c in refused["validation"]["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["p50_ms"] and failed[0]["measured"] > 0.000001
    failed_gate = tmp_path / "gate"
    failed_gate.mkdir()
    for f in artifact.iterdir():
        (failed_gate / f.name).write_bytes(f.read_bytes())
    report = json.loads((artifact / "report.json").read_text())
    report["quality"]["passed"] = report["quality"]["artifacts"]["openvino"]["passed"] = False
    (failed_gate / "report.json").write_text(json.dumps(report))
    result = cli("package", failed_gate, "--target", loose_target(tmp_path_factory), "--out", out, *FAST)
    assert result.exit_code == 3 and "model.xml failed its quality gate" in result.output and not out.exists()
    # a model file changed since: the report does not describe it (its sha256 differs), so it is not its report
    changed = tmp_path / "changed"
    changed.mkdir()
    for f in failed_gate.iterdir():
        (changed / f.name).write_bytes(f.read_bytes() + (b"\n" if f.name == "model.xml" else b""))
    result = cli("package", changed / "model.xml", "--target", loose_target(tmp_path_factory), "--out", out, *FAST)
    assert result.exit_code == 0 and open_bundle(out).manifest["quality"] is None, result.output
    out.unlink()
    # the ONNX file passed its own gate: only the IR failed
    result = cli("package", failed_gate / "model.onnx", "--target", loose_target(tmp_path_factory, "onnxruntime"),
                 "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    out.unlink()
    # one file of that folder: the report beside it that lists it still holds the gate
    result = cli("package", failed_gate / "model.xml", "--target", loose_target(tmp_path_factory), "--out", out,
                 *FAST)
    assert result.exit_code == 3 and "quality gate" in result.output and not out.exists()
    unlisted = tmp_path / "unlisted"
    unlisted.mkdir()
    for f in ("model.xml", "model.bin"):
        (unlisted / f).write_bytes((artifact / f).read_bytes())
    (unlisted / "report.json").write_text(json.dumps({"recipe": {}, "artifacts": [], "quality": {"passed": False}}))
    result = cli("package", unlisted / "model.xml", "--target", loose_target(tmp_path_factory), "--out", out, *FAST)
    assert result.exit_code == 0, result.output  # a report that does not list the file is not its report
    assert open_bundle(out).manifest["quality"] is None
    result = cli("package", artifact / "model.xml", "--target", loose_target(tmp_path_factory), "--out", out,
                 "--force", *FAST)
    assert result.exit_code == 0, result.output
    assert open_bundle(out).manifest["quality"]["artifacts"]["openvino"]["passed"]  # the folder's report, kept
    out.unlink()
    # A report measured for another target's budgets is not bundled under this one.
    result = cli("package", artifact, "--target", tight, "--out", out, "--report", digits_report(tmp_path_factory))
    assert result.exit_code == 2 and "other budgets" in result.output and not out.exists()


def test_compress_package_writes_a_verified_bundle(tmp_path, tiny_factory, tiny_calib, tmp_path_factory, cli):
    target = loose_target(tmp_path_factory)
    out, bundle = tmp_path / "out", tmp_path / "tiny.tar.gz"
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--out", out, "--target", target,
                 "--validate-runs", "20", "--validate-seconds", "0", "--package", bundle, "--build-id", "fw-7",
                 "--quiet")
    assert result.exit_code == 0, result.output
    manifest = open_bundle(bundle).manifest
    assert manifest["build_id"] == "fw-7"
    assert manifest["models"][0]["precision"] == "int8" and manifest["validation"]["passed"]
    saved = json.loads((out / "report.json").read_text())["validation"]["reports"][0]
    assert manifest["validation"]["checks"] == saved["checks"]  # the validation compress ran, not a second one
    assert cli("compress", tiny_factory, "--calib", tiny_calib, "--out", tmp_path / "o2", "--package",
               tmp_path / "x.tar.gz").exit_code == 2


def _run(*args) -> subprocess.CompletedProcess:
    """The CLI in its own process, output captured (not a terminal), as a firmware pipeline runs it."""
    command = [sys.executable, "-c", "from edgeopt.cli import main; main(prog_name='edgeopt')", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
