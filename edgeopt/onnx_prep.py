"""Normalise an ONNX graph before quantization, the way ONNX Runtime's and NNCF's quantizers expect it.

Models exported by other toolkits (Paddle2ONNX, old torch exporters) often keep their weights as ``Constant``
nodes, use opsets below 13 (where per-channel ``QuantizeLinear`` does not exist) and carry no shapes. A
quantizer sees no weights in such a graph, falls back to per-tensor scales, or cannot place QDQ pairs that
ONNX Runtime fuses. :func:`normalise` fixes all of that and says what it did, and simplifies the element-wise
chains ONNX Runtime's optimiser leaves between Convs (each one more QuantizeLinear/DequantizeLinear pair or
QLinear op once quantized).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeopt.paired_timing import COVERAGE, SLOWER_TOLERANCE, THREADS, median_interval, paired_ratios

MIN_OPSET = 13  # first opset with per-axis QuantizeLinear/DequantizeLinear
HARD_SWISH_OPSET = 14  # first opset with HardSwish


@dataclass
class Normalised:
    model: object  # onnx.ModelProto
    steps: list[str] = field(default_factory=list)  # what was done, for the report

    @property
    def opset(self) -> int:
        return default_opset(self.model)


def default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def normalise(model, *, optimise: bool = True, feeds: dict | None = None, simplify: bool = True,
              dynamic: dict[str, list[int]] | None = None) -> Normalised:
    """Constant-node weights to initializers, opset ≥ 13, shapes inferred, average pools that cover their whole
    input as global pools (:func:`global_pools`; ``feeds``, one input sample, measures shapes that inference
    leaves unknown), graph folded by ONNX Runtime's basic optimiser (constant folding, Conv+BatchNorm and
    similar fusions that keep the graph portable), then (``simplify``) zero Pads folded into the Conv or pool
    after them where ONNX Runtime does not run that slower (:func:`_fold_pads_where_they_pay`, on ``feeds``) and
    the element-wise chains it leaves simplified: a Conv's constant scale and shift folded into it
    (:func:`fold_conv_affine`), scalar affine chains ahead of unpadded Convs too (:func:`fold_input_affine`),
    spelled-out hard-swishes as one HardSwish (the opset raised from 13 to 14 for it) or else two ops
    (:func:`hard_swishes`), and (``feeds``) an output's declared
    shape dropped where the graph computes another (:func:`outputs_as_computed`). Every rewrite computes the
    same values. ``dynamic``: input name -> the axes the source file declares dynamic, which the optimiser
    sees dynamic, so that it folds nothing those sizes decide (a Reshape's target, a MatMul+Add written as a Gemm
    between two Reshapes) and the result can run at other sizes again (``edgeopt.dynamic_axes``)."""
    import onnx

    copied = onnx.ModelProto()
    copied.CopyFrom(model)  # the caller's model stays as it was
    model = copied
    result = Normalised(model)
    moved = constants_to_initializers(model)
    if moved:
        result.steps.append(f"{moved} Constant node(s) moved to initializers")
    dropped = initializer_inputs(model)
    if dropped:
        result.steps.append(f"{dropped} initializer(s) no longer listed as graph inputs (IR 3): constants")
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
        optimised, fused, error = _ort_basic_optimise(model, dynamic)
    else:
        error = _load_error(model) if model is not original else ""
    if error and model is not original:  # ONNX Runtime cannot load the upgraded graph: keep the old opset
        result.steps = [s for s in result.steps if not s.startswith("opset")]
        result.steps.append(f"opset {opset} kept (ONNX Runtime cannot load the upgraded graph: {error})")
        model = original
        if optimise:
            optimised, fused, error = _ort_basic_optimise(model, dynamic)
    if optimise:
        model = optimised
        if fused:
            result.steps.append(fused)
    flattened = flat_gemm_biases(model)  # also those ONNX Runtime's optimiser fused from MatMul + Add
    if flattened:
        result.steps.append(f"{flattened} Gemm bias(es) of shape [1, N] stored as [N] (the same sum)")
    if simplify:
        result.steps += _fold_pads_where_they_pay(model, feeds)
        result.steps += simplify_element_wise(model)
    if feeds is not None:
        result.steps += [f"{what}: its declared shape dropped" for what in outputs_as_computed(model, feeds)]
    result.model = model
    return result


def flat_gemm_biases(model) -> int:
    """Store each Gemm's constant bias of shape ``[1, N]`` as ``[N]``, in place (Gemm's output is ``[M, N]``:
    both broadcast alike). ONNX Runtime 1.32's quantize_static fails on the 2-D form ("The truth value of an
    array with more than one element is ambiguous", in its int32-bias weight-scale adjustment): both of its
    candidates failed on Magika's tf2onnx classifier. The number of biases stored so."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers, kept = tensor_readers(graph), kept_names(graph) | {value.name for value in graph.value_info}
    done = 0
    for node in graph.node:
        if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in inits:
            continue
        bias = inits[node.input[2]]
        if len(bias.dims) != 2 or bias.dims[0] != 1 or _sole_reader(readers, kept, node.input[2]) is not node:
            continue
        bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias).reshape(-1), bias.name))
        done += 1
    return done


def simplify_element_wise(model) -> list[str]:
    """Simplify ``model``'s element-wise chains in place (:func:`normalise`); what was done, for the report."""
    steps = []
    folded = fold_conv_affine(model)
    if folded:
        steps.append(f"{folded} constant Mul/Add after a Conv folded into its weights and bias")
    inputs = fold_input_affine(model)
    if inputs:
        steps.append(f"{inputs} constant scalar Mul/Add before unpadded Convs folded into them")
    opset = default_opset(model)
    if MIN_OPSET <= opset < HARD_SWISH_OPSET and spelled_hard_swishes(model):
        upgraded = _upgraded(model, HARD_SWISH_OPSET)
        if upgraded is not None:
            model.CopyFrom(upgraded)
            steps.append(f"opset {opset} -> {HARD_SWISH_OPSET} (onnx.version_converter) for HardSwish")
    swishes = hard_swishes(model)
    if swishes:
        form = "HardSwish" if default_opset(model) >= HARD_SWISH_OPSET else "x * HardSigmoid(x)"
        steps.append(f"{swishes} hard-swish(es) written as {form}")
    return steps


def _fold_pads_where_they_pay(model, feeds: dict | None) -> list[str]:
    """:func:`fold_pads` (in place), undone where ONNX Runtime runs the folded graph decisively slower on ``feeds``
    (the whole interval on the paired rounds' ratio above ``1 + SLOWER_TOLERANCE``, ``edgeopt.paired_timing``: a
    near tie stays folded, so the file does not follow the host's load; without ``feeds`` the fold stays):
    EfficientNet-B0's stride-2 Pads cost ~9% of its p50 unfolded, but CREPE's "same" Pads (31/32 rows before
    64x1 Convs) folded ran the whole model 3.7x slower (its float Convs leave ONNX Runtime's fast path once they
    pad). What was done, for the report."""
    import onnx

    plain = None
    if feeds is not None and any(node.op_type == "Pad" for node in model.graph.node):
        plain = onnx.ModelProto()
        plain.CopyFrom(model)
    folded = fold_pads(model)
    if not folded:
        return []
    ratios = None if plain is None else _p50_ratios(model, plain, feeds)
    low, high = median_interval(ratios) if ratios else (0.0, 0.0)
    if low > 1 + SLOWER_TOLERANCE:  # decisively slower: a tie stays folded
        model.CopyFrom(plain)
        return [f"{folded} zero Pad(s) kept: folded into the Conv or pool after them, the graph ran "
                f"{float(np.median(ratios)):.3f}x its p50 in ONNX Runtime ({COVERAGE:.0%} interval {low:.3f}-"
                f"{high:.3f}x)"]
    return [f"{folded} zero Pad(s) folded into the Conv or pool after them"]


PAD_CHECK_S = 10.0  # at most this long timing a folded graph against the unfolded one


def _p50_ratios(model, reference, feeds: dict) -> list[float] | None:
    """Per paired round, ``model``'s p50 over ``reference``'s in ONNX Runtime (``THREADS`` threads, at most
    ``PAD_CHECK_S``), or None where either does not run on ``feeds``."""
    runs = []
    try:
        for graph in (reference, model):
            session = quiet_session(graph, threads=THREADS)
            wanted = {spec.name for spec in session.get_inputs()}
            given = {name: value for name, value in feeds.items() if name in wanted}
            session.run(None, given)
            runs.append(lambda session=session, given=given: session.run(None, given))
    except Exception:  # noqa: BLE001 - a graph ONNX Runtime cannot run at these sizes: nothing to compare
        return None
    return paired_ratios(*runs, max_s=PAD_CHECK_S)[2]


def _load_error(model) -> str:
    """Why ONNX Runtime cannot load ``model`` ("" when it can)."""
    try:
        quiet_session(model)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types from C++
        return _line(exc)
    return ""


def _upgraded(model, opset: int):
    """``model`` converted to ``opset`` by ``onnx.version_converter``, or None when that or loading the result in
    ONNX Runtime fails."""
    from onnx import version_converter

    try:
        upgraded = version_converter.convert_version(model, opset)
    except Exception:
        return None
    return None if _load_error(upgraded) else upgraded


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


def initializer_inputs(model) -> int:
    """Drop from the main graph's inputs the names its initializers hold: exporters of IR version 3 list every
    weight as an input too, which ONNX Runtime then treats as a value the caller may override (not a constant:
    no folding, no fusion) and which quantizers leave alone. The IR version is raised to 4 (initializers
    without inputs) where lower. Returns how many inputs were dropped."""
    graph = model.graph
    held = {init.name for init in graph.initializer}
    kept = [i for i in graph.input if i.name not in held]
    dropped = len(graph.input) - len(kept)
    if dropped:
        copies = [type(i)() for i in kept]
        for copy, value in zip(copies, kept):
            copy.CopyFrom(value)
        del graph.input[:]
        graph.input.extend(copies)
        model.ir_version = max(model.ir_version, 4)
    return dropped


def _ort_basic_optimise(model, dynamic: dict[str, list[int]] | None = None) -> tuple[object, str, str]:
    """Run ONNX Runtime's basic (provider-independent) graph optimisations offline and keep the result.

    The result still runs in any ONNX runtime; what changes is that BatchNormalization, constant
    sub-graphs and identity ops are folded, so a quantizer sees Conv weights as they will run. Returns the
    model, what was folded, and why ONNX Runtime could not load the model ("" when it could). ``dynamic``: the
    input axes the optimiser sees dynamic; the result has ``model``'s input shapes again.
    """
    import onnx
    import onnxruntime as ort

    before = len(model.graph.node)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(_with_dims(model, dynamic, open_dims=True) if dynamic else model, str(src))
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
    if dynamic:
        optimised = _with_dims(optimised, dynamic, open_dims=False, shapes=model)
    _drop_unused_opsets(optimised, {opset.domain for opset in model.opset_import})
    after = len(optimised.graph.node)
    folded = f"{before - after} node(s) folded by ONNX Runtime's basic optimiser" if after < before else ""
    return optimised, folded, ""


def _drop_unused_opsets(model, declared: set[str]) -> None:
    """Drop, in place, the opset imports no node uses and ``declared`` (the source's) lacks: ONNX Runtime's
    optimiser writes every domain it knows (``ai.onnx.training``, ``com.microsoft.nchwc``, ``org.pytorch.aten``,
    ...; 9 on openWakeWord's embedding model), which other tools may refuse."""
    used = {"", *declared, *(node.domain for node in all_nodes(model.graph))}
    kept = [opset for opset in model.opset_import if opset.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)


def as_shipped(model, dynamic: dict[str, list[int]] | None):
    """``model`` with the input axes the source declares dynamic (``dynamic``) opened again, as
    ``edgeopt.dynamic_axes`` ships it where the check holds: what ONNX Runtime should be timed on. A graph can run
    slower so (ddddocr's OCR CRNN: its classifier MatMul fuses into QGemm only at static sizes; INT8 4.2 ms static,
    12.8 ms with the width dynamic, FP32 9.3 ms). ``model`` itself where nothing is dynamic."""
    return _with_dims(model, dynamic, open_dims=True) if dynamic else model


def _with_dims(model, dynamic: dict[str, list[int]], *, open_dims: bool, shapes=None):
    """A copy of ``model`` with the ``dynamic`` input axes opened (a symbolic size each) or set back to the sizes
    ``shapes`` (a model) declares, and no recorded intermediate shapes (inferred again when set back)."""
    import onnx

    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    declared = {value.name: value for value in (shapes or model).graph.input}
    for value in copied.graph.input:
        for axis in dynamic.get(value.name, []):
            dim = value.type.tensor_type.shape.dim[axis]
            if open_dims:
                dim.Clear()
                dim.dim_param = f"{value.name}_{axis}"
            else:
                dim.CopyFrom(declared[value.name].type.tensor_type.shape.dim[axis])
    del copied.graph.value_info[:]
    if open_dims:
        return copied
    try:
        return onnx.shape_inference.infer_shapes(copied)
    except Exception:  # as in normalise: shapes help the quantizers, they are not required
        return copied


STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def subgraphs(node):
    """The graphs ``node`` holds in its attributes (``If``'s branches, a ``Loop``'s or ``Scan``'s body)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def all_nodes(graph):
    """Every node of ``graph`` and of its subgraphs (:func:`subgraphs`), each before the bodies it holds."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


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
            for sub in subgraphs(node):
                visit(sub)

    visit(model.graph)
    return found


QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                 "QGemm", "QAttention", "MatMulNBits", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM",
                 "MatMulIntegerToFloat")  # and every QLinear* op


def quantized_ops(model) -> dict[str, int]:
    """How many of each quantized op ``model``'s main graph holds (QDQ pairs, ONNX Runtime's integer and QLinear
    ops): non-empty for a model some quantizer already wrote."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS or node.op_type.startswith("QLinear"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def probe_tensors(model, names: list[str], samples: list[dict]):
    """For each sample, the values of ``model``'s tensors ``names`` (by name) as ONNX Runtime computes them on
    the CPU; graph inputs are read from the sample itself."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    inputs = {i.name for i in model.graph.input}
    computed = sorted({name for name in names if name not in inputs})
    session = None
    if computed:
        probe = onnx.ModelProto.FromString(model.SerializeToString())
        del probe.graph.output[:]
        probe.graph.output.extend([helper.make_empty_tensor_value_info(n) for n in computed])  # any type
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for sample in samples:
        values = dict(zip(computed, session.run(computed, {k: v for k, v in sample.items() if k in inputs})
                          if session else []))
        yield {name: values[name] if name in values else np.asarray(sample[name]) for name in names}


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


def weight_output_axis(node, ndim: int) -> int:
    """The axis of a Conv/Gemm/MatMul weight (input 1, ``ndim`` dims) that indexes output channels: 0 for a Conv
    and a Gemm with ``transB``, else the last."""
    transposed = node.op_type == "Gemm" and bool(_attributes(node).get("transB", 0))
    return 0 if node.op_type == "Conv" or transposed else ndim - 1


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
    (:func:`global_pools`, the pools' input shapes measured by one ONNX Runtime run on zeros of ``shapes``;
    :func:`scalar_if_conditions`), or None when there is nothing to rewrite."""
    import onnx

    model = onnx.load(str(path))
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    feeds = {name: np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(types[name]))
             for name, shape in shapes.items() if name in types}
    rewritten = global_pools(model, pool_input_dims(model, feeds)) + scalar_if_conditions(model)
    return model if rewritten else None


def scalar_if_conditions(model) -> int:
    """Reshape, in place, the condition of every ``If`` in the main graph to a scalar; return how many. ONNX
    only asks for one element, and exporters write ``[1, 1]`` (openWakeWord's hey_jarvis head, torch 1.12), but
    OpenVINO's frontend refuses a condition of rank above 1."""
    import onnx

    graph = model.graph
    nodes, scalars, count = [], {}, 0
    for node in graph.node:
        if node.op_type == "If":
            condition = node.input[0]
            if condition not in scalars:  # one Reshape per condition, however many Ifs read it
                scalars[condition] = scalar = f"{condition}_edgeopt_scalar"
                shape = onnx.helper.make_node("Constant", [], [f"{scalar}_shape"],
                                              value=onnx.numpy_helper.from_array(np.zeros(0, np.int64)))
                nodes += [shape, onnx.helper.make_node("Reshape", [condition, f"{scalar}_shape"], [scalar])]
            node.input[0] = scalars[condition]
            count += 1
        nodes.append(node)
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def pool_input_dims(model, feeds: dict) -> dict[str, list[int]]:
    """The shapes of the plain ``AveragePool`` inputs of ``model``, measured by one ONNX Runtime run on ``feeds``
    (empty when there are none, or ONNX Runtime cannot run the model)."""
    import onnx

    wanted = list(dict.fromkeys(node.input[0] for node in _plain_average_pools(model)))
    if not wanted:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in wanted)
    try:
        values = quiet_session(probe).run(wanted, feeds)
    except Exception:
        return {}
    return {name: list(value.shape) for name, value in zip(wanted, values)}


def quiet_session(model, threads: int | None = None):
    """An ONNX Runtime session of ``model`` (a ModelProto) that logs errors only (``threads``: intra-op threads,
    one inter-op; default ONNX Runtime's)."""
    import onnxruntime as ort

    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3
    if threads:
        quiet.intra_op_num_threads, quiet.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), quiet, providers=["CPUExecutionProvider"])


def outputs_as_computed(model, feeds: dict) -> list[str]:
    """Drop the declared shape of each output whose graph computes another on ``feeds`` (in place): ddddocr's OCR
    model declares ``[1, seqlen]`` and computes ``[20, 1, 8210]``; ONNX Runtime warns on every run of such a file
    and refuses to run it twice through an IO binding. What was dropped, in words (empty when nothing was, or
    ONNX Runtime cannot run the model)."""
    names = [value.name for value in model.graph.output]
    try:
        session = quiet_session(model)
        wanted = {spec.name for spec in session.get_inputs()}
        computed = session.run(names, {name: value for name, value in feeds.items() if name in wanted})
    except Exception:
        return []
    dropped = []
    for value, array in zip(model.graph.output, computed):
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
        if len(declared) != array.ndim or any(isinstance(d, int) and d != s for d, s in zip(declared, array.shape)):
            tensor.ClearField("shape")
            dropped.append(f"output '{value.name}' declared {declared}, computes {list(array.shape)}")
    return dropped


def count_ops(model, op_type: str) -> int:
    """How many ``op_type`` nodes ``model`` holds, its subgraphs (``If``/``Loop`` bodies) included."""
    return sum(node.op_type == op_type for node in all_nodes(model.graph))


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


def kept_names(graph) -> set[str]:
    """Tensors of ``graph`` a rewrite must keep: its outputs and what its subgraphs (``If``/``Loop`` bodies) read
    from the outer scope."""
    kept = {o.name for o in graph.output}

    def visit(body) -> None:
        for node in body.node:
            kept.update(node.input)
            for sub in subgraphs(node):
                visit(sub)

    for node in graph.node:
        for sub in subgraphs(node):
            visit(sub)
    return kept


def tensor_readers(graph) -> dict[str, list]:
    """Each tensor name of ``graph`` → the nodes that read it."""
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _constant(inits: dict, name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    init = inits.get(name)
    if init is None:
        return None
    value = numpy_helper.to_array(init)
    return value if value.dtype == np.float32 else None


def _sole_reader(readers: dict, kept: set, tensor: str):
    """The one node that reads ``tensor``, or None (several readers, or a tensor the graph must keep)."""
    users = readers.get(tensor, [])
    return users[0] if len(users) == 1 and tensor not in kept else None


def _other_input(node, inits: dict, tensor: str) -> np.ndarray | None:
    """The constant ``node`` (a binary op) combines ``tensor`` with, or None when its other input is computed."""
    others = [name for name in node.input if name != tensor]
    return _constant(inits, others[0]) if len(others) == 1 and len(node.input) == 2 else None


def fold_conv_affine(model) -> int:
    """Fold each constant per-channel scale (Mul) and shift (Add) that a Conv's output alone feeds into the Conv's
    weights and bias (``y = a * conv(x) + b``: weights times ``a``, bias ``a * bias + b``); the same values.
    PP-LCNetV3's learnable affine blocks (PP-OCRv4) are such pairs after every Conv; ONNX Runtime's basic
    optimiser leaves them (scalar constants), and a quantized graph then runs each as a QLinearMul/QLinearAdd or
    a float op between QDQ pairs. Returns how many Mul/Add were folded."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    kept = kept_names(graph)
    readers = tensor_readers(graph)
    removed, folded = set(), 0
    for conv in graph.node:
        weight = _constant(inits, conv.input[1]) if conv.op_type == "Conv" and len(conv.input) > 1 else None
        if weight is None or conv.domain not in ("", "ai.onnx"):
            continue
        channels = weight.shape[0]
        bias = _constant(inits, conv.input[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(channels, np.float32)
        if bias is None:
            continue
        scale, shift, tail = np.ones(channels, np.float32), np.zeros(channels, np.float32), conv
        while True:
            user = _sole_reader(readers, kept, tail.output[0])
            if user is None or user.op_type not in ("Mul", "Add") or user.domain not in ("", "ai.onnx"):
                break
            value = _other_input(user, inits, tail.output[0])
            per_channel = None if value is None else _per_channel(value, channels, weight.ndim)
            if per_channel is None:
                break
            if user.op_type == "Mul":
                scale, shift = scale * per_channel, shift * per_channel
            else:
                shift = shift + per_channel
            removed.add(id(user))
            tail = user
            folded += 1
        if tail is conv:
            continue
        stem = f"{conv.output[0]}_affine"
        graph.initializer.extend([
            numpy_helper.from_array((weight * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(np.float32),
                                    f"{stem}_w"),
            numpy_helper.from_array((bias * scale + shift).astype(np.float32), f"{stem}_b")])
        del conv.input[1:]
        conv.input.extend([f"{stem}_w", f"{stem}_b"])
        conv.output[0] = tail.output[0]
    if folded:
        replace_nodes(graph, [n for n in graph.node if id(n) not in removed])
    return folded


def fold_input_affine(model) -> int:
    """Fold each chain of scalar Mul/Add (``t = a * x + b``) whose result only Convs without padding read into
    those Convs (weights times ``a``, bias plus ``b`` times each output channel's weight sum); the same values
    (with padding the border would see ``b`` where the Conv pads zeros, so padded Convs keep the chain).
    PP-LCNetV3 puts such an affine block after each activation, ahead of its pointwise Convs. Returns how many
    Mul/Add were folded."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    kept = kept_names(graph)
    producer = {out: node for node in graph.node for out in node.output}
    readers = tensor_readers(graph)
    removed, folded = set(), 0
    for tensor in list(readers):
        convs = readers[tensor]
        if tensor in kept or tensor in inits or not all(_unpadded_conv(c, inits, tensor) for c in convs):
            continue
        rank = min(len(inits[conv.input[1]].dims) for conv in convs)  # the Convs' input rank
        scale, shift, source, chain = 1.0, 0.0, tensor, []
        node = producer.get(source)
        while (node is not None and node.op_type in ("Mul", "Add") and node.domain in ("", "ai.onnx")
               and id(node) not in removed
               and (source == tensor or (len(readers.get(source, [])) == 1 and source not in kept))):
            x = next((name for name in node.input if name not in inits), None)
            value = None if x is None else _other_input(node, inits, x)
            if value is None or value.size != 1 or value.ndim > rank:  # a wider constant would broadcast the rank
                break
            c = float(value.ravel()[0])
            scale, shift = (scale * c, shift) if node.op_type == "Mul" else (scale, shift + scale * c)
            chain.append(node)
            source, node = x, producer.get(x)
        if not chain:
            continue
        for conv in convs:
            weight = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float32)
            bias = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float32)
                    if len(conv.input) > 2 and conv.input[2] else np.zeros(weight.shape[0], np.float32))
            stem = f"{conv.output[0]}_input_affine"
            graph.initializer.extend([
                numpy_helper.from_array((weight * scale).astype(np.float32), f"{stem}_w"),
                numpy_helper.from_array((bias + shift * weight.reshape(weight.shape[0], -1).sum(axis=1))
                                        .astype(np.float32), f"{stem}_b")])
            del conv.input[1:]
            conv.input.extend([f"{stem}_w", f"{stem}_b"])
            conv.input[0] = source
        removed |= {id(node) for node in chain}
        folded += len(chain)
    if folded:
        replace_nodes(graph, [n for n in graph.node if id(n) not in removed])
    return folded


PADDED_OPS = ("Conv", "AveragePool")  # ops whose own pads can take a zero Pad (not MaxPool: its pads are -inf)


def fold_pads(model) -> int:
    """Fold each zero ``Pad`` of the spatial axes whose output only one Conv (or AveragePool counting the
    padding: the zeros it averages) reads into that op's ``pads``; the same values. Exporters write "same"
    padding of stride-2 layers so (transformers' EfficientNet: ``ZeroPad2d`` before its stride-2 depthwise
    Convs, marked ``auto_pad = VALID``; TensorFlow converters), and ONNX Runtime, whose own Pad fusion leaves
    those, ran EfficientNet-B0's 5 Pads as ~9% of its FP32 p50 (``bench/ort_profile.py``). Returns how many
    Pads were folded."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    kept = kept_names(graph)
    readers = tensor_readers(graph)
    removed = set()

    def constant(name: str):  # any dtype: the pads are int64
        return numpy_helper.to_array(inits[name]) if name in inits else None

    for pad in graph.node:
        users = readers.get(pad.output[0], []) if pad.op_type == "Pad" else []
        if (len(users) != 1 or pad.output[0] in kept or pad.domain not in ("", "ai.onnx")
                or users[0].op_type not in PADDED_OPS or users[0].input[0] != pad.output[0]):
            continue
        target, attrs = users[0], _attributes(pad)
        amounts = attrs.get("pads") if len(pad.input) < 2 else constant(pad.input[1])
        value = attrs.get("value", 0.0) if len(pad.input) < 3 or not pad.input[2] else constant(pad.input[2])
        if (amounts is None or value is None or np.any(np.asarray(value) != 0) or len(pad.input) > 3
                or attrs.get("mode", b"constant") != b"constant"):
            continue
        amounts = [int(a) for a in np.asarray(amounts).ravel()]
        rank = len(amounts) // 2
        begin, end = amounts[:rank], amounts[rank:]
        target_attrs = _attributes(target)
        if (rank < 3 or any(begin[:2]) or any(end[:2]) or min(amounts) < 0
                or target_attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")
                or (target.op_type == "AveragePool" and not target_attrs.get("count_include_pad", 0))):
            continue
        own = list(target_attrs.get("pads", [0] * 2 * (rank - 2)))
        spatial = rank - 2
        merged = [own[i] + begin[2 + i] for i in range(spatial)] + [own[spatial + i] + end[2 + i]
                                                                    for i in range(spatial)]
        for attr in list(target.attribute):
            if attr.name in ("pads", "auto_pad"):  # VALID is no padding: explicit pads replace it
                target.attribute.remove(attr)
        target.attribute.append(helper.make_attribute("pads", merged))
        target.input[0] = pad.input[0]
        removed.add(id(pad))
    if removed:
        replace_nodes(graph, [n for n in graph.node if id(n) not in removed])
    return len(removed)


def _unpadded_conv(node, inits: dict, tensor: str) -> bool:
    """Whether ``node`` is a Conv reading ``tensor`` as its input (only there), with constant weights (and bias)
    and no padding."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or list(node.input).count(tensor) != 1:
        return False
    if node.input[0] != tensor or len(node.input) < 2 or node.input[1] not in inits:
        return False
    if len(node.input) > 2 and node.input[2] and node.input[2] not in inits:
        return False
    attrs = _attributes(node)
    return not any(attrs.get("pads", [0])) and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", b"VALID")


def _per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as one number per channel of a rank-``rank`` NCHW-style tensor it broadcasts against without
    changing its shape, or None if it does not broadcast per channel."""
    if value.ndim > rank:
        return None
    if value.size == 1:
        return np.full(channels, float(value.ravel()[0]), np.float32)
    shape = [1] * (rank - value.ndim) + list(value.shape)
    if shape[1] == channels and all(d == 1 for i, d in enumerate(shape) if i != 1):
        return value.reshape(channels).astype(np.float32)
    return None


def replace_nodes(graph, nodes: list) -> None:
    """``graph``'s nodes replaced by ``nodes`` and initializers nothing reads any more dropped."""
    kept = []
    for node in nodes:
        copy = type(node)()
        copy.CopyFrom(node)
        kept.append(copy)
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in graph.node for name in node.input} | kept_names(graph)
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)
    produced = {name for node in graph.node for name in node.output} | {i.name for i in graph.input}
    for info in [info for info in graph.value_info if info.name not in produced]:
        graph.value_info.remove(info)


def spelled_hard_swishes(model) -> list[tuple[str, list]]:
    """Each hard-swish of ``model`` written out as ``x * clip(x + 3, 0, 6) / 6`` (Add, Clip, Mul, Div in either
    order, or a Mul by 1/6; Paddle2ONNX and exporters below opset 14 write it so): ``(x, its four nodes)``, the
    last node's output being the hard-swish's."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    kept = kept_names(graph)
    readers = tensor_readers(graph)
    found = []

    def scalar(node, tensor: str, want: float) -> bool:  # rank 0 or 1: it cannot widen x's shape
        value = _other_input(node, inits, tensor)
        return (value is not None and value.size == 1 and value.ndim <= 1
                and abs(float(value.ravel()[0]) - want) < 1e-6)

    for add in graph.node:
        x = next((name for name in add.input if _constant(inits, name) is None), None)
        if add.op_type != "Add" or x is None or not scalar(add, x, 3.0):
            continue
        clip = _sole_reader(readers, kept, add.output[0])
        if clip is None or clip.op_type != "Clip" or len(clip.input) != 3:
            continue
        low, high = _constant(inits, clip.input[1]), _constant(inits, clip.input[2])
        if low is None or high is None or float(low) != 0.0 or float(high) != 6.0:
            continue
        first = _sole_reader(readers, kept, clip.output[0])
        second = None if first is None else _sole_reader(readers, kept, first.output[0])
        if first is None or second is None:
            continue
        sixth = lambda node, tensor: ((node.op_type == "Div" and list(node.input).index(tensor) == 0  # noqa: E731
                                       and scalar(node, tensor, 6.0))
                                      or (node.op_type == "Mul" and scalar(node, tensor, 1.0 / 6.0)))
        times_x = lambda node, tensor: node.op_type == "Mul" and sorted(node.input) == sorted([x, tensor])  # noqa: E731
        if ((sixth(first, clip.output[0]) and times_x(second, first.output[0]))
                or (times_x(first, clip.output[0]) and sixth(second, first.output[0]))):
            found.append((x, [add, clip, first, second]))
    return found


def hard_swishes(model) -> int:
    """Rewrite each spelled-out hard-swish (:func:`spelled_hard_swishes`) as one ``HardSwish`` where ``model``'s
    opset has it (14+), else as ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5): the same values in one or two ops
    instead of four. Returns how many were rewritten."""
    from onnx import helper

    found = spelled_hard_swishes(model)
    single = default_opset(model) >= HARD_SWISH_OPSET
    removed, added = set(), {}
    for x, nodes in found:
        out = nodes[-1].output[0]
        gate = f"{out}_hardsigmoid"
        added[id(nodes[-1])] = ([helper.make_node("HardSwish", [x], [out], name=f"{out}_hardswish")] if single else
                                [helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1.0 / 6.0, beta=0.5),
                                 helper.make_node("Mul", [x, gate], [out], name=f"{out}_mul")])
        removed |= {id(node) for node in nodes}
    if found:
        nodes = []
        for node in model.graph.node:
            nodes.extend(added.get(id(node), []))
            if id(node) not in removed:
                nodes.append(node)
        replace_nodes(model.graph, nodes)
    return len(found)
