"""The registry of model formats edgeopt writes (NNCF-style backend dispatch): for each, its file facts
(``edgeopt.device.formats``: suffix, companion files, native runtime), the session class that runs it, how a
model is converted to it, how it is written, and how its weights are counted.

Adding a format is one ``Format`` entry here (plus its ``FileFormat`` in ``device/formats.py``); adding a
runtime is one ``Session`` subclass in ``device/runtime.py``. See docs/architecture.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeopt.device.formats import FILE_FORMATS, FileFormat, file_format
from edgeopt.errors import BadInputError


@dataclass(frozen=True)
class Format:
    file: FileFormat
    from_torch: Callable[..., Any]  # (module, example input, input names, output names, dynamic axes) -> graph
    from_source: Callable[[Any], Any]  # (edgeopt.source.SourceModel of an ONNX / IR file) -> graph
    write: Callable[[Any, Path, bool], None]  # (graph, main file, float weights as FP16)
    count_weights: Callable[[Any], Any]  # graph -> edgeopt.weight_bytes.WeightBytes
    read: Callable[[Path], Any]  # main file -> graph
    canonicalize: Callable[[Any], None] = lambda graph: None  # make saved bytes the same run to run

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def label(self) -> str:
        return self.file.label

    @property
    def runtime(self) -> str:
        return self.file.runtime

    @property
    def session_class(self):
        from edgeopt.device.runtime import SESSIONS

        return SESSIONS[self.runtime]

    def main_file(self, folder: Path, stem: str = "model") -> Path:
        return folder / f"{stem}{self.file.suffix}"

    def files(self, main: Path) -> tuple[Path, ...]:
        return self.file.files(main)

    def weight_bytes(self, main: Path):
        """Weight bytes of a saved model of this format."""
        return self.count_weights(self.read(main))


# --- OpenVINO IR


def _ov_from_torch(module, example, names, output_names=None, dynamic=None):  # the IR keeps the example's sizes
    from edgeopt.source import to_openvino

    return to_openvino(module, example, names, output_names)


def _ov_write(graph, main: Path, fp16: bool) -> None:
    import openvino as ov

    ov.save_model(graph, str(main), compress_to_fp16=fp16)


def _ov_canonicalize(ov_model) -> None:
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


def _ov_read(main: Path):
    import openvino as ov

    return ov.Core().read_model(str(main))


def _ov_weights(graph):
    from edgeopt.weight_bytes import openvino_weight_bytes

    return openvino_weight_bytes(graph)


# --- ONNX


def _onnx_from_torch(module, example, names, output_names=None, dynamic=None):
    """Exported with the ``dynamic`` axes dynamic (its shapes computed, not held), then pinned at the example's
    sizes, as an ONNX file's inputs are (``edgeopt.dynamic_axes`` declares them again once compressed)."""
    from edgeopt.source import pin_onnx_inputs, to_onnx

    model = to_onnx(module, example, names, output_names, dynamic)
    pin_onnx_inputs(model, {name: tuple(tensor.shape) for name, tensor in zip(names, example)})
    return model


def _onnx_write(graph, main: Path, fp16: bool) -> None:  # FP16 is a graph rewrite in the fp16 pass for ONNX
    import onnx

    onnx.save(graph, str(main))


def _onnx_read(main: Path):
    import onnx

    return onnx.load(str(main))


def _onnx_weights(graph):
    from edgeopt.weight_bytes import onnx_weight_bytes

    return onnx_weight_bytes(graph)


FORMATS: dict[str, Format] = {
    "openvino": Format(FILE_FORMATS["openvino"], _ov_from_torch, lambda source: source.openvino_model(), _ov_write,
                       _ov_weights, _ov_read, _ov_canonicalize),
    "onnx": Format(FILE_FORMATS["onnx"], _onnx_from_torch, lambda source: source.onnx_model(), _onnx_write,
                   _onnx_weights, _onnx_read),
}
REFERENCE = "openvino"  # the graph every working model holds (heuristics, size baselines, step report)


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise BadInputError(f"unknown format '{name}' (known: {', '.join(FORMATS)})")
    return FORMATS[name]


def format_of(path: str | Path) -> Format:
    """The registry entry of a saved model file, from its suffix."""
    return FORMATS[file_format(path).name]


def artifact_weight_bytes(path: str | Path):
    """Weight bytes (``edgeopt.weight_bytes.WeightBytes``) of a saved model file of any registered format."""
    return format_of(path).weight_bytes(Path(path))


def parse_formats(text: str) -> tuple[str, ...]:
    """``--format openvino,onnx`` → names, checked against the registry."""
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise BadInputError(f"--format: unknown format(s) {', '.join(unknown) or '(none)'} "
                            f"(use {', '.join(FORMATS)})")
    return formats
