"""Save the compressed model as OpenVINO IR and/or ONNX, and describe what was written."""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import BadInputError, first_line
from edgeopt.passes import WorkingModel

FORMATS = ("openvino", "onnx")


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
        return "openvino" if self.format == "openvino" else "onnxruntime"

    def describe(self, relative_to: Path | None = None) -> dict:
        def rel(p: Path) -> str:
            return str(p.relative_to(relative_to)) if relative_to else str(p)

        return {"format": self.format, "path": rel(self.path), "precision": self.precision, "bytes": self.bytes,
                "files": {rel(f): {"bytes": f.stat().st_size, "sha256": sha256(f)} for f in self.files}}

    def moved_to(self, folder: Path) -> "Artifact":
        """The same artifact once its folder has been renamed to ``folder``."""
        return Artifact(self.format, folder / self.path.name, tuple(folder / f.name for f in self.files), self.precision)


def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise BadInputError(f"--format: unknown format(s) {', '.join(unknown) or '(none)'} (use openvino, onnx)")
    return formats


def save_artifacts(model: WorkingModel, folder: Path, formats: tuple[str, ...], stem: str = "model") -> list[Artifact]:
    """Write the working model into ``folder`` (a temporary folder the caller renames atomically)."""
    import onnx

    artifacts = []
    if "openvino" in formats:
        xml = folder / f"{stem}.xml"
        canonicalize_names(model.ov_model)
        write_ir(model.ov_model, xml, compress_to_fp16=model.precision != "fp32")
        artifacts.append(Artifact("openvino", xml, (xml, xml.with_suffix(".bin")), model.precision))
    if "onnx" in formats:
        path = folder / f"{stem}.onnx"
        onnx.save(model.onnx_model, str(path))
        artifacts.append(Artifact("onnx", path, (path,), model.precision))
    return artifacts


def write_ir(ov_model, xml: Path, compress_to_fp16: bool) -> int:
    """Save ``ov_model`` as IR at ``xml`` (and its ``.bin``); return the bytes both take on disk."""
    import openvino as ov

    try:
        ov.save_model(ov_model, str(xml), compress_to_fp16=compress_to_fp16)
    except RuntimeError as exc:  # OpenVINO reports a failed write as a C++ stream error
        raise _write_failure(xml, exc) from exc
    return xml.stat().st_size + xml.with_suffix(".bin").stat().st_size


def canonicalize_names(ov_model) -> None:
    """Renumber OpenVINO's auto-generated names (``Constant_26008``, also inside derived names such as
    ``Multiply_47514/fq_weights_1``) in graph order.

    Those numbers come from a process-wide counter, so without this the same model converted twice in one
    process would be saved with different names; with it, the IR is byte-identical run to run. A number is
    replaced the same way wherever it appears, so derived names stay recognisable.
    """
    ov_model.set_friendly_name("model")
    renumbered: dict[str, str] = {}

    def replace(match: re.Match) -> str:
        return renumbered.setdefault(match.group(0), f"{match.group(1)}_{len(renumbered)}")

    for op in ov_model.get_ordered_ops():
        op.set_friendly_name(_AUTO_NAME.sub(replace, op.get_friendly_name()))


_AUTO_NAME = re.compile(r"(?<![\w.:])([A-Za-z][A-Za-z0-9]*)_\d+(?!\w)")  # Type_123, not fq_weights_1 or x.y_2


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


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


