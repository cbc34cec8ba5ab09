"""Load the model to compress: ONNX file, OpenVINO IR, PyTorch factory, TorchScript or torch.export archive,
or a local Hugging Face model folder (``edgeopt.hf``).

A model spec is a path; ``file.py:factory`` names a Python function returning ``(module, example_input)``
(see ``edgeopt.torch_inputs`` for the forms of example input). Input shapes come from the model, or from
``input_shapes`` (``{"input": (1, 3, 32, 32)}``) where the model leaves them dynamic; a dynamic batch axis
(``edgeopt.batch_axes``) defaults to 1.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.batch_axes import check_batch_axis, model_batch_axis
from edgeopt.device.runtime import (
    TensorSpec,
    format_shape,
    one_input_alias,
    onnx_recorded_shapes,
    openvino_recorded_shapes,
)
from edgeopt.errors import BadInputError, first_line
from edgeopt.onnx_prep import describe_unsupported, quantized_ops
from edgeopt.torch_inputs import default_input_names, does_not_run, torch_call
from edgeopt.user_code import call, is_function_spec, load_function

TORCH_ARCHIVE_SUFFIXES = (".pt", ".pth", ".pt2", ".ts", ".torchscript")


@dataclass
class SourceModel:
    """The original model, in whichever form it came, with static input specs."""

    kind: str  # "onnx" | "openvino" | "torch"
    path: Path
    inputs: list[TensorSpec]
    torch_module: Any = None  # torch.nn.Module (or ScriptModule) for kind == "torch", called positionally
    example_input: tuple = field(default_factory=tuple)  # torch tensors matching ``inputs``
    onnx_path: Path | None = None  # the ONNX file for kind == "onnx"
    output_names: list[str] = field(default_factory=list)
    tokenizer: Any = None  # a Hugging Face tokenizer, for text data (Hugging Face model folders)
    folder: Path | None = None  # the Hugging Face model folder it came from (its config and tokenizer go beside)
    sized_by_data: list[str] = field(default_factory=list)  # dynamic dims the calibration data sized (``x[3] = 160``)
    model_type: str | None = None  # "transformer" when the source says so (a ``transformers`` model)
    quantized_ops: dict[str, int] = field(default_factory=dict)  # an ONNX file's (edgeopt.onnx_prep.quantized_ops)
    declared_inputs: list[TensorSpec] = field(default_factory=list)  # None where dynamic: an ONNX/IR file's, a HF
    # folder's (batch and length); a PyTorch factory's batch where its example is one batch-1 sample
    export_static: bool = False  # converted at the example's sizes all the same (a factory's batch: declared for
    # the check of other sizes only, since an export with it dynamic quantizes differently: MiniLM's ONNX 0.988
    # against 0.993)

    def dynamic_axes(self) -> dict[str, list[int]]:
        """Input name -> the axes the file declares dynamic and ``inputs`` fixes."""
        return dynamic_dims(self.declared_inputs, self.input_names)

    def export_axes(self) -> dict[str, list[int]]:
        """The axes a PyTorch model is exported with dynamic for compression (``dynamic_axes`` unless
        ``export_static``)."""
        return {} if self.export_static else self.dynamic_axes()

    def fixed_dims(self) -> list[str]:
        """The input dimensions the file declares dynamic and ``inputs`` fixes (``x[0] = 1``): what the
        artifacts, converted at those shapes, run at."""
        fixed = {spec.name: spec.shape for spec in self.inputs}
        return [fixed_dim(name, axis, fixed[name][axis]) for name, axes in self.dynamic_axes().items()
                for axis in axes]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def openvino_model(self):
        """The FP32 model as an ``openvino.Model`` with static input shapes."""
        import openvino as ov

        if self.kind == "torch":
            return to_openvino(self.torch_module, self.example_input, self.input_names, self.output_names)
        shapes = {spec.name: list(spec.shape) for spec in self.inputs}
        try:  # static shapes at conversion: some exports only convert once every rank is known
            model = (ov.Core().read_model(str(self.path)) if self.kind == "openvino"
                     else ov.convert_model(str(self.path), input=shapes))
        except Exception as exc:
            model = self._rewritten_for_openvino(shapes) if self.kind == "onnx" else None
            if model is None:
                reason = (describe_unsupported(self.path) if self.kind == "onnx" else None) or first_line(exc)
                sized = (f" at the sizes the calibration data gives ({', '.join(self.sized_by_data)}): is it this "
                         f"model's data?" if self.sized_by_data else "")
                raise BadInputError(f"{self.path}: OpenVINO cannot read this model ({reason}){sized}") from exc
        model.reshape(shapes)
        return model

    def _rewritten_for_openvino(self, shapes: dict[str, list[int]]):
        """The ONNX model with the ops OpenVINO's frontend rejects rewritten into equivalents
        (``onnx_prep.for_openvino``), converted; None when there was nothing to rewrite or it still fails."""
        import tempfile

        import onnx
        import openvino as ov

        from edgeopt.onnx_prep import for_openvino

        rewritten = for_openvino(self.path, shapes)
        if rewritten is None:
            return None
        with tempfile.TemporaryDirectory(prefix="edgeopt-ov-") as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save(rewritten, str(path))
            try:
                return ov.convert_model(str(path), input=shapes)
            except Exception:
                return None

    def onnx_model(self):
        """The FP32 model as an ``onnx.ModelProto`` with static input shapes."""
        import onnx

        if self.kind == "openvino":
            raise BadInputError(
                f"{self.path}: an OpenVINO IR cannot be converted to ONNX; give the ONNX or PyTorch model instead"
            )
        if self.kind == "torch":
            return to_onnx(self.torch_module, self.example_input, self.input_names, self.output_names)
        model = onnx.load(str(self.path))
        pin_onnx_inputs(model, {spec.name: spec.shape for spec in self.inputs})
        return model


def dynamic_dims(declared: list[TensorSpec], kept) -> dict[str, list[int]]:
    """Input name -> the axes ``declared`` leaves dynamic, for the inputs named in ``kept``."""
    return {spec.name: axes for spec in declared if spec.name in kept
            for axes in [[axis for axis, size in enumerate(spec.shape) if size is None]] if axes}


def dynamic_dim_name(axis: int) -> str:
    """The name a PyTorch export gives a dynamic dimension: ``batch`` on axis 0, else ``dim{axis}`` (a Hugging
    Face model's ``input_ids`` and ``attention_mask`` share their length, ``dim1``)."""
    return "batch" if axis == 0 else f"dim{axis}"


def pin_onnx_inputs(model, shapes: dict[str, tuple[int, ...]]) -> None:
    """Give the ONNX model's inputs named in ``shapes`` those static sizes (in place)."""
    for value in model.graph.input:
        if value.name not in shapes:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
            dim.ClearField("dim_param")
            dim.dim_value = size


def fixed_dim(name: str, axis: int, size: int) -> str:
    """A dynamic dimension fixed at ``size``, as notes and reports write it: ``x[0] = 1``."""
    return f"{name}[{axis}] = {size}"


def load_model(spec: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
               batch_axes: dict[str, int | None] | None = None, task: str | None = None,
               data_shapes: Callable[[list[TensorSpec]], dict] | None = None,
               shapes_from: str = "--input-shape") -> SourceModel:
    """Load ``spec`` and resolve static input specs; every failure is a one-line ``BadInputError``.

    ``batch_axes`` overrides the batch axis read off the model, by input name; ``task`` picks the head of a
    Hugging Face model folder (``edgeopt.hf.TASKS``); ``data_shapes`` sizes an ONNX or IR file's dynamic
    dimensions that neither ``input_shapes`` nor the file gives, from the calibration data (``_resolve_shapes``).
    ``shapes_from``: what gave ``input_shapes``, as errors name it (``Target.input_shapes_from``).
    """
    input_shapes, batch_axes = input_shapes or {}, batch_axes or {}
    text = str(spec)
    path_text, _, factory = text.rpartition(":") if is_function_spec(text) else (text, "", "")
    path = Path(path_text)
    if not path.exists():
        raise BadInputError(f"{path}: no such model file or folder")
    suffix = path.suffix.lower()
    if task is not None and not path.is_dir():
        raise BadInputError(f"--task applies to a Hugging Face model folder; {path} is not a folder")
    if path.is_dir():
        from edgeopt.hf import load_hf_folder

        source = load_hf_folder(path, task, input_shapes, functools.partial(torch_source, shapes_from=shapes_from),
                                lambda onnx_file, shapes: _load_onnx(onnx_file, shapes, batch_axes, data_shapes,
                                                                     shapes_from))
    elif factory:
        source = _load_torch_factory(path, factory, input_shapes, shapes_from)
    elif suffix == ".onnx":
        source = _load_onnx(path, input_shapes, batch_axes, data_shapes, shapes_from)
    elif suffix == ".xml":
        source = _load_openvino(path, input_shapes, batch_axes, data_shapes, shapes_from)
    elif suffix in TORCH_ARCHIVE_SUFFIXES:
        source = _load_torch_archive(path, input_shapes, shapes_from)
    elif suffix == ".py":
        raise BadInputError(f"{path}: name the factory function too, as {path}:FUNCTION")
    else:
        raise BadInputError(f"{path}: unknown model format (expected .onnx, .xml, .py:factory, .pt2, TorchScript .pt "
                            f"or a Hugging Face model folder)")
    if source.kind == "torch":
        source.inputs = _with_batch_axes(path, source.inputs, batch_axes)
        if not source.declared_inputs:
            source.declared_inputs, source.export_static = _batch_declared(source.inputs), True
    return source


def _batch_declared(inputs: list[TensorSpec]) -> list[TensorSpec]:
    """A PyTorch model's inputs with the batch dynamic, where its example is one batch-1 sample: some input holds
    its batch first and at 1, and every other input that has a batch axis has it at 1 too, on whatever axis (a
    recurrent state's ``[layers, B, hidden]`` on axis 1; the check against the model itself decides whether the
    artifacts keep it; ``edgeopt.dynamic_axes``); none otherwise — an example of several, whose guessed batch axis
    would be the first axis of size 1 (``[4, 1, 8, 8]``'s channels, a batch-first sequence's ``[8, 1, 16]``)."""
    batched = [spec for spec in inputs if spec.batch_dim is not None and len(spec.shape) >= 2]
    if (not any(spec.batch_dim == 0 and spec.shape[0] == 1 for spec in batched)
            or any(spec.shape[spec.batch_dim] != 1 for spec in batched)):
        return []
    return [TensorSpec(spec.name, _unsized(spec.shape, spec.batch_dim) if spec in batched else spec.shape,
                       spec.dtype, spec.batch_axis) for spec in inputs]


def _unsized(shape: tuple, axis: int) -> tuple:
    return (*shape[:axis], None, *shape[axis + 1:])


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
        if any(d < 1 for d in shapes[name.strip()]):
            raise BadInputError(f"--input-shape '{value}': every dimension must be a size of at least 1 (the size "
                                f"to calibrate and run at; a dimension the model declares dynamic stays so where "
                                f"the artifact runs at other sizes)")
    return shapes


def to_openvino(module, example_input: tuple, input_names: list[str], output_names: list[str] | None = None):
    """Convert a torch module (or ExportedProgram) to ``openvino.Model`` with the given input and output names."""
    try:
        return _to_openvino(module, example_input, input_names, output_names)
    except BadInputError:
        rewritten = _global_pools(module, example_input)
        if rewritten is None:
            raise
        return _to_openvino(rewritten, example_input, input_names, output_names)


NO_IR = ("; edgeopt converts every model to an IR, its size and quality reference, --format onnx too: export "
         "it with torch.onnx.export and compress the .onnx file")


def _to_openvino(module, example_input: tuple, input_names: list[str], output_names: list[str] | None):
    import openvino as ov
    import torch

    try:
        with torch.no_grad():
            model = ov.convert_model(module, example_input=example_input)
    except Exception as exc:
        if isinstance(module, torch.export.ExportedProgram):
            raise BadInputError(f"OpenVINO cannot convert the PyTorch model ({first_line(exc)}){NO_IR}") from exc
        try:  # code that does not survive torch.jit.trace (e.g. some transformers masks) often exports
            with torch.no_grad():
                model = ov.convert_model(torch.export.export(module, tuple(example_input), strict=False))
        except Exception:
            raise BadInputError(f"OpenVINO cannot convert the PyTorch model ({first_line(exc)}){NO_IR}") from exc
    for port, name in zip(model.inputs, input_names):
        port.get_tensor().set_names({name})
    try:
        model.reshape({port: list(tensor.shape) for port, tensor in zip(model.inputs, example_input)})
    except Exception as exc:
        raise BadInputError(f"OpenVINO cannot give the converted model static input shapes ({first_line(exc)})") \
            from exc
    given = output_names is not None and len(output_names) == len(model.outputs)
    if not given:
        output_names = ["output"] if len(model.outputs) == 1 else [f"output{i}" for i in range(len(model.outputs))]
    for port, name in zip(model.outputs, output_names):
        if given or not port.get_names():
            port.get_tensor().set_names({name})
    return model


def _global_pools(module, example_input: tuple):
    """A copy of ``module`` whose ``nn.AvgPool1d/2d/3d`` layers that cover their whole input without padding
    (``transformers``' EfficientNet pools 7x7 with ``AvgPool2d(2560, ceil_mode=True)``) are the equivalent
    ``nn.AdaptiveAvgPool*d(1)``: OpenVINO refuses a pooling kernel larger than its input. None when there is
    no such layer (found by running ``example_input`` once)."""
    import copy

    import torch
    from torch import nn

    pools = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
    if not isinstance(module, nn.Module):
        return None
    covering: list[str] = []

    def watch(name: str):
        def hook(layer, args, _output) -> None:
            spatial = tuple(args[0].shape[2:])
            def per_axis(value):
                return tuple(value) if isinstance(value, (tuple, list)) else (value,) * len(spatial)
            kernel, padding = per_axis(layer.kernel_size), per_axis(layer.padding)
            if (not any(padding) and getattr(layer, "divisor_override", None) is None
                    and all(k >= s and (k == s or layer.ceil_mode) for k, s in zip(kernel, spatial))):
                covering.append(name)
        return hook

    handles = [layer.register_forward_hook(watch(name)) for name, layer in module.named_modules()
               if isinstance(layer, pools)]
    if not handles:
        return None
    try:
        with torch.no_grad():
            module(*example_input)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if not covering:
        return None
    rewritten = copy.deepcopy(module)
    for name in dict.fromkeys(covering):
        parent_name, _, child = name.rpartition(".")
        parent = rewritten.get_submodule(parent_name)
        adaptive = {nn.AvgPool1d: nn.AdaptiveAvgPool1d, nn.AvgPool2d: nn.AdaptiveAvgPool2d,
                    nn.AvgPool3d: nn.AdaptiveAvgPool3d}[type(getattr(parent, child))]
        setattr(parent, child, adaptive(1))
    return rewritten


def to_onnx(module, example_input: tuple, input_names: list[str], output_names: list[str] | None = None,
            dynamic: dict[str, list[int]] | None = None):
    """Export a torch module to an ``onnx.ModelProto`` (TorchScript exporter: one self-contained file).

    ``dynamic`` (input name -> axes) are exported as dynamic dimensions, named alike on every input
    (``dynamic_dim_name``), so that the graph computes its shapes instead of holding the example's sizes; the
    torch.export-based exporters, tried where tracing fails, export the example's sizes."""
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
                                      input_names=input_names,
                                      output_names=output_names or _output_names(module, example_input),
                                      opset_version=17, dynamic_axes={
                                          name: {axis: dynamic_dim_name(axis) for axis in axes}
                                          for name, axes in (dynamic or {}).items()} or None)
        except Exception as exc:
            if isinstance(module, torch.export.ExportedProgram):
                raise BadInputError(f"torch cannot export the model to ONNX ({first_line(exc)})") from exc
            try:  # as in to_openvino: the torch.export-based exporter where tracing fails
                with torch.no_grad():
                    torch.onnx.export(module.eval(), tuple(example_input), str(target), dynamo=True,
                                      input_names=input_names, output_names=output_names, external_data=False)
            except Exception:
                raise BadInputError(f"torch cannot export the model to ONNX ({first_line(exc)})") from exc
        return onnx.load(str(target))


def _output_names(module, example_input) -> list[str]:
    import torch

    with torch.no_grad():
        out = module(*example_input)
    count = len(out) if isinstance(out, (tuple, list)) else 1
    return ["output"] if count == 1 else [f"output{i}" for i in range(count)]


def _load_onnx(path: Path, input_shapes: dict, batch_axes: dict, data_shapes=None,
               shapes_from: str = "--input-shape") -> SourceModel:
    import onnx

    try:
        onnx.checker.check_model(str(path))  # by path: weights in an external data file beside it are checked too
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise BadInputError(f"{path}: not a valid ONNX model ({first_line(exc)})") from exc
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        declared = [(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None,
                     d.dim_param if d.HasField("dim_param") else None) for d in tensor_type.shape.dim]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        specs.append(TensorSpec(value.name, tuple(size for size, _ in declared), dtype, model_batch_axis(declared)))
    outputs = [value.name for value in model.graph.output]
    recorded = onnx_recorded_shapes({prop.key: prop.value for prop in model.metadata_props})
    inputs, by_data = _resolve_shapes(path, _with_batch_axes(path, specs, batch_axes), input_shapes, recorded,
                                      data_shapes, shapes_from)
    return SourceModel("onnx", path, inputs, onnx_path=path, output_names=outputs, quantized_ops=quantized_ops(model),
                       declared_inputs=specs, sized_by_data=by_data)


def _load_openvino(path: Path, input_shapes: dict, batch_axes: dict, data_shapes=None,
                   shapes_from: str = "--input-shape") -> SourceModel:
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
        specs.append(TensorSpec(port.get_any_name(), dims, dtype, model_batch_axis([(d, None) for d in dims])))
    outputs = [port.get_any_name() if port.get_names() else f"output{i}" for i, port in enumerate(model.outputs)]
    inputs, by_data = _resolve_shapes(path, _with_batch_axes(path, specs, batch_axes), input_shapes,
                                      openvino_recorded_shapes(model), data_shapes, shapes_from)
    return SourceModel("openvino", path, inputs, output_names=outputs, declared_inputs=specs, sized_by_data=by_data)


FACTORY_RETURNS = "(module, example_input) or (module, example_input, dynamic_axes)"
AXES_EXAMPLE = "a dict like {'input_ids': {0: 'batch', 1: 'sequence'}}"


def _load_torch_factory(path: Path, factory: str, input_shapes: dict, shapes_from: str) -> SourceModel:
    built = call(path, factory, load_function(path, factory, "model factory"))
    if not (isinstance(built, tuple) and len(built) in (2, 3)):
        raise BadInputError(f"{path}:{factory} must return {FACTORY_RETURNS}")
    module, example, axes = built if len(built) == 3 else (*built, None)
    import torch

    if not isinstance(module, (torch.nn.Module, torch.export.ExportedProgram)):
        raise BadInputError(f"{path}:{factory} must return {FACTORY_RETURNS}; its first item is a "
                            f"{type(module).__name__}, not a torch.nn.Module")
    if axes is not None and not isinstance(axes, dict):
        raise BadInputError(f"{path}:{factory}: the third item (dynamic_axes) is a {type(axes).__name__}, not "
                            f"{AXES_EXAMPLE}")
    source = torch_source(path, module.eval() if isinstance(module, torch.nn.Module) else module, example,
                          input_shapes, shapes_from=shapes_from)
    if axes is not None:
        source.declared_inputs = _declared_dynamic(f"{path}:{factory}", source.inputs, source.output_names, axes)
    return source


def _declared_dynamic(where: str, inputs: list[TensorSpec], outputs: list[str], axes: dict) -> list[TensorSpec]:
    """``inputs`` with the dimensions a factory declares dynamic unsized: ``axes`` as ``torch.onnx.export``'s
    ``dynamic_axes`` takes them (``{"input_ids": {0: "batch", 1: "sequence"}}`` or ``{"input_ids": [0, 1]}``; the
    outputs' entries are taken as given: an output's sizes follow from the inputs')."""
    ranks = {spec.name: len(spec.shape) for spec in inputs}
    axes = one_input_alias(list(ranks), {name: a for name, a in axes.items() if name not in outputs or name in ranks})
    unknown = [str(name) for name in axes if name not in ranks]
    if unknown:
        raise BadInputError(f"{where}: dynamic_axes names unknown input(s) {', '.join(unknown)}; the model's "
                            f"inputs are {', '.join(ranks)}")
    dims: dict[str, set[int]] = {}
    for name, listed in axes.items():
        if not isinstance(listed, (dict, list, tuple)) or not all(
                isinstance(a, int) and not isinstance(a, bool) and -ranks[name] <= a < ranks[name] for a in listed):
            raise BadInputError(f"{where}: dynamic_axes['{name}'] must list axes of a rank-{ranks[name]} input "
                                f"(got {listed!r}; {AXES_EXAMPLE})")
        dims[name] = {a % ranks[name] for a in listed}
    return [TensorSpec(spec.name, tuple(None if axis in dims.get(spec.name, ()) else d
                                        for axis, d in enumerate(spec.shape)), spec.dtype, spec.batch_axis)
            for spec in inputs]


def _load_torch_archive(path: Path, input_shapes: dict, shapes_from: str) -> SourceModel:
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
        if _is_torch_package(path):
            raise BadInputError(f"{path}: a torch.package archive, not a TorchScript file: load its model in a "
                                "factory (file.py:function returning the module and an example input; "
                                "torch.package.PackageImporter(path).load_pickle(package, resource))") from exc
        raise BadInputError(f"{path}: not a TorchScript or torch.export archive ({first_line(exc)})") from exc
    if example is None:
        names = _script_inputs(path, module, input_shapes)
        if not input_shapes:  # a TorchScript file records no shapes (nor dtypes)
            raise BadInputError(f"{path}: give the input shapes with "
                                + " ".join(f"--input-shape {name}=D1,D2,..." for name in names or ["NAME"]))
        example = tuple(torch.zeros(shape) for shape in input_shapes.values())
    try:
        return torch_source(path, module, example, input_shapes, shapes_name_inputs=True, shapes_from=shapes_from)
    except BadInputError as exc:
        floats = all(t.is_floating_point() for t in example if isinstance(t, torch.Tensor))
        if path.suffix.lower() == ".pt2" or not floats or not re.search(r"\b(Long|Int|int32|int64)\b", str(exc)):
            raise
        raise BadInputError(f"{exc}; it wants integer inputs, and a TorchScript file records no input types: a "
                            "factory (file.py:function) gives an example of the right types") from exc


def _script_inputs(path: Path, module, input_shapes: dict) -> list[str]:
    """A TorchScript module's inputs by ``forward()``'s schema (trailing ones with defaults left out unless given
    a shape); an input that is no tensor (Silero's stress model takes ``List[str]``) is refused in one line."""
    import torch

    if not isinstance(module, torch.jit.ScriptModule) or not hasattr(module, "forward"):
        return []
    arguments = [(a.name, str(a.type), a.has_default_value()) for a in module.forward.schema.arguments[1:]]
    while arguments and arguments[-1][2] and arguments[-1][0] not in input_shapes:
        arguments.pop()
    other = [(name, kind) for name, kind, _ in arguments if kind not in ("Tensor", "Optional[Tensor]")]
    if other:
        raise BadInputError(f"{path}: input '{other[0][0]}' is {other[0][1]}, not a tensor: edgeopt feeds tensors; "
                            "call the model's tensor part from a factory (file.py:function)")
    return [name for name, _, _ in arguments]


def _is_torch_package(path: Path) -> bool:
    """A ``torch.package`` archive (Silero's models ship so): a zip holding ``.data/extern_modules``, which only
    packages have (every torch.save zip holds ``.data/serialization_id``)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/.data/extern_modules") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def torch_source(path: Path, module, example, input_shapes: dict, *, shapes_name_inputs: bool = False,
                 shapes_from: str = "--input-shape", **extra) -> SourceModel:
    """A ``SourceModel`` for a torch module and its example input (``edgeopt.torch_inputs`` forms);
    ``input_shapes`` replaces the example's shapes by input name. ``shapes_name_inputs`` (an archive, whose
    inputs have no names of their own): shapes for all of them under other names name them, by position."""
    import torch

    where = str(path)
    if isinstance(module, torch.export.ExportedProgram):
        example = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        names = default_input_names(len(example))
        call = None
    else:
        call = torch_call(module, example, where)
        module, example, names = call.module, call.example, call.input_names
    if shapes_name_inputs and len(input_shapes) == len(example) and not set(input_shapes) <= set(names):
        names = list(input_shapes)  # positional: the shapes name the inputs
        example = tuple(torch.zeros(shape, dtype=t.dtype) for shape, t in zip(input_shapes.values(), example))
    elif input_shapes:
        input_shapes = one_input_alias(names, input_shapes)
        _check_names(path, names, input_shapes, shapes_from)
        example = tuple(torch.zeros(input_shapes[n], dtype=t.dtype) if n in input_shapes else t
                        for n, t in zip(names, example))
    if input_shapes:
        _check_runs(path, module, example, shapes_from)
    if not all(isinstance(t, torch.Tensor) for t in example):
        raise BadInputError(f"{path}: the example input must be a tensor or a tuple of tensors")
    specs = [TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                        model_batch_axis([(d, None) for d in t.shape])) for name, t in zip(names, example)]
    outputs = call.output_names if call else _output_names(module.module(), example)
    return SourceModel("torch", path, specs, torch_module=module, example_input=example, output_names=outputs,
                       **extra)


def _check_names(path: Path, names: list[str], given: dict, option: str) -> None:
    """Every input named by ``option`` is one of the model's (``names``, in the model's order)."""
    unknown = set(given) - set(names)
    if unknown:
        raise BadInputError(f"{path}: {option} names unknown input(s) {', '.join(sorted(unknown))}; "
                            f"the model's inputs are {', '.join(names)}")


def _with_batch_axes(path: Path, specs: list[TensorSpec], batch_axes: dict) -> list[TensorSpec]:
    """``specs`` with the batch axes given by the user (by input name) in place of the model's."""
    batch_axes = one_input_alias([spec.name for spec in specs], batch_axes)
    _check_names(path, [spec.name for spec in specs], batch_axes, "--batch-axis")
    resolved = []
    for spec in specs:
        axis = batch_axes.get(spec.name, spec.batch_axis if spec.shape else None)
        check_batch_axis(str(path), spec.name, axis, len(spec.shape))
        resolved.append(TensorSpec(spec.name, spec.shape, spec.dtype, axis))
    return resolved


def _check_runs(path: Path, module, example: tuple, shapes_from: str) -> None:
    """Run the model once on inputs of the given shapes: a shape it cannot take is the user's to fix."""
    import torch

    runnable = module.module() if isinstance(module, torch.export.ExportedProgram) else module
    try:
        with torch.no_grad():
            runnable(*example)
    except Exception as exc:
        raise does_not_run(str(path), example, exc, shapes_from) from exc


def _resolve_shapes(path: Path, specs: list[TensorSpec], input_shapes: dict, recorded: dict | None = None,
                    data_shapes: Callable[[list[TensorSpec]], dict] | None = None,
                    shapes_from: str = "--input-shape") -> tuple[list[TensorSpec], list[str]]:
    """Each input at a static shape: the one given, else the sizes the file records (edgeopt's artifacts), else
    its declared shape with its dynamic dimensions as the calibration data's samples have them
    (``data_shapes(specs)``: input name -> one sample's shape, ``edgeopt.data.sample_shapes``), else with a dynamic
    batch axis at 1. Also the dimensions sized by the data (``x[3] = 160``)."""
    input_shapes = one_input_alias([spec.name for spec in specs], input_shapes)
    _check_names(path, [spec.name for spec in specs], input_shapes, shapes_from)
    resolved, by_data, seen = [], [], None
    for spec in specs:
        stored = tuple((recorded or {}).get(spec.name, ()))
        fits = len(stored) == len(spec.shape) and all(d is None or d == s for d, s in zip(spec.shape, stored))
        shape = input_shapes.get(spec.name, stored if fits else spec.shape)
        if None in shape and data_shapes is not None:
            seen = data_shapes(specs) if seen is None else seen
            sample = seen.get(spec.name, ())
            if len(sample) == len(shape) and all(d is None or d == s for d, s in zip(shape, sample)):
                by_data += [f"{spec.name}[{axis}] = {s}" for axis, (d, s) in enumerate(zip(shape, sample))
                            if d is None and (axis != spec.batch_dim or s != 1)]  # a batch of 1 is the default
                shape = tuple(sample)
        if spec.name not in input_shapes and spec.batch_dim is not None and shape[spec.batch_dim] is None:
            shape = tuple(1 if axis == spec.batch_dim else d for axis, d in enumerate(shape))
        if len(shape) != len(spec.shape) or any(m is not None and m != g for m, g in zip(spec.shape, shape)):
            raise BadInputError(f"{path}: input '{spec.name}' has shape {format_shape(spec.shape)}, "
                                f"{shapes_from} gives {format_shape(tuple(shape))}")
        if any(d is None for d in shape):
            raise BadInputError(f"{path}: input '{spec.name}' has a dynamic shape {format_shape(spec.shape)}; "
                                f"give it with --input-shape {spec.name}=D1,D2,...")
        resolved.append(TensorSpec(spec.name, tuple(shape), spec.dtype, spec.batch_axis))
    return resolved, by_data
