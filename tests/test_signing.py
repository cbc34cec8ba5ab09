"""Signed bundles and provenance: keys, deterministic signatures, refusal of every tampering by the host
`edgeopt verify` and by the lean device validator (cryptography on the host, openssl in a numpy+openvino venv)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from bundle_support import (FAST, digits_artifact, digits_report, entry, lean_edgeopt, loose_target, members,
                            runtime_venv, write_tar)
from conftest import DIGITS_CALIB, DIGITS_EVAL, ROOT

from edgeopt.device.bundle_reader import MANIFEST, canonical_json, open_bundle
from edgeopt.device.signature import SIGNATURE, load_trust, openssl_version, verify_with_openssl
from edgeopt.errors import BadInputError
from edgeopt.provenance import STATEMENT, profile_digest
from edgeopt.signing import Signer, generate_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two key pairs: the build pipeline's and an attacker's."""
    folder = tmp_path_factory.mktemp("keys")
    return generate_keys(folder / "release.key"), generate_keys(folder / "attacker.key")


@pytest.fixture(scope="module")
def signed(keys, tmp_path_factory) -> Path:
    from edgeopt.packaging import package

    path = tmp_path_factory.mktemp("signed") / "digits.tar.gz"
    package(digits_artifact(tmp_path_factory), loose_target(tmp_path_factory), path,
            report=digits_report(tmp_path_factory), build_id="fw-1", sign=keys[0].private)
    return path


def _tamper(bundle: Path, out: Path, manifest_edit=None, member_edit=None, resign=None, extra=()) -> Path:
    """A copy of ``bundle`` with its manifest or members changed; ``resign`` signs the new manifest again."""
    entries = members(bundle)
    manifest = json.loads(entries[0][1])
    result = []
    for info, data in entries[1:]:
        if member_edit is not None:
            data = member_edit(info.name, data)
            info.size = len(data)
        result.append((info, data))
    if manifest_edit is not None:
        manifest_edit(manifest, {info.name: data for info, data in result})
    text = canonical_json(manifest) if manifest_edit is not None else entries[0][1]
    if resign is not None:
        result = [(i, d) if i.name != SIGNATURE else entry(SIGNATURE, resign(text)) for i, d in result]
    return write_tar(out, [entry(MANIFEST, text), *result, *extra])


def _flip_model_byte(name, data):
    return data[:200] + bytes([data[200] ^ 1]) + data[201:] if name == "model.bin" else data


def _rehash(manifest, members_by_name):
    for name, data in members_by_name.items():
        if name in manifest["files"]:
            manifest["files"][name]["sha256"] = hashlib.sha256(data).hexdigest()


def _edit_signature(edit):
    def member_edit(name, data):
        if name != SIGNATURE:
            return data
        record = json.loads(data)
        edit(record)
        return canonical_json(record)
    return member_edit


def _flip_signature(record):
    value = bytearray(base64.b64decode(record["signature"]))
    value[10] ^= 1
    record["signature"] = base64.b64encode(bytes(value)).decode()


def _swap_embedded_key(attacker_pub: Path):
    def edit(record):
        record["public_key"] = attacker_pub.read_text()
    return edit


def _move_signature_last(bundle: Path, out: Path) -> Path:
    entries = members(bundle)
    return write_tar(out, [entries[0], *entries[2:], entries[1]])


# Each case: how the signed bundle is changed, and what the refusal says (host and device alike).
TAMPERINGS = {
    "model byte": (lambda b, o, k: _tamper(b, o, member_edit=_flip_model_byte), "'model.bin' fails its sha256 check"),
    "model byte, manifest rewritten": (lambda b, o, k: _tamper(b, o, member_edit=_flip_model_byte,
                                                              manifest_edit=_rehash), "bad signature"),
    "manifest field": (lambda b, o, k: _tamper(b, o, manifest_edit=lambda m, _: m["target"]["budgets"].update(
        p50_ms=1e9)), "bad signature"),
    "signature": (lambda b, o, k: _tamper(b, o, member_edit=_edit_signature(_flip_signature)), "bad signature"),
    "re-signed with another key": (lambda b, o, k: _tamper(b, o, member_edit=_flip_model_byte, manifest_edit=_rehash,
                                                          resign=Signer(k[1].private)), "not in the trust list"),
    "embedded public key swapped": (lambda b, o, k: _tamper(b, o, member_edit=_edit_signature(
        _swap_embedded_key(k[1].public))), "do not fit together"),
    "file added": (lambda b, o, k: _tamper(b, o, extra=[entry("payload.sh", b"#!/bin/sh\n")]),
                   "'payload.sh' is not listed"),
    "signature moved after the files": (lambda b, o, k: _move_signature_last(b, o), "bundle is not signed"),
}


def test_keys_generate_writes_0600_and_never_overwrites(tmp_path, cli):
    key = tmp_path / "ci" / "release.key"
    result = cli("keys", "generate", "--out", key)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    public = key.with_name("release.key.pub")
    (trusted,) = load_trust([public])
    assert trusted.key_id in result.output and public.read_bytes() == trusted.pem()  # the lean PEM reader agrees
    before = (key.read_bytes(), public.read_bytes())
    again = cli("keys", "generate", "--out", key)
    assert again.exit_code == 2 and "already exists" in again.output and again.output.count("\n") == 1
    assert (key.read_bytes(), public.read_bytes()) == before
    public_only = tmp_path / "other.key.pub"
    public_only.write_text("mine")
    assert cli("keys", "generate", "--out", tmp_path / "other.key").exit_code == 2
    assert not (tmp_path / "other.key").exists() and public_only.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ci", "other.key.pub", "release.key", "release.key.pub"]


def test_signing_twice_gives_byte_identical_bundles(keys, signed, tmp_path, tmp_path_factory, cli, monkeypatch):
    artifact, target, report = (digits_artifact(tmp_path_factory), loose_target(tmp_path_factory),
                                digits_report(tmp_path_factory))
    common = ("--target", target, "--report", report, "--build-id", "fw-1", "--quiet")
    monkeypatch.setenv("EDGEOPT_TEST_KEY", keys[0].private.read_text())
    for name, key in (("a", keys[0].private), ("b", keys[0].private), ("env", "env:EDGEOPT_TEST_KEY"),
                      ("other", keys[1].private), ("plain", None)):
        sign = ("--sign", key) if key else ()
        result = cli("package", artifact, *common, *sign, "--out", tmp_path / f"{name}.tar.gz")
        assert result.exit_code == 0, result.output
    first = (tmp_path / "a.tar.gz").read_bytes()
    assert first == (tmp_path / "b.tar.gz").read_bytes() == (tmp_path / "env.tar.gz").read_bytes()
    assert first == signed.read_bytes()  # the library call and the CLI agree too
    names = [m.name for m, _ in members(signed)]
    assert names[:2] == [MANIFEST, SIGNATURE] and STATEMENT in names
    # The signature is detached: the manifest is the unsigned bundle's, byte for byte.
    plain, other = members(tmp_path / "plain.tar.gz"), members(tmp_path / "other.tar.gz")
    assert members(signed)[0][1] == plain[0][1] == other[0][1]
    assert [m.name for m, _ in plain] == [n for n in names if n != SIGNATURE]
    assert json.loads(members(signed)[1][1])["key_id"] == keys[0].key_id
    assert json.loads(other[1][1])["key_id"] == keys[1].key_id


def test_host_verify_accepts_the_signed_bundle_and_shows_provenance(keys, signed, tmp_path, cli):
    ok = cli("verify", signed, "--trust", keys[1].public, "--trust", keys[0].public, "--show")
    assert ok.exit_code == 0, ok.output
    assert f"trusted key {keys[0].key_id[:16]}" in ok.output
    assert f"verified with cryptography {version('cryptography')}" in ok.output
    sha = hashlib.sha256((ROOT / "samples" / "digits" / "model.py").read_bytes()).hexdigest()
    assert f"source model: model.py:build (sha256 model.py {sha}" in ok.output
    assert f"calibration data: calib.npz sha256 {hashlib.sha256(DIGITS_CALIB.read_bytes()).hexdigest()}" in ok.output
    assert f"evaluation data: eval.npz sha256 {hashlib.sha256(DIGITS_EVAL.read_bytes()).hexdigest()}" in ok.output
    assert f"nncf {version('nncf')}" in ok.output and "build id: fw-1" in ok.output and "recipe: int8" in ok.output
    # A folder of public keys is a trust list too; without one the signature is reported, not claimed checked.
    folder = tmp_path / "trust.d"
    folder.mkdir()
    (folder / "release.pub").write_bytes(keys[0].public.read_bytes())
    data = json.loads(cli("verify", signed, "--trust", folder, "--json", "-").output)
    assert data["signature"] == {"signed": True, "key_id": keys[0].key_id, "verified": True,
                                 "trusted_as": str(folder / "release.pub"),
                                 "verifier": f"cryptography {version('cryptography')}"}
    unchecked = cli("verify", signed)
    assert unchecked.exit_code == 0 and "not checked (no trust list given)" in unchecked.output
    empty = tmp_path / "empty.d"
    empty.mkdir()
    refused = cli("verify", signed, "--trust", empty)
    assert refused.exit_code == 2 and "no Ed25519 public key" in refused.output


def test_provenance_in_the_manifest(signed, tmp_path_factory):
    manifest = open_bundle(signed).manifest
    provenance = manifest["provenance"]
    model = provenance["source_model"]
    assert model["name"] == "model.py:build" and len(model["weights_sha256"]) == 64
    from edgeopt.provenance import _weights_digest
    from edgeopt.user_code import load_function

    build = load_function(ROOT / "samples" / "digits" / "model.py", "build", "model factory")
    assert model["weights_sha256"] == _weights_digest(build()[0])  # the weights as loaded, not only the .py
    calib = provenance["data"]["calibration"]
    assert calib["samples"] > 0 and calib["sha256"] == hashlib.sha256(DIGITS_CALIB.read_bytes()).hexdigest()
    assert provenance["data"]["training"] is None
    assert provenance["recipe"] == [{"name": "int8", "params": {}}]
    built_with = provenance["tools"]["compress"]
    assert {name: built_with[name] for name in ("nncf", "openvino", "onnxruntime", "torch")} == \
           {name: version(name) for name in ("nncf", "openvino", "onnxruntime", "torch")}
    assert built_with["edgeopt"] == version("edgeopt") == manifest["edgeopt_version"]
    from edgeopt.targets import load_target

    target = load_target(loose_target(tmp_path_factory))
    assert provenance["target"] == {"name": target.name, "sha256": profile_digest(target)}
    statement = json.loads(dict((m.name, d) for m, d in members(signed))[STATEMENT])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == \
           {name: manifest["files"][name]["sha256"] for name in ("model.xml", "model.bin")}
    dependencies = {d["name"]: d["digest"]["sha256"] for d in statement["predicate"]["buildDefinition"]
                    ["resolvedDependencies"]}
    assert dependencies["calibration/calib.npz"] == calib["sha256"]
    assert statement["predicate"]["runDetails"]["metadata"]["invocationId"] == "fw-1"


@pytest.mark.parametrize("case", sorted(TAMPERINGS))
def test_host_refuses_tampering(case, keys, signed, tmp_path):
    make, message = TAMPERINGS[case]
    bad = make(signed, tmp_path / "bad.tar.gz", keys)
    result = _host("verify", bad, "--trust", keys[0].public)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    # The signature is checked before any file is extracted.
    out = tmp_path / "extracted"
    with pytest.raises(BadInputError, match=message):
        open_bundle(bad, extract_to=out, trust=load_trust([keys[0].public]))
    if "signature" in message or "trust list" in message or "fit together" in message or "not signed" in message:
        assert not any(out.iterdir())


def test_unsigned_bundle_and_unknown_key_are_refused(keys, signed, tmp_path, tmp_path_factory):
    from bundle_support import digits_bundle

    unsigned = _host("verify", digits_bundle(tmp_path_factory), "--trust", keys[0].public)
    assert unsigned.returncode == 2 and "bundle is not signed" in unsigned.stderr
    unknown = _host("verify", signed, "--trust", keys[1].public)
    assert unknown.returncode == 2 and f"signed by key {keys[0].key_id[:16]}, which is not in the trust list" \
        in unknown.stderr


def test_openssl_backend_agrees_with_cryptography(keys, signed):
    text = members(signed)[0][1]
    record = json.loads(members(signed)[1][1])
    (key,) = load_trust([keys[0].public])
    value = base64.b64decode(record["signature"])
    assert verify_with_openssl(key, value, text)
    assert not verify_with_openssl(key, value, text.replace(b"fw-1", b"fw-2"))
    (other,) = load_trust([keys[1].public])
    assert not verify_with_openssl(other, value, text)


def test_old_openssl_is_refused_with_a_clear_message(tmp_path):
    fake = tmp_path / "openssl"
    fake.write_text("#!/bin/sh\necho 'OpenSSL 1.0.2k-fips  26 Jan 2017'\n")
    fake.chmod(0o755)
    with pytest.raises(BadInputError, match="needs OpenSSL 1.1.1 or later"):
        openssl_version(str(fake))
    fake.write_text("#!/bin/sh\necho 'LibreSSL 3.3.6'\n")
    with pytest.raises(BadInputError, match="needs OpenSSL 1.1.1"):
        openssl_version(str(fake))


def test_bad_private_keys_are_refused(keys, tmp_path, tmp_path_factory, cli, monkeypatch):
    loose = tmp_path / "loose.key"
    loose.write_bytes(keys[0].private.read_bytes())
    loose.chmod(0o644)
    common = (digits_artifact(tmp_path_factory), "--target", loose_target(tmp_path_factory), "--report",
              digits_report(tmp_path_factory), "--out", tmp_path / "b.tar.gz")
    result = cli("package", *common, "--sign", loose)
    assert result.exit_code == 2 and "readable by others" in result.output
    assert cli("package", *common, "--sign", keys[0].public).exit_code == 2  # a public key is no private key
    assert "not set" in cli("package", *common, "--sign", "env:EDGEOPT_NO_SUCH_VAR").output
    monkeypatch.setenv("EDGEOPT_KEY_PASSPHRASE", "s3cret")
    pair = generate_keys(tmp_path / "locked.key")
    assert b"ENCRYPTED" in pair.private.read_bytes()
    assert cli("package", *common, "--sign", pair.private, "--quiet").exit_code == 0
    assert _host("verify", tmp_path / "b.tar.gz", "--trust", pair.public).returncode == 0
    monkeypatch.delenv("EDGEOPT_KEY_PASSPHRASE")
    locked = cli("package", *common, "--sign", pair.private)
    assert locked.exit_code == 2 and "EDGEOPT_KEY_PASSPHRASE" in locked.output
    assert not list(tmp_path.glob(".b.tar.gz*"))  # no temporary file left behind


def test_compress_package_sign(keys, tmp_path, tiny_factory, tiny_calib, tmp_path_factory, cli):
    bundle = tmp_path / "tiny.tar.gz"
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--out", tmp_path / "out", "--target",
                 loose_target(tmp_path_factory), "--validate-runs", "20", "--validate-seconds", "0", "--package",
                 bundle, "--sign", keys[0].private, "--quiet")
    assert result.exit_code == 0, result.output
    checked = open_bundle(bundle, trust=load_trust([keys[0].public]))
    assert checked.signature.key_id == keys[0].key_id
    assert checked.manifest["provenance"]["data"]["calibration"]["sha256"] == \
        hashlib.sha256(tiny_calib.read_bytes()).hexdigest()
    # A bad key fails at once, before compressing.
    bad = cli("compress", tiny_factory, "--calib", tiny_calib, "--out", tmp_path / "o2", "--target",
              loose_target(tmp_path_factory), "--package", tmp_path / "x.tar.gz", "--sign", tmp_path / "none.key")
    assert bad.exit_code == 2 and "cannot read the private key" in bad.output and not (tmp_path / "o2").exists()


def test_bundles_of_schema_1_are_still_read(signed, tmp_path):
    def downgrade(manifest, _):
        manifest["schema"] = "edgeopt-bundle/1"
        del manifest["provenance"], manifest["golden"]  # /1 had neither
    old = _tamper(signed, tmp_path / "old.tar.gz", manifest_edit=downgrade)
    assert open_bundle(old).manifest["schema"] == "edgeopt-bundle/1"
    shown = _host("verify", old, "--show")
    assert shown.returncode == 0 and "provenance: none recorded" in shown.stdout


def test_lean_validator_checks_signatures_with_openssl(keys, signed, tmp_path):
    """numpy + openvino only (no cryptography), openssl on PATH: a signed bundle validates, every tampering is
    refused with exit 2 before anything runs, and without openssl a trusted check is refused, not skipped."""
    python = str(runtime_venv("openvino") / "bin" / "python")
    absent = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('cryptography'))"],
                            capture_output=True, text=True, check=True)
    assert absent.stdout.strip() == "None"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(lean_edgeopt(tmp_path / "lean")),
           "HOME": str(tmp_path)}
    trust = ("--trust", keys[0].public)
    ok = _device(python, "validate", signed, *trust, *FAST, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert f"trusted key {keys[0].key_id[:16]}" in ok.stdout and "verified with openssl " in ok.stdout
    for case, (make, message) in sorted(TAMPERINGS.items()):
        bad = make(signed, tmp_path / f"{case.replace(' ', '-')}.tar.gz", keys)
        result = _device(python, "validate", bad, *trust, *FAST, env=env, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (case, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stdout == ""
    unknown = _device(python, "verify", signed, "--trust", keys[1].public, env=env, cwd=tmp_path)
    assert unknown.returncode == 2 and "not in the trust list" in unknown.stderr
    # No verifier at all: a trusted check is refused with what to install; without --trust it runs.
    bare = {**env, "PATH": str(tmp_path / "no-tools")}
    refused = _device(python, "validate", signed, *trust, *FAST, env=bare, cwd=tmp_path)
    assert refused.returncode == 2 and "neither the Python package 'cryptography' nor the 'openssl' command" \
        in refused.stderr
    unchecked = _device(python, "verify", signed, env=bare, cwd=tmp_path)
    assert unchecked.returncode == 0 and "not checked (no trust list given)" in unchecked.stdout


def _host(*args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "from edgeopt.cli import main; main(prog_name='edgeopt')", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)


def _device(python: str, *args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "edgeopt.device", *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("signature, message", [
    (b"{not json", "signature.json: not valid JSON"),
    (b'{"schema": "edgeopt-signature/1"}', "expected exactly the string fields"),
    (b" " * (64 << 10) + b"{}", "'signature.json' is 65538 bytes \\(limit 65536\\)"),
])
def test_malformed_signatures_are_refused_before_any_file(keys, signed, tmp_path, signature, message):
    bad = _tamper(signed, tmp_path / "bad.tar.gz", member_edit=lambda name, data: signature if name == SIGNATURE
                  else data)
    for trust in (None, load_trust([keys[0].public])):
        with pytest.raises(BadInputError, match=message):
            open_bundle(bad, extract_to=tmp_path / "x", trust=trust)
        assert not any((tmp_path / "x").iterdir())


def test_trust_list_takes_only_ed25519_keys(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_pub = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    path = tmp_path / "rsa.pem"
    path.write_bytes(rsa_pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(BadInputError, match="not Ed25519"):
        load_trust([path])
    with pytest.raises(BadInputError, match="cannot read"):
        load_trust([tmp_path / "missing.pub"])


def test_with_a_trust_list_the_signature_is_checked_before_the_manifest_is_read(keys, signed, tmp_path):
    broken = _tamper(signed, tmp_path / "bad.tar.gz", manifest_edit=lambda m, _: m.update(colour="red"))
    with pytest.raises(BadInputError, match="bad signature"):
        open_bundle(broken, trust=load_trust([keys[0].public]))
    with pytest.raises(BadInputError, match="unknown key\\(s\\) colour"):
        open_bundle(broken)
