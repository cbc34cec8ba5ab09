"""Check a bundle's Ed25519 signature against a trust list, with as little as the device has.

A signed bundle holds ``signature.json`` right after ``manifest.json``: the Ed25519 signature of the manifest's
exact bytes and the signer's key id (sha256 of the raw 32-byte public key). A trust list is a set of PEM public
keys: files (each may hold several keys) or folders of ``*.pem`` / ``*.pub`` files. The signature is checked
with ``cryptography`` when it is importable, else with the system ``openssl`` (1.1.1 or later:
``pkeyutl -verify -rawin``); with neither, a check against a trust list is refused, never skipped.

Lean module: standard library only (``cryptography`` or ``openssl`` when present).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import BadInputError, first_line

SIGNATURE = "signature.json"
SIGNATURE_SCHEMA = "edgeopt-signature/1"
ALGORITHM = "ed25519"
MAX_SIGNATURE_BYTES = 64 << 10
# DER SubjectPublicKeyInfo of an Ed25519 key: this fixed prefix (SEQUENCE, algorithm 1.3.101.112), then the 32 bytes.
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM = re.compile(rb"-----BEGIN PUBLIC KEY-----(.*?)-----END PUBLIC KEY-----", re.S)
_KEY_SUFFIXES = (".pem", ".pub")


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key (its 32 raw bytes) and where it came from."""

    raw: bytes
    source: str

    @property
    def key_id(self) -> str:
        return key_id(self.raw)

    def pem(self) -> bytes:
        body = base64.encodebytes(_SPKI_PREFIX + self.raw).decode("ascii")
        return f"-----BEGIN PUBLIC KEY-----\n{body}-----END PUBLIC KEY-----\n".encode("ascii")


@dataclass(frozen=True)
class SignatureCheck:
    """What the reader found: who signed (``None``: unsigned), and whether and how that was verified."""

    key_id: str | None
    trusted_as: str | None = None  # the trust list entry that holds the key; None when not checked
    verifier: str | None = None  # "cryptography 44.0.1" or "openssl 3.0.13"

    def describe(self) -> dict:
        return {"signed": self.key_id is not None, "key_id": self.key_id, "verified": self.verifier is not None,
                "trusted_as": self.trusted_as, "verifier": self.verifier}

    def summary(self) -> str:
        if self.key_id is None:
            return "unsigned"
        if self.verifier is None:
            return f"signed by key {short(self.key_id)}, not checked (no trust list given)"
        return f"signature by trusted key {short(self.key_id)} ({self.trusted_as}) verified with {self.verifier}"


def key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def short(key: str) -> str:
    return key[:16]


def public_keys_in(data: bytes, source: str) -> list[PublicKey]:
    """Every Ed25519 ``PUBLIC KEY`` PEM block in ``data``; any other key type is an error."""
    keys = []
    for block in _PEM.findall(data):
        try:
            der = base64.b64decode(b"".join(block.split()), validate=True)
        except binascii.Error as exc:
            raise BadInputError(f"{source}: a PUBLIC KEY block is not valid base64") from exc
        if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
            raise BadInputError(f"{source}: holds a public key that is not Ed25519 (edgeopt signs with Ed25519)")
        keys.append(PublicKey(der[len(_SPKI_PREFIX):], source))
    return keys


def load_trust(paths) -> tuple[PublicKey, ...]:
    """The trust list: the Ed25519 public keys in the given PEM files and in the ``*.pem``/``*.pub`` files of the
    given folders. A path without any key is an error (a trust list that trusts nothing is a mistake)."""
    keys: list[PublicKey] = []
    for given in map(Path, paths):
        files = sorted(p for p in given.iterdir() if p.suffix in _KEY_SUFFIXES) if given.is_dir() else [given]
        found = []
        for path in files:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise BadInputError(f"--trust {path}: cannot read ({first_line(exc)})") from exc
            found += public_keys_in(data, str(path))
        if not found:
            raise BadInputError(f"--trust {given}: no Ed25519 public key (PEM 'PUBLIC KEY') found")
        keys += found
    return tuple(keys)


def check(manifest: bytes, signature: bytes | None, trust: tuple[PublicKey, ...] | None,
          source: str) -> SignatureCheck:
    """Check ``signature`` (the bytes of ``signature.json``, ``None`` when the bundle has none) over the manifest's
    bytes against ``trust`` (``None``: no trust list, nothing to check but the record's form)."""
    if signature is None:
        if trust is not None:
            raise BadInputError(f"{source}: bundle is not signed; a trust list was given, so only a bundle signed by "
                                f"one of its {len(trust)} key(s) is accepted")
        return SignatureCheck(None)
    signer, value = _parse(signature, source)
    if trust is None:
        return SignatureCheck(signer)
    key = next((k for k in trust if k.key_id == signer), None)
    if key is None:
        trusted = ", ".join(short(k.key_id) for k in trust)
        raise BadInputError(f"{source}: signed by key {short(signer)}, which is not in the trust list ({trusted}); "
                            f"refused")
    name, verify = verifier()
    if not verify(key, value, manifest):
        raise BadInputError(f"{source}: bad signature: {key.source}'s key {short(signer)} did not sign this "
                            f"manifest.json (changed after signing, or a forged signature); refused")
    return SignatureCheck(signer, key.source, name)


def _parse(data: bytes, source: str) -> tuple[str, bytes]:
    """The signer's key id and the 64-byte signature, from a ``signature.json`` whose every field is checked."""
    where = f"{source}: {SIGNATURE}"
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{where}: not valid JSON ({first_line(exc)})") from exc
    fields = {"schema", "algorithm", "key_id", "public_key", "signature"}
    if not isinstance(record, dict) or set(record) != fields or not all(isinstance(record[f], str) for f in fields):
        raise BadInputError(f"{where}: expected exactly the string fields {', '.join(sorted(fields))}")
    if record["schema"] != SIGNATURE_SCHEMA or record["algorithm"] != ALGORITHM:
        raise BadInputError(f"{where}: schema '{record['schema']}', algorithm '{record['algorithm']}' are not "
                            f"supported (expected '{SIGNATURE_SCHEMA}', '{ALGORITHM}')")
    embedded = public_keys_in(record["public_key"].encode("ascii", "replace"), where)
    try:
        value = base64.b64decode(record["signature"], validate=True)
    except binascii.Error as exc:
        raise BadInputError(f"{where}: signature is not valid base64") from exc
    if len(embedded) != 1 or embedded[0].key_id != record["key_id"] or len(value) != 64:
        raise BadInputError(f"{where}: key_id, public_key and a 64-byte signature do not fit together; refused")
    return record["key_id"], value


def verifier():
    """``(name, verify)`` for the best verifier this device has: ``cryptography``, else ``openssl``; raises a
    ``BadInputError`` saying what to install when it has neither."""
    try:
        from importlib.metadata import version

        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: F401

        return f"cryptography {version('cryptography')}", verify_with_cryptography
    except ImportError:
        pass
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BadInputError("cannot check the bundle's signature: this device has neither the Python package "
                            "'cryptography' nor the 'openssl' command (1.1.1 or later); install one, the bundle "
                            "is not accepted unchecked")
    return f"openssl {openssl_version(openssl)}", verify_with_openssl


def verify_with_cryptography(key: PublicKey, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(key.raw).verify(signature, data)
        return True
    except InvalidSignature:
        return False


def openssl_version(openssl: str) -> str:
    """The version of ``openssl``; a ``BadInputError`` when it cannot verify Ed25519 (before 1.1.1, LibreSSL)."""
    try:
        text = subprocess.run([openssl, "version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInputError(f"cannot check the bundle's signature: {openssl} does not run ({first_line(exc)})") from exc
    found = re.match(r"OpenSSL (\d+)\.(\d+)\.(\d+)([a-z]*)", text)
    if not found or tuple(map(int, found.groups()[:3])) < (1, 1, 1):
        raise BadInputError(f"cannot check the bundle's signature: {openssl} is '{text or 'unknown'}'; Ed25519 "
                            f"verification needs OpenSSL 1.1.1 or later (or the Python package 'cryptography')")
    return ".".join(found.groups()[:3]) + found.group(4)


def verify_with_openssl(key: PublicKey, signature: bytes, data: bytes) -> bool:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BadInputError("cannot check the bundle's signature: no 'openssl' command")
    with tempfile.TemporaryDirectory(prefix="edgeopt-sig-") as tmp:
        paths = {name: Path(tmp) / name for name in ("key.pem", "data", "sig")}
        for name, content in zip(paths, (key.pem(), data, signature)):
            paths[name].write_bytes(content)
        try:
            result = subprocess.run([openssl, "pkeyutl", "-verify", "-pubin", "-inkey", str(paths["key.pem"]),
                                     "-rawin", "-in", str(paths["data"]), "-sigfile", str(paths["sig"])],
                                    capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BadInputError(f"cannot check the bundle's signature: openssl failed ({first_line(exc)})") from exc
    if result.returncode == 0 and "Signature Verified Successfully" in result.stdout:
        return True
    if "Signature Verification Failure" in result.stdout + result.stderr:
        return False
    raise BadInputError(f"cannot check the bundle's signature: openssl pkeyutl failed "
                        f"({(result.stderr.strip().splitlines() or ['no message'])[0][:200]})")
