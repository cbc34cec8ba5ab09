"""Normalise an ONNX graph before quantization, the way ONNX Runtime's and NNCF's quantizers expect it.

Models exported by other toolkits (Paddle2ONNX, old torch exporters) often keep their weights as ``Constant``
nodes, use opsets below 13 (where per-channel ``QuantizeLinear`` does not exist) and carry no shapes. A
quantizer sees no weights in such a graph, falls back to per-tensor scales, or cannot place QDQ pairs that
ONNX Runtime fuses. :func:`normalise` fixes all of that and says what it did.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIN_OPSET = 13  # first opset with per-axis QuantizeLinear/DequantizeLinear


@dataclass
class Normalised:
    model: object  # onnx.ModelProto
    steps: list[str] = field(default_factory=list)  # what was done, for the report

    @property
    def opset(self) -> int:
        return default_opset(self.model)


def default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def normalise(model, *, optimise: bool = True, feeds: dict | None = None) -> Normalised:
    """Constant-node weights to initializers, opset ≥ 13, shapes inferred, average pools that cover their whole
    input as global pools (:func:`global_pools`; ``feeds``, one input sample, measures shapes that inference
    leaves unknown), graph folded by ONNX Runtime's basic optimiser (constant folding, Conv+BatchNorm and
    similar fusions that keep the graph portable)."""
    import onnx

    copied = onnx.ModelProto()
    copied.CopyFrom(model)  # the caller's model stays as it was
    model = copied
    result = Normalised(model)
    moved = constants_to_initializers(model)
    if moved:
        result.steps.append(f"{moved} Constant node(s) moved to initializers")
    opset = default_opset(model)
    original = model
    if opset < MIN_OPSET:
        from onnx import version_converter

        try:
            model = version_converter.convert_version(model, MIN_OPSET)
            result.steps.append(f"opset {opset} -> {MIN_OPSET} (onnx.version_converter)")
        except Exception as exc:  # the converter has no adapter for some ops: keep the old opset, say so
            result.steps.append(f"opset {opset} kept (version_converter: {_line(exc)})")
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes are a help to the quantizers, not a requirement
        pass
    dims = inferred_dims(model)
    if feeds is not None:  # shape inference leaves a dynamic export's spatial dims unknown: measure them
        dims.update(pool_input_dims(model, feeds))
    pools = global_pools(model, dims)
    if pools:
        result.steps.append(f"{pools} AveragePool(s) covering their whole input read as GlobalAveragePool")
    if optimise:
        optimised, fused, error = _ort_basic_optimise(model)
        if error and model is not original:  # ONNX Runtime cannot load the upgraded graph: keep the old opset
            result.steps = [s for s in result.steps if not s.startswith("opset")]
            result.steps.append(f"opset {opset} kept (ONNX Runtime cannot load the upgraded graph: {error})")
            model = original
            optimised, fused, error = _ort_basic_optimise(model)
        model = optimised
        if fused:
            result.steps.append(fused)
    result.model = model
    return result


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__


def constants_to_initializers(model) -> int:
    """Move the main graph's tensor-valued ``Constant`` nodes into initializers; return how many moved."""
    from onnx import numpy_helper

    graph = model.graph
    taken = {init.name for init in graph.initializer}
    keep, moved = [], 0
    for node in graph.node:
        attr = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attr is None or attr.name != "value" or node.output[0] in taken:
            keep.append(node)
            continue
        tensor = numpy_helper.to_array(attr.t)
        graph.initializer.append(numpy_helper.from_array(tensor, node.output[0]))
        moved += 1
    if moved:
        del graph.node[:]
        graph.node.extend(keep)
    return moved


def _ort_basic_optimise(model) -> tuple[object, str, str]:
    """Run ONNX Runtime's basic (provider-independent) graph optimisations offline and keep the result.

    The result still runs in any ONNX runtime; what changes is that BatchNormalization, constant
    sub-graphs and identity ops are folded, so a quantizer sees Conv weights as they will run. Returns the
    model, what was folded, and why ONNX Runtime could not load the model ("" when it could).
    """
    import onnx
    import onnxruntime as ort

    before = len(model.graph.node)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, str(src))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(dst)
        options.log_severity_level = 3
        try:
            ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            return model, "", _line(exc)
        try:  # ONNX Runtime can write an optimised graph it then cannot load itself: keep the input then
            quiet = ort.SessionOptions()
            quiet.log_severity_level = 3
            ort.InferenceSession(str(dst), quiet, providers=["CPUExecutionProvider"])
            optimised = onnx.load(str(dst))
        except Exception:
            return model, "", ""
    after = len(optimised.graph.node)
    folded = f"{before - after} node(s) folded by ONNX Runtime's basic optimiser" if after < before else ""
    return optimised, folded, ""


STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def unsupported_nodes(model) -> list[tuple[str, str]]:
    """``(node name, domain::op)`` of every node in ``model`` (or subgraph) whose op no standard ONNX domain or
    ONNX Runtime's contrib domain defines: custom ops, which no converter or quantizer here can run."""
    import onnx

    found = []

    def visit(graph) -> None:
        for index, node in enumerate(graph.node):
            domain = node.domain or ""
            known = domain in STANDARD_DOMAINS and (domain == "com.microsoft" or onnx.defs.has(node.op_type, domain))
            if not known:
                found.append((node.name or f"#{index}", f"{domain}::{node.op_type}" if domain else node.op_type))
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(model.graph)
    return found


def describe_unsupported(path) -> str | None:
    """One line naming the first unsupported node and op of the ONNX file at ``path`` (None if every op is
    standard or the file cannot be read)."""
    import onnx

    try:
        nodes = unsupported_nodes(onnx.load(str(path), load_external_data=False))
    except Exception:
        return None
    if not nodes:
        return None
    name, op = nodes[0]
    more = f" (and {len(nodes) - 1} more node(s))" if len(nodes) > 1 else ""
    return f"node '{name}' uses op {op}, which is not a standard ONNX op{more}"


def global_pools(model, dims: dict[str, list[int]]) -> int:
    """Rewrite, in place, every ``AveragePool`` whose window covers its whole spatial input (``dims``: each
    tensor's shape) without padding or dilation into ``GlobalAveragePool``: the same result (ONNX Runtime and
    PyTorch clip such a window to the input, e.g. ``nn.AvgPool2d(2560, ceil_mode=True)`` on 7x7 in
    ``transformers``' EfficientNet), but OpenVINO's ONNX frontend rejects a kernel larger than the input, and
    quantized (``count_include_pad=1``, as torch exports it), ONNX Runtime fuses it into a QLinearAveragePool
    whose output is all zeros (measured on that EfficientNet, ONNX Runtime 1.32: cosine 0.000 to FP32 with either
    backend's QDQ, 0.75-0.77 as GlobalAveragePool). Returns how many nodes were rewritten."""
    rewritten = 0
    for node in _plain_average_pools(model):
        attrs = _attributes(node)
        spatial = list(dims.get(node.input[0]) or [])[2:]
        kernel = list(attrs["kernel_shape"])
        if len(kernel) != len(spatial) or None in spatial or any(
                k < s or (k > s and not attrs.get("ceil_mode", 0)) for k, s in zip(kernel, spatial)):
            continue
        node.op_type = "GlobalAveragePool"
        del node.attribute[:]
        rewritten += 1
    return rewritten


def inferred_dims(model) -> dict[str, list[int | None]]:
    """Each tensor's shape as shape inference recorded it (``None`` for a symbolic or unknown dimension)."""
    values = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    return {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in values if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def _attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _plain_average_pools(model) -> list:
    """AveragePool nodes without padding or dilation."""
    found = []
    for node in model.graph.node:
        if node.op_type != "AveragePool" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = _attributes(node)
        if ("kernel_shape" in attrs and not any(attrs.get("pads", [0]))
                and all(d == 1 for d in attrs.get("dilations", [1])) and attrs.get("auto_pad", b"NOTSET") == b"NOTSET"):
            found.append(node)
    return found


def for_openvino(path, shapes: dict[str, list[int]]):
    """The ONNX file at ``path`` with the ops OpenVINO's ONNX frontend cannot read rewritten into equivalents
    (:func:`global_pools`, the pools' input shapes measured by one ONNX Runtime run on zeros of ``shapes``), or
    None when there is nothing to rewrite."""
    import onnx

    model = onnx.load(str(path))
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    feeds = {name: np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(types[name]))
             for name, shape in shapes.items() if name in types}
    return model if global_pools(model, pool_input_dims(model, feeds)) else None


def pool_input_dims(model, feeds: dict) -> dict[str, list[int]]:
    """The shapes of the plain ``AveragePool`` inputs of ``model``, measured by one ONNX Runtime run on ``feeds``
    (empty when there are none, or ONNX Runtime cannot run the model)."""
    import onnx
    import onnxruntime as ort

    wanted = list(dict.fromkeys(node.input[0] for node in _plain_average_pools(model)))
    if not wanted:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in wanted)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        values = session.run(wanted, feeds)
    except Exception:
        return {}
    return {name: list(value.shape) for name, value in zip(wanted, values)}


def count_ops(model, op_type: str) -> int:
    """How many ``op_type`` nodes ``model`` holds, its subgraphs (``If``/``Loop`` bodies) included."""
    import onnx

    def visit(graph) -> int:
        found = 0
        for node in graph.node:
            found += node.op_type == op_type
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    found += visit(attr.g)
                found += sum(visit(sub) for sub in attr.graphs)
        return found

    return visit(model.graph)


def pin_inputs(model, values: dict[str, np.ndarray], shapes: dict[str, list[int]]):
    """``model`` with each input in ``values`` replaced by that constant and every branch that constant decides
    folded away: ONNX Runtime's constant folding inlines an ``If`` whose condition is constant, first with the
    other inputs' shapes as declared (their dynamic dimensions still dynamic), then with them static
    (``shapes``), which folds the ``If``s that test shapes. Two rounds, not one: ONNX Runtime 1.32 crashed
    (segmentation fault) folding Silero VAD's nested ``If``s with the constant and static shapes in one round.
    Returns None when ONNX Runtime cannot load the pinned model."""
    import onnx
    from onnx import numpy_helper

    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    graph = pinned.graph
    for value in [v for v in graph.input if v.name in values]:
        graph.input.remove(value)
        graph.initializer.append(numpy_helper.from_array(np.asarray(values[value.name]), value.name))
    pinned, _, error = _ort_basic_optimise(pinned)
    if error:
        return None
    for value in pinned.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes.get(value.name, ())):
            dim.ClearField("dim_param")
            dim.dim_value = size
    pinned, _, error = _ort_basic_optimise(pinned)
    return None if error else pinned
