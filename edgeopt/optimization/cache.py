"""Content-addressed cache of built candidates and their measurements.

A candidate's key hashes the bytes of the model, calibration and evaluation files, the recipe, the seed, the
input shapes and the versions of the tools that build it (edgeopt's by a digest of its code); a measurement's
key adds how it was measured. Entries are written atomically (a temporary name, then a rename), so an
interrupted run or a concurrent writer leaves nothing half-written.

Every entry carries the sha256 of its files (``checksums.json``; each measurement file holds the sha256 of its
own payload), verified whenever the entry is reused: a damaged entry (truncated or flipped bytes, invalid
JSON, missing files) is dropped with a one-line warning and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from edgeopt import atomic, jsonio
from edgeopt.device.formats import file_format, model_suffixes
from edgeopt.errors import BadInputError, first_line
from edgeopt.file_digest import sha256_file
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
    """``root/<key>/``: a candidate's artifacts, ``report.json`` and ``checksums.json``;
    ``root/<key>/measure-<key>.json``. ``warn`` hears one line per damaged entry dropped."""

    def __init__(self, root: str | os.PathLike, warn: Callable[[str], None] = warnings.warn):
        self.root = Path(root)
        self.warn = warn

    def entry(self, key: str) -> Path:
        return self.root / key

    def has_entry(self, key: str) -> bool:
        """Whether a complete, undamaged entry exists; a damaged one is dropped (and reported) here."""
        entry = self.entry(key)
        if not os.path.lexists(entry):
            return False
        problem = _entry_problem(entry)
        if problem is None:
            return True
        self.warn(f"cache entry {entry} is damaged ({problem}); dropped, rebuilding it")
        shutil.rmtree(entry, ignore_errors=True)
        return False

    def seal(self, key: str) -> None:
        """Record the sha256 of every file of a freshly built entry (``checksums.json``)."""
        entry = self.entry(key)
        sums = {p.name: sha256_file(p) for p in sorted(entry.iterdir())
                if p.is_file() and p.name != CHECKSUMS and not p.name.startswith(("measure-", "."))}
        atomic.write_text(entry / CHECKSUMS, jsonio.dumps(sums, indent=2, sort_keys=True))

    def load_measurement(self, key: str, measure_key: str) -> dict | None:
        path = self.entry(key) / f"measure-{measure_key}.json"
        if not path.is_file():
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            data = stored["data"]
            if stored["sha256"] != _payload_sha(data):
                raise ValueError("sha256 mismatch")
            return data
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            self.warn(f"cached measurement {path} is damaged ({first_line(exc, 80)}); dropped, measuring again")
            path.unlink(missing_ok=True)
            return None

    def store_measurement(self, key: str, measure_key: str, data: dict) -> None:
        data = jsonio.finite(data)
        atomic.write_text(self.entry(key) / f"measure-{measure_key}.json",
                          jsonio.dumps({"sha256": _payload_sha(data), "data": data}))


CHECKSUMS = "checksums.json"


def _payload_sha(data) -> str:
    return hashlib.sha256(jsonio.dumps(data, sort_keys=True).encode()).hexdigest()


def _entry_problem(entry: Path) -> str | None:
    """Why ``entry`` cannot be trusted, or ``None`` when every file it lists has its recorded sha256."""
    try:
        sums = json.loads((entry / CHECKSUMS).read_text(encoding="utf-8"))
        report = json.loads((entry / "report.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        return f"{Path(exc.filename).name} is missing"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"unreadable JSON: {first_line(exc, 80)}"
    if not isinstance(sums, dict) or not isinstance(report, dict) or "report.json" not in sums:
        return "no checksums for its files"
    needed = {name for artifact in report.get("artifacts", []) for name in artifact.get("files", {})}
    if needed - set(sums):
        return f"no checksum for {', '.join(sorted(needed - set(sums)))}"
    for name, expected in sums.items():
        path = entry / name
        if not path.is_file():
            return f"{name} is missing"
        if sha256_file(path) != expected:
            return f"{name} fails its sha256 check"
    return None
