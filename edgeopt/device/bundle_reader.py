"""Read and check a device bundle (``.tar.gz``): manifest schema, sha256 of every file, safe extraction.

Format (written by ``edgeopt.bundle_writer``): a gzip-compressed ustar archive of regular files only, the first
entry ``manifest.json``, then, in a signed bundle, ``signature.json`` (see ``edgeopt.device.signature``); the
manifest lists every other file with its size and sha256. The reader refuses absolute paths, ``..``, links,
devices, duplicate names, files the manifest does not list, a declared total size over the extraction limit,
and anything after the one gzip member; it checks the gzip trailer, so a truncated or tampered bundle fails
with one clear message. Given a trust list, it checks the signature before it extracts any file.

Lean module: standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from edgeopt.device.gzip_member import SingleGzip
from edgeopt.device.signature import MAX_SIGNATURE_BYTES, SIGNATURE, PublicKey, SignatureCheck
from edgeopt.device.signature import check as check_signature
from edgeopt.errors import BadInputError, first_line

SCHEMA = "edgeopt-bundle/3"  # /3 adds the golden set, /2 provenance; /1 and /2 bundles are still read
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 4 << 20
MAX_EXTRACT_BYTES = 16 << 30  # hard ceiling on a bundle's extracted size, unless the caller gives a limit
MAX_RATIO = 100  # extracted / compressed: model weights compress ~1-4x; 100x is a decompression bomb
MIN_LIMIT_BYTES = 64 << 20  # the ratio limit never goes below this
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
    "provenance": {"source_model": (dict, None), "data": (dict,), "recipe": (list, None),
                   "tools": {"compress": (dict, None), "package": (dict,)},
                   "target": {"name": (str,), "sha256": (str,)}, "statement": (str,)},
    "golden": (dict, None),  # {"path": folder of the golden set, "samples", "metric": primary or null, "metric_file"}
}
SCHEMAS = {SCHEMA: MANIFEST_SCHEMA,
           "edgeopt-bundle/2": {k: v for k, v in MANIFEST_SCHEMA.items() if k != "golden"},
           "edgeopt-bundle/1": {k: v for k, v in MANIFEST_SCHEMA.items() if k not in ("provenance", "golden")}}


@dataclass(frozen=True)
class Bundle:
    """A checked bundle: its manifest and, when extracted, the folder holding its files."""

    path: Path
    manifest: dict
    sha256: str  # of the whole .tar.gz
    root: Path | None = None
    signature: SignatureCheck = SignatureCheck(None)

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
    version = manifest.get("schema") if isinstance(manifest, dict) else None
    if version not in SCHEMAS:
        raise BadInputError(f"{source}: schema '{version}' is not supported (expected one of {', '.join(SCHEMAS)})")
    _check(manifest, SCHEMAS[version], source)
    files = manifest["files"]
    for name, entry in files.items():
        check_member_name(name, source)
        if name in (MANIFEST, SIGNATURE):
            raise BadInputError(f"{source}: files: must not list {name}")
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
    if "provenance" in manifest and manifest["provenance"]["statement"] not in files:
        raise BadInputError(f"{source}: provenance.statement '{manifest['provenance']['statement']}' is not in files")


def check_member_name(name: str, source: str) -> None:
    """Refuse names that could escape the extraction folder or are not in canonical form."""
    if (not name or name.startswith("/") or "\\" in name or "\0" in name or posixpath.normpath(name) != name
            or any(part in ("", ".", "..") for part in name.split("/")) or ":" in name.split("/")[0]):
        raise BadInputError(f"{source}: unsafe path '{name}' (absolute, '..', or not canonical); refused")


def open_bundle(path: str | Path, extract_to: str | Path | None = None, max_bytes: int | None = None,
                trust: tuple[PublicKey, ...] | None = None) -> Bundle:
    """Check ``path`` completely (gzip integrity, nothing after the archive, entry types and names, manifest
    schema, sizes and sha256 of every file); with ``extract_to`` (an empty or missing folder), also write the
    files there (on failure it may hold some of them: extract into a temporary folder). The files' total size
    the manifest declares may not exceed ``max_bytes`` (see ``extract_limit``); no file is read past its
    declared size. With ``trust``, the bundle must be signed by one of those keys; the signature is checked
    before the manifest is parsed or any other file read."""
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
    limit = extract_limit(path, max_bytes)
    try:
        with raw:
            gz = SingleGzip(_Hashing(raw, outer), str(path))
            manifest, signature = _read_members(path, gz, root, limit, trust)
            gz.finish()  # tar padding, the gzip trailer's CRC and length, and nothing after it
    except BadInputError:
        raise
    except (EOFError, tarfile.TarError, zlib.error, OSError) as exc:
        raise BadInputError(f"{path}: truncated or corrupt bundle ({first_line(exc)})") from exc
    return Bundle(path, manifest, outer.hexdigest(), root, signature)


def extract_limit(path: Path, max_bytes: int | None = None) -> tuple[int, str]:
    """The most bytes a bundle may hold once extracted, and why: ``max_bytes`` when given (or
    ``$EDGEOPT_BUNDLE_MAX_MB``), else ``MAX_RATIO`` times the bundle's size, within ``MAX_EXTRACT_BYTES``."""
    if max_bytes is None and os.environ.get("EDGEOPT_BUNDLE_MAX_MB"):
        try:
            max_bytes = int(float(os.environ["EDGEOPT_BUNDLE_MAX_MB"]) * 1_000_000)
        except ValueError:
            raise BadInputError(f"EDGEOPT_BUNDLE_MAX_MB must be a number, got "
                                f"{os.environ['EDGEOPT_BUNDLE_MAX_MB']!r}") from None
    if max_bytes is not None:
        return max_bytes, "the limit given"
    by_ratio = max(MAX_RATIO * path.stat().st_size, MIN_LIMIT_BYTES)
    if by_ratio < MAX_EXTRACT_BYTES:
        return by_ratio, f"{MAX_RATIO}x the bundle's size, a compression ratio no model reaches"
    return MAX_EXTRACT_BYTES, "the ceiling"


def _read_members(path: Path, gz, root: Path | None, limit: tuple[int, str],
                  trust) -> tuple[dict, SignatureCheck]:
    text, manifest, signature, seen = None, None, None, set()
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
            if text is None:
                text = _manifest_bytes(path, tar, member)
                continue
            if manifest is None:  # the entry after the manifest: a signature is checked before the manifest is read
                signed = name == SIGNATURE
                signature = check_signature(text, _small(path, tar, member) if signed else None, trust, str(path))
                manifest = _parse_manifest(path, text, limit)
                if signed:
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
    if text is None:
        raise BadInputError(f"{path}: empty archive, no {MANIFEST}")
    if manifest is None:
        signature = check_signature(text, None, trust, str(path))
        manifest = _parse_manifest(path, text, limit)
    missing = sorted(set(manifest["files"]) - seen)
    if missing:
        raise BadInputError(f"{path}: missing file(s) listed in the manifest: {', '.join(missing)}")
    return manifest, signature


def _manifest_bytes(path: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    if member.name != MANIFEST:
        raise BadInputError(f"{path}: the first entry must be {MANIFEST}, found '{member.name}'")
    if member.size > MAX_MANIFEST_BYTES:
        raise BadInputError(f"{path}: {MANIFEST} is {member.size} bytes (limit {MAX_MANIFEST_BYTES}); refused")
    return tar.extractfile(member).read()


def _parse_manifest(path: Path, text: bytes, limit: tuple[int, str]) -> dict:
    try:
        manifest = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path}: {MANIFEST} is not valid JSON ({first_line(exc)})") from exc
    check_manifest(manifest, f"{path}: {MANIFEST}")
    declared = sum(entry["bytes"] for entry in manifest["files"].values())
    if declared > limit[0]:
        raise BadInputError(f"{path}: the manifest declares {declared} bytes of files, over the "
                            f"extraction limit of {limit[0]} bytes ({limit[1]}); refused "
                            f"(raise it with --max-extract-mb or $EDGEOPT_BUNDLE_MAX_MB)")
    return manifest


def _small(path: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    if member.size > MAX_SIGNATURE_BYTES:
        raise BadInputError(f"{path}: '{member.name}' is {member.size} bytes (limit {MAX_SIGNATURE_BYTES}); refused")
    return tar.extractfile(member).read()


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
            "files": _entries(bundle), "target": manifest["target"]["name"], "model": manifest["model"],
            "runtime": manifest["runtime"], "build_id": manifest["build_id"],
            "signature": bundle.signature.describe(), "manifest": manifest}


def summary(bundle: Bundle) -> str:
    """One line saying the bundle checked out, and what it holds."""
    manifest = bundle.manifest
    build = f", build {manifest['build_id']}" if manifest["build_id"] else ""
    return (f"{bundle.path}: OK ({_entries(bundle)} files, sha256 {bundle.sha256}): {manifest['model']} for "
            f"{manifest['target']['name']} on {manifest['runtime']['name']} {manifest['runtime']['version']}{build}; "
            f"{bundle.signature.summary()}")


def _entries(bundle: Bundle) -> int:
    return len(bundle.manifest["files"]) + 1 + (bundle.signature.key_id is not None)
