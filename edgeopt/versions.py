"""Versions of the tools that shape an artifact or a measurement, for reports and cache keys."""

from __future__ import annotations

from importlib import metadata

TOOLS = ("edgeopt", "nncf", "openvino", "torch", "onnx", "onnxruntime", "torch-pruning")


def tool_versions() -> dict[str, str]:
    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions
