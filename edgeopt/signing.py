"""Ed25519 keys and bundle signatures on the build host, with the ``cryptography`` library.

``generate_keys`` writes a key pair (private key PKCS#8 PEM, mode 0600; public key ``<private>.pub``,
SubjectPublicKeyInfo PEM) and never overwrites a file. A ``Signer`` turns a manifest's bytes into the
``signature.json`` the device checks (``edgeopt.device.signature``). Ed25519 signatures are deterministic, so a
bundle signed twice with the same key is byte-identical.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgeopt.device.bundle_reader import canonical_json
from edgeopt.device.signature import ALGORITHM, SIGNATURE_SCHEMA, PublicKey, public_keys_in
from edgeopt.errors import BadInputError, first_line

ENV_PREFIX = "env:"
PASSPHRASE_ENV = "EDGEOPT_KEY_PASSPHRASE"


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    key_id: str


def generate_keys(private: str | Path) -> KeyPair:
    """Write a new Ed25519 key pair: ``private`` (0600) and ``private`` + ``.pub``. Refuses to overwrite either.
    With ``$EDGEOPT_KEY_PASSPHRASE`` set, the private key is encrypted with it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Path(private)
    public = private.with_name(private.name + ".pub")
    for path in (private, public):
        if path.exists() or path.is_symlink():
            raise BadInputError(f"{path}: already exists; edgeopt never overwrites a key (choose another --out)")
    key = Ed25519PrivateKey.generate()
    passphrase = os.environ.get(PASSPHRASE_ENV)
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _create(private, private_pem, 0o600)
    try:
        _create(public, public_pem, 0o644)
    except BaseException:
        private.unlink()
        raise
    return KeyPair(private, public, public_keys_in(public_pem, str(public))[0].key_id)


def _create(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all, with ``mode`` from the start, failing if it exists (no race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)  # fails if path exists, unlike a rename
    except FileExistsError:
        raise BadInputError(f"{path}: already exists; edgeopt never overwrites a key") from None
    except OSError as exc:
        raise BadInputError(f"{path}: cannot write ({first_line(exc)})") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class Signer:
    """Signs manifests with one private key. ``spec``: a PEM file (readable by its owner only), or
    ``env:NAME`` for a PEM held in an environment variable (a CI secret that never touches the disk)."""

    def __init__(self, spec: str | Path):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.source = str(spec)
        data = _private_pem(self.source)
        passphrase = os.environ.get(PASSPHRASE_ENV)
        try:
            key = serialization.load_pem_private_key(data, passphrase.encode() if passphrase else None)
        except TypeError as exc:  # encrypted without a passphrase, or a passphrase for a plain key
            raise BadInputError(f"--sign {self.source}: {first_line(exc)} (the passphrase comes from "
                                f"${PASSPHRASE_ENV})") from exc
        except ValueError as exc:
            raise BadInputError(f"--sign {self.source}: not a readable PEM private key, or a wrong passphrase "
                                f"({first_line(exc)})") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise BadInputError(f"--sign {self.source}: a {type(key).__name__.removeprefix('_')} key; edgeopt signs "
                                f"with Ed25519 (make one with `edgeopt keys generate`)")
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = PublicKey(raw, self.source)

    def __call__(self, manifest: bytes) -> bytes:
        """The ``signature.json`` bytes for ``manifest`` (deterministic)."""
        return canonical_json({
            "schema": SIGNATURE_SCHEMA, "algorithm": ALGORITHM, "key_id": self.public_key.key_id,
            "public_key": self.public_key.pem().decode("ascii"),
            "signature": base64.b64encode(self._key.sign(manifest)).decode("ascii"),
        })


def _private_pem(spec: str) -> bytes:
    if spec.startswith(ENV_PREFIX):
        name = spec[len(ENV_PREFIX):]
        if not os.environ.get(name):
            raise BadInputError(f"--sign {spec}: environment variable {name} is not set or empty")
        return os.environ[name].encode()
    path = Path(spec)
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise BadInputError(f"--sign {path}: private key is readable by others (mode {stat.filemode(mode)}); "
                                f"run chmod 600 {path}")
        return path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"--sign {path}: cannot read the private key ({first_line(exc)})") from exc
