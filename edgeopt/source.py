"""Load the model to compress: ONNX file, OpenVINO IR, PyTorch factory, TorchScript or torch.export archive.

A model spec is a path; ``file.py:factory`` names a Python function returning ``(module, example_input)``.
Input shapes come from the model, or from ``input_shapes`` (``{"input": (1, 3, 32, 32)}``) where the model
leaves them dynamic.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.device.runtime import TensorSpec, format_shape
from edgeopt.errors import BadInputError, first_line
from edgeopt.user_code import call, is_function_spec, load_function

TORCH_ARCHIVE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".torchscript")


@dataclass
class SourceModel:
    """The original model, in whichever form it came, with static input specs."""

    kind: str  # "onnx" | "openvino" | "torch"
    path: Path
    inputs: list[TensorSpec]
    torch_module: Any = None  # torch.nn.Module (or ScriptModule) for kind == "torch"
    example_input: tuple = field(default_factory=tuple)  # torch tensors matching ``inputs``
    onnx_path: Path | None = None  # the ONNX file for kind == "onnx"

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def openvino_model(self):
        """The FP32 model as an ``openvino.Model`` with static input shapes."""
        import openvino as ov

        if self.kind == "torch":
            return to_openvino(self.torch_module, self.example_input, self.input_names)
        try:
            model = ov.Core().read_model(str(self.path)) if self.kind == "openvino" else ov.convert_model(str(self.path))
        except Exception as exc:
            raise BadInputError(f"{self.path}: OpenVINO cannot read this model ({first_line(exc)})") from exc
        model.reshape({spec.name: list(spec.shape) for spec in self.inputs})
        return model

    def onnx_model(self):
        """The FP32 model as an ``onnx.ModelProto`` with static input shapes."""
        import onnx

        if self.kind == "openvino":
            raise BadInputError(
                f"{self.path}: an OpenVINO IR cannot be converted to ONNX; give the ONNX or PyTorch model instead"
            )
        if self.kind == "torch":
            return to_onnx(self.torch_module, self.example_input, self.input_names)
        model = onnx.load(str(self.path))
        _fix_onnx_input_shapes(model, self.inputs)
        return model


def load_model(spec: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None) -> SourceModel:
    """Load ``spec`` and resolve static input specs; every failure is a one-line ``BadInputError``."""
    input_shapes = input_shapes or {}
    text = str(spec)
    path_text, _, factory = text.rpartition(":") if is_function_spec(text) else (text, "", "")
    path = Path(path_text)
    if not path.exists():
        raise BadInputError(f"{path}: no such model file")
    suffix = path.suffix.lower()
    if factory:
        return _load_torch_factory(path, factory, input_shapes)
    if suffix == ".onnx":
        return _load_onnx(path, input_shapes)
    if suffix == ".xml":
        return _load_openvino(path, input_shapes)
    if suffix in TORCH_ARCHIVE_SUFFIXES:
        return _load_torch_archive(path, input_shapes)
    if suffix == ".py":
        raise BadInputError(f"{path}: name the factory function too, as {path}:FUNCTION")
    raise BadInputError(f"{path}: unknown model format (expected .onnx, .xml, .py:factory, .pt2 or TorchScript .pt)")


def parse_input_shapes(values: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``name=1,3,32,32`` options into a dict."""
    shapes = {}
    for value in values:
        name, sep, dims = value.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name.strip()] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise BadInputError(f"--input-shape '{value}': expected NAME=D1,D2,... (e.g. input=1,3,32,32)") from None
    return shapes


def to_openvino(module, example_input: tuple, input_names: list[str]):
    """Convert a torch module (or ExportedProgram) to ``openvino.Model`` with the given input names."""
    import openvino as ov
    import torch

    try:
        with torch.no_grad():
            model = ov.convert_model(module, example_input=example_input)
    except Exception as exc:
        raise BadInputError(f"OpenVINO cannot convert the PyTorch model ({first_line(exc)})") from exc
    for port, name in zip(model.inputs, input_names):
        port.get_tensor().set_names({name})
    model.reshape({port: list(tensor.shape) for port, tensor in zip(model.inputs, example_input)})
    output_names = ["output"] if len(model.outputs) == 1 else [f"output{i}" for i in range(len(model.outputs))]
    for port, name in zip(model.outputs, output_names):
        if not port.get_names():
            port.get_tensor().set_names({name})
    return model


def to_onnx(module, example_input: tuple, input_names: list[str]):
    """Export a torch module to an ``onnx.ModelProto`` (TorchScript exporter: one self-contained file)."""
    import onnx
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "model.onnx"
        try:
            with torch.no_grad():
                if isinstance(module, torch.export.ExportedProgram):
                    torch.onnx.export(module, example_input, str(target), dynamo=True, input_names=input_names,
                                      external_data=False)
                else:
                    torch.onnx.export(module.eval(), example_input, str(target), dynamo=False,
                                      input_names=input_names, output_names=_output_names(module, example_input),
                                      opset_version=17)
        except Exception as exc:
            raise BadInputError(f"torch cannot export the model to ONNX ({first_line(exc)})") from exc
        return onnx.load(str(target))


def _output_names(module, example_input) -> list[str]:
    import torch

    with torch.no_grad():
        out = module(*example_input)
    count = len(out) if isinstance(out, (tuple, list)) else 1
    return ["output"] if count == 1 else [f"output{i}" for i in range(count)]


def _load_onnx(path: Path, input_shapes: dict) -> SourceModel:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise BadInputError(f"{path}: not a valid ONNX model ({first_line(exc)})") from exc
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        specs.append(TensorSpec(value.name, dims, dtype))
    return SourceModel("onnx", path, _resolve_shapes(path, specs, input_shapes), onnx_path=path)


def _load_openvino(path: Path, input_shapes: dict) -> SourceModel:
    import openvino as ov

    if not path.with_suffix(".bin").is_file():
        raise BadInputError(f"{path}: the weights file {path.with_suffix('.bin').name} is missing")
    try:
        model = ov.Core().read_model(str(path))
    except Exception as exc:
        raise BadInputError(f"{path}: not a valid OpenVINO IR ({first_line(exc)})") from exc
    specs = []
    for port in model.inputs:
        dims = tuple(None if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
        dtype = port.get_element_type().to_dtype().name
        specs.append(TensorSpec(port.get_any_name(), dims, dtype))
    return SourceModel("openvino", path, _resolve_shapes(path, specs, input_shapes))


def _load_torch_factory(path: Path, factory: str, input_shapes: dict) -> SourceModel:
    built = call(path, factory, load_function(path, factory, "model factory"))
    if not (isinstance(built, tuple) and len(built) == 2):
        raise BadInputError(f"{path}:{factory} must return (module, example_input)")
    module, example = built
    import torch

    if not isinstance(module, (torch.nn.Module, torch.export.ExportedProgram)):
        raise BadInputError(f"{path}:{factory} must return (module, example_input); its first item is a "
                            f"{type(module).__name__}, not a torch.nn.Module")
    return _torch_source(path, module.eval() if isinstance(module, torch.nn.Module) else module, example,
                         input_shapes)


def _load_torch_archive(path: Path, input_shapes: dict) -> SourceModel:
    import torch

    try:
        if path.suffix.lower() == ".pt2":
            program = torch.export.load(str(path))
            example = getattr(program, "example_inputs", None)
            example = example[0] if example else None
            module = program
        else:
            module = torch.jit.load(str(path), map_location="cpu").eval()
            example = None
    except Exception as exc:
        raise BadInputError(f"{path}: not a TorchScript or torch.export archive ({first_line(exc)})") from exc
    if example is None:
        if not input_shapes:
            raise BadInputError(f"{path}: give the input shapes with --input-shape NAME=D1,D2,...")
        example = tuple(torch.zeros(shape) for shape in input_shapes.values())
    return _torch_source(path, module, example, input_shapes)


def _torch_source(path: Path, module, example, input_shapes: dict) -> SourceModel:
    import torch

    example = tuple(example) if isinstance(example, (tuple, list)) else (example,)
    if not all(isinstance(t, torch.Tensor) for t in example):
        raise BadInputError(f"{path}: the example input must be a tensor or a tuple of tensors")
    names = list(input_shapes) if len(input_shapes) == len(example) else (
        ["input"] if len(example) == 1 else [f"input{i}" for i in range(len(example))]
    )
    if input_shapes and len(input_shapes) == len(example):
        example = tuple(torch.zeros(shape, dtype=t.dtype) for shape, t in zip(input_shapes.values(), example))
        _check_runs(path, module, example)
    specs = [TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in zip(names, example)]
    return SourceModel("torch", path, specs, torch_module=module, example_input=example)


def _check_runs(path: Path, module, example: tuple) -> None:
    """Run the model once on inputs of the given shapes: a shape it cannot take is the user's to fix."""
    import torch

    runnable = module.module() if isinstance(module, torch.export.ExportedProgram) else module
    try:
        with torch.no_grad():
            runnable(*example)
    except Exception as exc:
        shapes = ", ".join(format_shape(tuple(t.shape)) for t in example)
        raise BadInputError(f"{path}: the model does not run on inputs of shape {shapes} "
                            f"(check --input-shape: {first_line(exc, 160)})") from exc


def _resolve_shapes(path: Path, specs: list[TensorSpec], input_shapes: dict) -> list[TensorSpec]:
    known = {spec.name for spec in specs}
    unknown = set(input_shapes) - known
    if unknown:
        raise BadInputError(f"{path}: --input-shape names unknown input(s) {', '.join(sorted(unknown))}; "
                            f"the model's inputs are {', '.join(sorted(known))}")
    resolved = []
    for spec in specs:
        shape = input_shapes.get(spec.name, spec.shape)
        if len(shape) != len(spec.shape) or any(m is not None and m != g for m, g in zip(spec.shape, shape)):
            raise BadInputError(f"{path}: input '{spec.name}' has shape {format_shape(spec.shape)}, "
                                f"--input-shape gives {format_shape(tuple(shape))}")
        if any(d is None for d in shape):
            raise BadInputError(f"{path}: input '{spec.name}' has a dynamic shape {format_shape(spec.shape)}; "
                                f"give it with --input-shape {spec.name}=D1,D2,...")
        resolved.append(TensorSpec(spec.name, tuple(shape), spec.dtype))
    return resolved


def _fix_onnx_input_shapes(model, specs: list[TensorSpec]) -> None:
    by_name = {spec.name: spec for spec in specs}
    for value in model.graph.input:
        spec = by_name.get(value.name)
        if spec is None:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, spec.shape):
            dim.ClearField("dim_param")
            dim.dim_value = size
