"""Read and check a device bundle (``.tar.gz``): manifest schema, sha256 of every file, safe extraction.

Format (written by ``edgeopt.bundle_writer``): a gzip-compressed ustar archive of regular files only, the first
entry ``manifest.json``; the manifest lists every other file with its size and sha256. The reader refuses
absolute paths, ``..``, links, devices, duplicate names and files the manifest does not list, and checks
the gzip trailer, so a truncated or tampered bundle fails with one clear message.

Lean module: standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import BadInputError, first_line

SCHEMA = "edgeopt-bundle/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 4 << 20
_CHUNK = 1 << 20

# Manifest schema as data: key -> expected type(s), or a nested dict for an object. Every key is required;
# ``None`` in a type tuple allows JSON null. Unknown keys are errors.
_TENSOR = {"name": (str,), "shape": (list,), "dtype": (str,)}
_MODEL = {"path": (str,), "format": (str,), "runtime": (str,), "precision": (str, None), "files": (list,),
          "inputs": [_TENSOR], "outputs": [_TENSOR]}
MANIFEST_SCHEMA: dict = {
    "schema": (str,),
    "edgeopt_version": (str,),
    "build_id": (str, None),
    "target": {"name": (str,), "description": (str,), "device": (dict,), "runtime": (dict,), "budgets": (dict,),
               "input_shapes": (dict,)},
    "runtime": {"name": (str,), "version": (str,)},
    "model": (str,),
    "models": [_MODEL],
    "recipe": (str, None),
    "preprocessing": (dict, None),
    "quality": (dict, None),
    "validation": {"passed": (bool,), "measured": (dict,), "checks": (list,), "measured_with": (str,),
                   "emulated": (bool,), "report": (str,)},
    "files": (dict,),
}


@dataclass(frozen=True)
class Bundle:
    """A checked bundle: its manifest and, when extracted, the folder holding its files."""

    path: Path
    manifest: dict
    sha256: str  # of the whole .tar.gz
    root: Path | None = None

    @property
    def model_path(self) -> Path:
        if self.root is None:
            raise BadInputError(f"{self.path}: bundle was checked but not extracted")
        return self.root / self.manifest["model"]


def canonical_json(data) -> bytes:
    """Sorted keys, fixed indentation, ASCII, trailing newline: equal data gives equal bytes."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def check_manifest(manifest, source: str = MANIFEST) -> None:
    """Raise ``BadInputError`` naming the first key that does not fit ``MANIFEST_SCHEMA`` or the file list."""
    _check(manifest, MANIFEST_SCHEMA, source)
    if manifest["schema"] != SCHEMA:
        raise BadInputError(f"{source}: schema '{manifest['schema']}' is not supported (expected '{SCHEMA}')")
    files = manifest["files"]
    for name, entry in files.items():
        check_member_name(name, source)
        if name == MANIFEST:
            raise BadInputError(f"{source}: files: must not list {MANIFEST} itself")
        _check(entry, {"bytes": (int,), "sha256": (str,)}, source, f"files.{name}")
        if entry["bytes"] < 0 or len(entry["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in entry["sha256"]):
            raise BadInputError(f"{source}: files.{name}: needs bytes >= 0 and a 64-digit lowercase hex sha256")
    for i, model in enumerate(manifest["models"]):
        for name in (model["path"], *model["files"]):
            if name not in files:
                raise BadInputError(f"{source}: models[{i}] names '{name}', which files does not list")
    if manifest["model"] not in [m["path"] for m in manifest["models"]]:
        raise BadInputError(f"{source}: model '{manifest['model']}' is not one of models[].path")
    if manifest["validation"]["report"] not in files:
        raise BadInputError(f"{source}: validation.report '{manifest['validation']['report']}' is not in files")


def check_member_name(name: str, source: str) -> None:
    """Refuse names that could escape the extraction folder or are not in canonical form."""
    if (not name or name.startswith("/") or "\\" in name or "\0" in name or posixpath.normpath(name) != name
            or any(part in ("", ".", "..") for part in name.split("/")) or ":" in name.split("/")[0]):
        raise BadInputError(f"{source}: unsafe path '{name}' (absolute, '..', or not canonical); refused")


def open_bundle(path: str | Path, extract_to: str | Path | None = None) -> Bundle:
    """Check ``path`` completely (gzip integrity, entry types and names, manifest schema, sizes and sha256 of
    every file); with ``extract_to`` (an empty or missing folder), also write the files there (on failure it
    may hold some of them: extract into a temporary folder)."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such bundle")
    root = Path(extract_to) if extract_to is not None else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise BadInputError(f"{root}: extraction folder is not empty")
    outer = hashlib.sha256()
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read ({first_line(exc)})") from exc
    try:
        with raw, gzip.GzipFile(fileobj=_Hashing(raw, outer), mode="rb") as gz:
            manifest = _read_members(path, gz, root)
            while gz.read(_CHUNK):  # read to the gzip trailer: checks its CRC and length
                pass
    except BadInputError:
        raise
    except (EOFError, tarfile.TarError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise BadInputError(f"{path}: truncated or corrupt bundle ({first_line(exc)})") from exc
    return Bundle(path, manifest, outer.hexdigest(), root)


def _read_members(path: Path, gz, root: Path | None) -> dict:
    manifest, seen = None, set()
    with tarfile.open(fileobj=gz, mode="r|") as tar:
        for member in tar:
            name = member.name
            check_member_name(name, str(path))
            if name in seen:
                raise BadInputError(f"{path}: '{name}' appears twice in the archive; refused")
            seen.add(name)
            if member.isdir():
                continue
            if not member.isreg():
                kind = "link" if member.issym() or member.islnk() else "special file"
                raise BadInputError(f"{path}: '{name}' is a {kind}; bundles hold regular files only, refused")
            if manifest is None:
                manifest = _first_member(path, tar, member)
                continue
            entry = manifest["files"].get(name)
            if entry is None:
                raise BadInputError(f"{path}: '{name}' is not listed in {MANIFEST}; refused")
            if member.size != entry["bytes"]:
                raise BadInputError(f"{path}: '{name}' has {member.size} bytes, the manifest says {entry['bytes']} "
                                    f"(tampered)")
            digest = _copy(tar.extractfile(member), root / name if root else None)
            if digest != entry["sha256"]:
                raise BadInputError(f"{path}: '{name}' fails its sha256 check (tampered or corrupt)")
    if manifest is None:
        raise BadInputError(f"{path}: empty archive, no {MANIFEST}")
    missing = sorted(set(manifest["files"]) - seen)
    if missing:
        raise BadInputError(f"{path}: missing file(s) listed in the manifest: {', '.join(missing)}")
    return manifest


def _first_member(path: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict:
    if member.name != MANIFEST:
        raise BadInputError(f"{path}: the first entry must be {MANIFEST}, found '{member.name}'")
    if member.size > MAX_MANIFEST_BYTES:
        raise BadInputError(f"{path}: {MANIFEST} is {member.size} bytes (limit {MAX_MANIFEST_BYTES}); refused")
    try:
        manifest = json.loads(tar.extractfile(member).read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path}: {MANIFEST} is not valid JSON ({first_line(exc)})") from exc
    check_manifest(manifest, f"{path}: {MANIFEST}")
    return manifest


def _copy(source, target: Path | None) -> str:
    """sha256 of ``source``'s content, written to ``target`` as it is read (when given)."""
    digest = hashlib.sha256()
    sink = _Sink(target) if target is not None else None
    try:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            digest.update(chunk)
            if sink is not None:
                sink.write(chunk)
    finally:
        if sink is not None:
            sink.close()
    return digest.hexdigest()


class _Sink:
    """An extracted file: created exclusively (never follows or overwrites anything); write errors (a full
    disk, say) are reported as such, not as a corrupt bundle."""

    def __init__(self, target: Path):
        self._target = target
        self._do(lambda: target.parent.mkdir(parents=True, exist_ok=True))
        self._handle = self._do(lambda: open(target, "xb"))

    def write(self, chunk: bytes) -> None:
        self._do(lambda: self._handle.write(chunk))

    def close(self) -> None:
        self._do(self._handle.close)

    def _do(self, action):
        try:
            return action()
        except OSError as exc:
            raise BadInputError(f"{self._target}: cannot extract ({first_line(exc)})") from exc


def _check(value, schema, source: str, key: str = "") -> None:
    where = f"{source}: {key}" if key else source
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise BadInputError(f"{where}: expected an object, got {type(value).__name__}")
        unknown = sorted(set(value) - set(schema))
        if unknown:
            raise BadInputError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for name, inner in schema.items():
            if name not in value:
                raise BadInputError(f"{where}: missing key '{name}'")
            _check(value[name], inner, source, f"{key}.{name}" if key else name)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise BadInputError(f"{where}: expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            _check(item, schema[0], source, f"{key}[{i}]")
    else:
        allowed = tuple(type(None) if t is None else t for t in schema)
        if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
            names = " or ".join("null" if t is None else t.__name__ for t in schema)
            raise BadInputError(f"{where}: expected {names}, got {json.dumps(value)[:60]}")


class _Hashing:
    """A read-only file wrapper that hashes every byte read (the whole archive's sha256 in the same pass)."""

    def __init__(self, raw, digest):
        self._raw, self._digest = raw, digest

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._digest.update(data)
        return data


def describe(bundle: Bundle) -> dict:
    """What ``verify`` reports about a checked bundle."""
    manifest = bundle.manifest
    return {"bundle": str(bundle.path), "ok": True, "bytes": bundle.path.stat().st_size, "sha256": bundle.sha256,
            "files": len(manifest["files"]) + 1, "target": manifest["target"]["name"], "model": manifest["model"],
            "runtime": manifest["runtime"], "build_id": manifest["build_id"], "manifest": manifest}


def summary(bundle: Bundle) -> str:
    """One line saying the bundle checked out, and what it holds."""
    manifest = bundle.manifest
    build = f", build {manifest['build_id']}" if manifest["build_id"] else ""
    return (f"{bundle.path}: OK ({len(manifest['files']) + 1} files, sha256 {bundle.sha256}): {manifest['model']} for "
            f"{manifest['target']['name']} on {manifest['runtime']['name']} {manifest['runtime']['version']}{build}")
