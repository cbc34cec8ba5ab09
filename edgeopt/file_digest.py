"""The sha256 of a file's bytes: the one digest that manifests, cache checksums and device results compare."""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgeopt.errors import BadInputError, first_line


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of ``path``'s bytes, read in 1 MiB chunks; an unreadable file is a one-line error."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read ({first_line(exc)})") from exc
    return digest.hexdigest()
