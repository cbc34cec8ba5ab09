"""Save the compressed model in each format asked for (``edgeopt.formats``), and describe what was written."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import first_line
from edgeopt.file_digest import sha256_file
from edgeopt.formats import FORMATS
from edgeopt.passes.base import WorkingModel


@dataclass(frozen=True)
class Artifact:
    """One saved model: its format, main file (``.xml`` or ``.onnx``), every file it needs, size on disk."""

    format: str
    path: Path
    files: tuple[Path, ...]
    precision: str

    @property
    def bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    @property
    def runtime(self) -> str:
        return FORMATS[self.format].runtime

    def describe(self, relative_to: Path | None = None) -> dict:
        def rel(p: Path) -> str:
            return str(p.relative_to(relative_to)) if relative_to else str(p)

        return {"format": self.format, "path": rel(self.path), "precision": self.precision, "bytes": self.bytes,
                "files": {rel(f): {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in self.files}}

    def moved_to(self, folder: Path) -> "Artifact":
        """The same artifact once its folder has been renamed to ``folder``."""
        return Artifact(self.format, folder / self.path.name, tuple(folder / f.name for f in self.files), self.precision)


def save_artifacts(model: WorkingModel, folder: Path, formats: tuple[str, ...], stem: str = "model") -> list[Artifact]:
    """Write the working model's graph of each format into ``folder`` (a temporary folder the caller renames
    atomically)."""
    artifacts = []
    for name in formats:
        fmt = FORMATS[name]
        main = fmt.main_file(folder, stem)
        fmt.canonicalize(model.graphs[name])
        _write(fmt, model.graphs[name], main, model.float_weights_fp16)
        artifacts.append(Artifact(name, main, fmt.files(main), model.precision))
    return artifacts


def saved_bytes(graph, name: str, float_weights_fp16: bool) -> int:
    """Bytes ``graph`` takes on disk when saved in format ``name`` (every file)."""
    import tempfile

    fmt = FORMATS[name]
    with tempfile.TemporaryDirectory() as tmp:
        main = fmt.main_file(Path(tmp))
        _write(fmt, graph, main, float_weights_fp16)
        return sum(f.stat().st_size for f in fmt.files(main))


def _write(fmt, graph, main: Path, float_weights_fp16: bool) -> None:
    try:
        fmt.write(graph, main, float_weights_fp16)
    except RuntimeError as exc:  # OpenVINO reports a failed write as a C++ stream error
        raise _write_failure(main, exc) from exc


def write_ir(ov_model, xml: Path, compress_to_fp16: bool) -> int:
    """Save ``ov_model`` as IR at ``xml`` (and its ``.bin``); return the bytes both take on disk."""
    _write(FORMATS["openvino"], ov_model, xml, compress_to_fp16)
    return xml.stat().st_size + xml.with_suffix(".bin").stat().st_size


def _write_failure(path: Path, exc: Exception) -> Exception:
    """A ``WriteError`` when saving failed for lack of room or a stream error, else ``exc`` itself."""
    from edgeopt.atomic import WriteError

    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if free is not None and free < (1 << 20):
        return WriteError(path.parent, "No space left on device")
    if "ios" in str(exc) or "stream" in str(exc).lower():
        return WriteError(path.parent, f"the runtime could not write the model ({first_line(exc, 120)})")
    return exc


