"""What an output path may replace, checked before any work starts.

edgeopt replaces only what it wrote itself: a folder holding its own ``report.json``, a bundle whose first
member is ``manifest.json``, a JSON report. Anything else in the way is refused (exit 2) unless the user says
``--force``; the current folder (or one holding it) and the filesystem root are refused even then. The place
must be writable and, where the size is known, have room. Leftovers of killed runs are cleaned here.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
from pathlib import Path

from edgeopt import atomic
from edgeopt.device.formats import file_format, model_suffixes
from edgeopt.errors import BadInputError

_REPORT_KEYS = ({"recipe", "artifacts"}, {"verdict", "candidates"}, {"pairs", "events"})  # compress, optimize, fleet
MIN_FREE_BYTES = 1 << 20


def check_out_folder(out: str | os.PathLike, force: bool = False, needs_bytes: int = 0) -> Path:
    """``out`` may become an edgeopt output folder: absent, empty, or an earlier edgeopt output."""
    path = _usable(out, "--out")
    if os.path.lexists(path) and not force:
        if path.is_symlink() or not path.is_dir():
            raise BadInputError(f"--out {out}: exists and is not a folder edgeopt wrote; refusing to replace it "
                                f"(remove it, choose another --out, or pass --force)")
        if any(path.iterdir()) and not is_own_folder(path):
            raise BadInputError(f"--out {out}: folder holds files edgeopt did not write (no edgeopt report.json); "
                                f"refusing to replace it (choose another --out, or pass --force)")
    _writable(path, needs_bytes, "--out")
    return path


def check_out_file(out: str | os.PathLike, force: bool = False, needs_bytes: int = 0, option: str = "--out",
                   own=None) -> Path:
    """``out`` may become a file edgeopt writes: absent, or (``own(path)`` true) one it wrote before."""
    path = _usable(out, option)
    if os.path.lexists(path):
        if path.is_dir() and not path.is_symlink():
            raise BadInputError(f"{option} {out}: is a folder; give a file name")
        if not force and (path.is_symlink() or not path.is_file() or not (own or is_own_json)(path)):
            raise BadInputError(f"{option} {out}: exists and is not a file edgeopt wrote; refusing to overwrite it "
                                f"(remove it, choose another name, or pass --force)")
    _writable(path, needs_bytes, option)
    return path


def is_own_folder(path: Path) -> bool:
    """A folder edgeopt wrote: it holds a ``report.json`` of ``compress``, ``optimize`` or ``fleet`` (by its keys,
    or an ``edgeopt...`` schema name), or a golden set's ``golden.json``."""
    own = path / ("golden.json" if (path / "golden.json").is_file() else "report.json")
    try:
        report = json.loads(own.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(report, dict):
        return False
    schema = str(report.get("schema", report.get("schema_version", "")))
    return any(keys <= set(report) for keys in _REPORT_KEYS) or schema.startswith("edgeopt")


def is_own_json(path: Path) -> bool:
    """A JSON object or array (a report edgeopt writes with --json)."""
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), (dict, list))
    except (OSError, UnicodeDecodeError, ValueError):
        return False


def is_own_report(path: Path) -> bool:
    """A JSON report, or an XML (JUnit) report: what ``--json`` / ``--junit`` write."""
    if is_own_json(path):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(5) == b"<?xml"
    except OSError:
        return False


def is_own_bundle(path: Path) -> bool:
    """A gzip-compressed tar whose first member is ``manifest.json``: a bundle edgeopt wrote."""
    try:
        with gzip.open(path, "rb") as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
            first = tar.next()
            return first is not None and first.name == "manifest.json"
    except (OSError, EOFError, tarfile.TarError, gzip.BadGzipFile, ValueError):
        return False


def _usable(out: str | os.PathLike, option: str) -> Path:
    text = str(out)
    if not text.strip():
        raise BadInputError(f"{option}: empty path")
    path = Path(os.path.abspath(text))
    here = Path.cwd().resolve()
    resolved = path.resolve()
    if resolved == Path(resolved.anchor) or resolved == here or resolved in here.parents:
        raise BadInputError(f"{option} {out}: is the current folder, one holding it, or the root; edgeopt never "
                            f"replaces those (give a new sub-folder)")
    atomic.clean_stale(path)
    return path


def _writable(path: Path, needs_bytes: int, option: str) -> None:
    parent = path.parent
    while not parent.exists():
        if os.path.lexists(parent):  # a dangling link
            break
        parent = parent.parent
    if not parent.is_dir():
        raise BadInputError(f"cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInputError(f"cannot write {path}: {parent} is not writable")
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        return
    if free < max(needs_bytes, MIN_FREE_BYTES):
        raise BadInputError(f"cannot write {path}: {free} bytes free on its file system, about "
                            f"{max(needs_bytes, MIN_FREE_BYTES)} needed ({option})")


def input_bytes(*specs) -> int:
    """Bytes on disk of model/data specs (``file.py:fn`` counts its file): a rough size of the outputs."""
    total = 0
    for spec in specs:
        if not spec:
            continue
        text = str(spec)
        head, sep, tail = text.rpartition(":")
        path = Path(head if sep and head.endswith(".py") else text)
        candidates = file_format(path).files(path) if path.suffix.lower() in model_suffixes() else [path]
        total += sum(p.stat().st_size for p in candidates if p.is_file())  # an ONNX model's external data too
    return total
