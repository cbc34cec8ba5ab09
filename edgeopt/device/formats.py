"""Model file formats as the device sees them: suffix, companion files, the runtime that loads them natively.

Lean (standard library only), so the on-device validator can use it; ``edgeopt.formats`` adds how each format
is converted, written and counted on the build host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeopt.device.onnx_files import external_data_files
from edgeopt.errors import BadInputError


@dataclass(frozen=True)
class FileFormat:
    name: str  # as in --format and report.json
    label: str  # for people
    suffix: str  # of the main file
    companions: tuple[str, ...]  # suffixes of files that must sit beside the main file (same stem)
    runtime: str  # the runtime that loads it natively (edgeopt.device.runtime.SESSIONS)
    named_inside: Callable[[Path], tuple[str, ...]] | None = None  # files the main file names, relative to it

    def files(self, main: str | Path) -> tuple[Path, ...]:
        """The main file, its companions and the files it names (an ONNX model's external data), where it
        exists."""
        main = Path(main)
        named = self.named_inside(main) if self.named_inside is not None and main.is_file() else ()
        return (main, *(main.with_suffix(suffix) for suffix in self.companions), *(main.parent / n for n in named))


FILE_FORMATS: dict[str, FileFormat] = {
    "openvino": FileFormat("openvino", "OpenVINO IR", ".xml", (".bin",), "openvino"),
    "onnx": FileFormat("onnx", "ONNX", ".onnx", (), "onnxruntime", external_data_files),
}


def file_format(path: str | Path) -> FileFormat:
    """The format of a model file, from its suffix."""
    suffix = Path(path).suffix.lower()
    for fmt in FILE_FORMATS.values():
        if fmt.suffix == suffix:
            return fmt
    expected = " or ".join(f.suffix for f in FILE_FORMATS.values())
    raise BadInputError(f"{path}: not a model file (expected {expected})")


def format_for_runtime(runtime: str) -> FileFormat:
    """The format a device whose runtime is ``runtime`` is given (its native one)."""
    for fmt in FILE_FORMATS.values():
        if fmt.runtime == runtime:
            return fmt
    raise BadInputError(f"no model format is native to runtime '{runtime}'")


def model_suffixes() -> tuple[str, ...]:
    return tuple(f.suffix for f in FILE_FORMATS.values())
