"""Content-addressed cache of built candidates and their measurements.

A candidate's key hashes the bytes of the model, calibration and evaluation files, the recipe, the seed, the
input shapes and the versions of the tools that build it (edgeopt's by a digest of its code); a measurement's
key adds how it was measured. Entries are written atomically, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from edgeopt import atomic
from edgeopt.device.formats import file_format, model_suffixes
from edgeopt.errors import BadInputError
from edgeopt.user_code import is_function_spec

def default_cache_dir() -> Path:
    """``$EDGEOPT_CACHE``, else ``$XDG_CACHE_HOME/edgeopt``, else ``~/.cache/edgeopt``."""
    if os.environ.get("EDGEOPT_CACHE"):
        return Path(os.environ["EDGEOPT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgeopt"


def digest(value) -> str:
    """A short, stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:24]


def files_digest(spec: str | os.PathLike) -> str:
    """Hash of the bytes behind a model or data spec: a file (an IR with its .bin), a folder (every file in
    it), or ``file.py:name`` (every file beside the script: weights often live there)."""
    text = str(spec)
    path = Path(text.rpartition(":")[0] if is_function_spec(text) else text)
    if not path.exists():
        raise BadInputError(f"{path}: no such file or folder")
    if path.suffix == ".py":
        files = [p for p in path.parent.iterdir() if p.is_file() and not p.name.startswith(".")]
    elif path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    else:
        files = list(file_format(path).files(path)) if path.suffix.lower() in model_suffixes() else [path]
    sha = hashlib.sha256()
    for file in sorted(f for f in files if f.is_file()):
        sha.update(str(file.relative_to(path.parent if path.is_file() else path)).encode())
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
    return sha.hexdigest()



class Cache:
    """``root/<key>/``: a candidate's artifacts and ``report.json``; ``root/<key>/measure-<key>.json``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / key

    def has_entry(self, key: str) -> bool:
        return (self.entry(key) / "report.json").is_file()

    def load_measurement(self, key: str, measure_key: str) -> dict | None:
        path = self.entry(key) / f"measure-{measure_key}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def store_measurement(self, key: str, measure_key: str, data: dict) -> None:
        atomic.write_text(self.entry(key) / f"measure-{measure_key}.json", json.dumps(data))
