"""Versions of the tools that shape an artifact or a measurement, for reports and cache keys."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

TOOLS = ("edgeopt", "nncf", "openvino", "torch", "onnx", "onnxruntime", "torch-pruning")


def tool_versions() -> dict[str, str]:
    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["edgeopt-source"] = source_digest()
    return versions


@cache
def source_digest() -> str:
    """Digest of edgeopt's own code and data files: a development build keeps its version number while the code
    that builds and measures changes, so caches and reports need more than the version."""
    return tree_digest(Path(__file__).resolve().parent)


def tree_digest(root: Path) -> str:
    """16 hex digits over the relative paths and bytes of the .py and .toml files under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".toml") and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
