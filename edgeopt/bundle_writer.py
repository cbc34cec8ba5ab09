"""Write a device bundle: a deterministic ``.tar.gz`` of the model files, reports and ``manifest.json``.

Equal inputs give byte-identical bundles: ``manifest.json`` first, then ``signature.json`` when signed (Ed25519
is deterministic), then the other files sorted by name;
regular files only, mode 0644, mtime 0, uid/gid 0, no user/group names (ustar); gzip header with mtime 0 and
no file name; JSON written canonically (sorted keys). The manifest lists every other file's size and sha256
and is checked against the reader's schema before anything is written. Written atomically.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from edgeopt.atomic import atomic_file
from edgeopt.device.bundle_reader import MANIFEST, canonical_json, check_manifest, check_member_name
from edgeopt.device.signature import SIGNATURE
from edgeopt.errors import BadInputError
from edgeopt.file_digest import sha256_file

COMPRESS_LEVEL = 9


def file_entry(source: bytes | Path) -> dict:
    """Size and sha256 of a file's content (bytes, or a file read in chunks)."""
    if isinstance(source, bytes):
        return {"bytes": len(source), "sha256": hashlib.sha256(source).hexdigest()}
    return {"bytes": Path(source).stat().st_size, "sha256": sha256_file(Path(source))}


def write_bundle(out: str | Path, manifest: dict, files: dict[str, bytes | Path],
                 sign: Callable[[bytes], bytes] | None = None) -> Path:
    """Write ``files`` (archive name -> bytes, or a file to copy) and ``manifest`` (its ``files`` key is
    filled in here) as a bundle at ``out``; returns ``out``. ``sign`` turns the manifest's bytes into the
    ``signature.json`` stored after it (``edgeopt.signing.Signer``)."""
    for name in files:
        check_member_name(name, "bundle")
        if name in (MANIFEST, SIGNATURE):
            raise BadInputError(f"bundle: '{name}' is written by the packager, not given as a file")
    entries = {name: file_entry(source) for name, source in sorted(files.items())}
    manifest = manifest | {"files": entries}
    check_manifest(manifest, f"bundle {MANIFEST}")
    out = Path(out)
    with atomic_file(out, "wb") as handle:
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, compresslevel=COMPRESS_LEVEL, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                text = canonical_json(manifest)
                tar.addfile(_info(MANIFEST, len(text)), io.BytesIO(text))
                if sign is not None:
                    signature = sign(text)
                    tar.addfile(_info(SIGNATURE, len(signature)), io.BytesIO(signature))
                for name, entry in entries.items():
                    source = files[name]
                    with (io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")) as data:
                        tar.addfile(_info(name, entry["bytes"]), data)
    return out


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, 0o644, 0, tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
