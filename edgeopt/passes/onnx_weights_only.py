"""INT8 weights, float compute: the ONNX INT8 candidate for models where ONNX Runtime's int8 kernels lose.

On small models ONNX Runtime's int8 kernels cost more than the float ones they replace: PP-OCR's text-direction
classifier (PP-LCNet x0.25, 48x192 input, 53 Convs with 8-200 channels) runs its QLinearConvs about twice as long
as float Convs (depthwise 0.46 vs 0.08 ms per call, profiled with ``bench/ort_profile.py``, 2 threads), and every
fully int8 graph of it ran 1.3-1.5x FP32's p50. There the file can still shrink ~4x without touching the compute:
each weight stored int8 and turned back into float by constants-only nodes that ONNX Runtime folds once, when the
session loads. Not by a DequantizeLinear: ONNX Runtime's constant folding skips those (they belong to QDQ groups)
and runs them on every call (1.47x FP32's p50 on that model, against 0.66x with Cast and Mul).
"""

from __future__ import annotations

import numpy as np

from edgeopt.data import SampleSet
from edgeopt.errors import BadInputError
from edgeopt.onnx_prep import (default_opset, kept_names, probe_tensors, replace_nodes, subgraphs, tensor_readers,
                               weight_output_axis)

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")  # ops whose constant input 1 is stored int8
BIASED_OPS = ("Conv", "Gemm")  # of those, the ones whose bias absorbs the rounding's mean shift
NODE_BYTES = 64  # about what the Cast and Mul that rebuild one weight add to the file


def symmetric_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` as symmetric int8 with one float32 scale per index of ``axis`` (max |w| / 127): (values,
    scales)."""
    reduce = tuple(i for i in range(weight.ndim) if i != axis)
    scale = np.maximum(np.abs(weight).max(axis=reduce), 1e-12).astype(np.float32) / 127.0
    shape = axis_shape(weight.ndim, axis)
    return np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def asymmetric_uint8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``weight`` as asymmetric uint8 with one float32 scale and zero point per index of ``axis`` (the range
    widened to hold 0): (values, scales, zero points)."""
    reduce = tuple(i for i in range(weight.ndim) if i != axis)
    low, high = np.minimum(weight.min(axis=reduce), 0), np.maximum(weight.max(axis=reduce), 0)
    scale = (np.maximum(high - low, 1e-12) / 255).astype(np.float32)
    zero = np.clip(np.rint(-low / scale), 0, 255).astype(np.uint8)
    shape = axis_shape(weight.ndim, axis)
    values = np.clip(np.rint(weight / scale.reshape(shape)) + zero.reshape(shape), 0, 255).astype(np.uint8)
    return values, scale, zero


def weights_only(model, calibration: SampleSet, subset_size: int, ignored: list[str]):
    """A copy of ``model`` with the constant weight of each Conv/Gemm/MatMul (not in ``ignored``) stored as
    symmetric per-output-channel int8 behind ``Cast`` to float and ``Mul`` by its scales, activations float;
    each Conv's and Gemm's bias corrected for the mean shift its weight's rounding causes on the first
    ``subset_size`` calibration samples (:func:`_input_means`; NNCF's fast bias correction does the same for its
    int8 layers). A weight is stored so only where it shrinks the file and every reader is such a node (not a
    graph input or output, nor read by an ignored node or a subgraph). Measured on PP-OCR's classifier (16
    held-out crops): worst output's cosine to FP32 0.99983 uncorrected, 0.99999 corrected (quantize_static's
    fully int8 graph 0.9999)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers = tensor_readers(graph)
    fixed = kept_names(graph) | {i.name for i in graph.input}
    skip = set(ignored)

    def storable(weight: str) -> bool:
        users = readers.get(weight, [])
        if weight not in inits or weight in fixed or not users:
            return False
        if any(u.op_type not in WEIGHT_OPS or u.name in skip or list(u.input).index(weight) != 1
               or list(u.input).count(weight) != 1 for u in users):
            return False
        axes = {weight_output_axis(u, len(inits[weight].dims)) for u in users}
        return len(axes) == 1 and _worth_storing(users[0], inits[weight])

    weights = sorted({n.input[1] for n in graph.node if n.op_type in WEIGHT_OPS and len(n.input) > 1
                      and storable(n.input[1])})
    if not weights:
        raise ValueError("no weight to store as int8 (none shrinks the file, or each is read elsewhere too)")
    names = _UniqueNames(model)
    corrected = [n for w in weights for n in readers[w] if n.op_type in BIASED_OPS]
    means = _input_means(model, {n.input[0]: 1 if n.op_type == "Conv" else -1 for n in corrected},
                         calibration.samples[:subset_size])
    rebuilt = {}
    for weight_name in weights:
        weight = numpy_helper.to_array(inits[weight_name]).astype(np.float32)
        axis = weight_output_axis(readers[weight_name][0], weight.ndim)
        values, scale = symmetric_int8(weight, axis)
        shape = axis_shape(weight.ndim, axis)
        scale = scale.reshape(shape)
        for node in readers[weight_name]:
            if node.op_type in BIASED_OPS and node.input[0] in means:
                _correct_bias(node, graph, inits, readers, values * scale - weight, means[node.input[0]], names)
        # short names and unnamed nodes: on a 0.5 MB model names are ~5% of the file
        rebuilt[weight_name] = stored, scales, cast, output = [names.fresh(f"{weight_name}_{s}") for s in "qsfw"]
        graph.initializer.extend([numpy_helper.from_array(values, stored), numpy_helper.from_array(scale, scales)])
        graph.initializer.remove(inits[weight_name])
    nodes, done = [], set()
    for node in graph.node:
        if node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in rebuilt:
            stored, scales, cast, output = rebuilt[node.input[1]]
            if output not in done:  # once, before its first reader
                nodes.append(helper.make_node("Cast", [stored], [cast], to=TensorProto.FLOAT))
                nodes.append(helper.make_node("Mul", [cast, scales], [output]))
                done.add(output)
            node.input[1] = output
        nodes.append(node)
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    del graph.value_info[:]  # the shapes normalisation inferred: runtimes infer them again, the file keeps less
    return model


def fold_weight_dequantize(model, weights: set[str] | None = None) -> tuple[list[str], list[str]]:
    """Put, in place, each DequantizeLinear of a stored weight (every input an initializer; of ``weights`` alone
    when given; not a blocked one, nor one in a QDQ group, whose reader also reads a dequantized activation: ONNX
    Runtime fuses those into int8 kernels) in the form ONNX Runtime runs fastest:

    - a 2-D weight one MatMul reads (input 1; opset 13 or later) stays behind a DequantizeLinear with a 1-D scale
      on axis 1, which ONNX Runtime fuses with the MatMul into an 8-bit MatMulNBits (six 768x3072 MatMuls: 0.70x
      float's p50 with a quarter of its memory; NNCF writes ``axis=-1``, which it does not fuse: 1.2x; a weight
      two MatMuls share is not fused either). At ONNX Runtime's default accuracy level 4 that kernel quantizes
      the activation to int8 per block of 32 (about 1% relative error, worst row cosine 0.99993 there);
    - any other is rewritten as ``Cast`` [→ ``Sub`` its zero point] → ``Mul`` by its scale, in float32 (then
      ``Cast`` to the DequantizeLinear's type), constants-only nodes ONNX Runtime folds once when the session
      loads, where it runs a DequantizeLinear on every call (resnet_digits' Conv weights from
      ``nncf.compress_weights``: 1.11-1.29x FP32's p50).

    A scale is broadcast along the DequantizeLinear's axis (1-D), or over the weight's leading axes where it has
    fewer (NNCF 3.4 gives a Conv weight ``[out, in, kh, kw]`` a scale ``[out, 1, 1]``, which ONNX Runtime's
    DequantizeLinear refuses); one that varies along more than one axis is requantized per output channel first
    (NNCF's ``[out, in]`` for a Conv1d weight ``[out, in, k]`` outweighed the int8 weight: Silero VAD's file
    0.51x FP32's size so, 0.28x requantized, cosine 0.99999 and 0.99995). Return the weights rewritten and,
    of those, the ones requantized."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers, producers = tensor_readers(graph), {out: node for node in graph.node for out in node.output}
    names = _UniqueNames(model)
    nodes, folded, requantized = [], [], []
    fuses_matmul = default_opset(model) >= 13  # a per-axis DequantizeLinear needs opset 13

    def dequantized(tensor: str) -> bool:
        producer = producers.get(tensor)
        return getattr(producer, "op_type", "") == "DequantizeLinear" and producer.input[0] not in inits

    def in_qdq_group(node) -> bool:
        """Its one reader is an int8 op ONNX Runtime fuses: a Conv or Gemm reading a dequantized activation whose
        output only QuantizeLinear reads, or a Gemm whose every input is dequantized (a QGemm with a float
        output). A kept-float logit after int8 layers is neither: its weight is folded."""
        users = readers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type not in ("Conv", "Gemm") or not dequantized(users[0].input[0]):
            return False
        reader = users[0]
        if reader.op_type == "Gemm" and all(dequantized(i) or i == node.output[0] for i in reader.input if i):
            return True
        after = readers.get(reader.output[0], [])
        return bool(after) and all(u.op_type == "QuantizeLinear" for u in after)

    def fused_already(node, stored, scale, attributes) -> bool:
        return attributes.get("axis", 1) == 1 and scale.ndim == 1 and scale.size == stored.shape[1] > 1

    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or attributes.get("block_size")
                or not all(name in inits for name in node.input if name)
                or (weights is not None and node.input[0] not in weights) or in_qdq_group(node)):
            nodes.append(node)
            continue
        stored = numpy_helper.to_array(inits[node.input[0]])
        scale = numpy_helper.to_array(inits[node.input[1]])
        dtype = scale.dtype  # the DequantizeLinear's output type
        zero = numpy_helper.to_array(inits[node.input[2]]) if len(node.input) > 2 and node.input[2] else None
        axis = attributes.get("axis", 1) % max(stored.ndim, 1)
        shape = _broadcast_shape(scale.shape, stored.shape, axis)
        if shape is None:
            raise BadInputError(f"weights (ONNX): a scale of shape {list(scale.shape)} for the weight "
                                f"'{node.input[0]}' of shape {list(stored.shape)} fits none of its axes "
                                "(use --format openvino)")
        users = readers.get(node.output[0], [])
        reader = users[0] if len(users) == 1 and list(users[0].input).index(node.output[0]) == 1 else None
        # a weight two readers share is not fused: folded
        matmul = fuses_matmul and stored.ndim == 2 and getattr(reader, "op_type", "") == "MatMul"
        if matmul and fused_already(node, stored, scale, attributes):
            nodes.append(node)
            continue
        if reader is not None and reader.op_type in WEIGHT_OPS:
            axis = weight_output_axis(reader, stored.ndim)
        if sum(size > 1 for size in shape) > 1 or (matmul and shape and shape[axis] == 1):
            weight = (stored.astype(np.float32) - (0 if zero is None else zero.reshape(shape))) * scale.reshape(shape)
            stored, scale, zero = (asymmetric_uint8(weight, axis) if stored.dtype == np.uint8
                                   else (*symmetric_int8(weight, axis), None))
            shape = axis_shape(stored.ndim, axis)
            requantized.append(node.input[0])
        elif shape and matmul:
            scale, zero = scale.reshape(-1), None if zero is None else zero.reshape(-1)
        elif not shape and matmul:  # per tensor: nothing to change
            nodes.append(node)
            continue
        stem = names.fresh(f"{node.input[0]}_w")
        graph.initializer.append(numpy_helper.from_array(stored, stem))
        scales = names.fresh(f"{stem}_scale")
        if matmul:
            graph.initializer.append(numpy_helper.from_array(scale.astype(dtype), scales))
            inputs = [stem, scales]
            if zero is not None and zero.any():
                inputs.append(names.fresh(f"{stem}_zero"))
                graph.initializer.append(numpy_helper.from_array(zero.astype(stored.dtype), inputs[-1]))
            nodes.append(helper.make_node("DequantizeLinear", inputs, list(node.output), axis=1))
            folded.append(node.input[0])
            continue
        graph.initializer.append(numpy_helper.from_array(scale.astype(np.float32).reshape(shape), scales))
        value = names.fresh(f"{stem}_f")
        nodes.append(helper.make_node("Cast", [stem], [value], to=TensorProto.FLOAT))
        if zero is not None and zero.any():
            zeros, shifted = names.fresh(f"{stem}_zero"), names.fresh(f"{stem}_s")
            graph.initializer.append(numpy_helper.from_array(zero.astype(np.float32).reshape(shape), zeros))
            nodes.append(helper.make_node("Sub", [value, zeros], [shifted]))
            value = shifted
        if dtype == np.float32:
            nodes.append(helper.make_node("Mul", [value, scales], list(node.output)))
        else:  # computed in float32, which ONNX Runtime folds (it has no float16 Sub on the CPU)
            nodes.append(helper.make_node("Mul", [value, scales], [names.fresh(f"{stem}_m")]))
            nodes.append(helper.make_node("Cast", [nodes[-1].output[0]], list(node.output),
                                          to=inits[node.input[1]].data_type))
        folded.append(node.input[0])
    if folded:
        replace_nodes(graph, nodes)  # the DequantizeLinears' own inputs go when nothing reads them
    return folded, requantized


def axis_shape(rank: int, axis: int) -> list[int]:
    """The shape that lays per-``axis`` values (scales, zero points) along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return shape


def _broadcast_shape(scale: tuple, stored: tuple, axis: int) -> tuple | None:
    """The shape ``scale`` takes to multiply a weight of shape ``stored`` elementwise, or None where it fits none."""
    rank = len(stored)
    if int(np.prod(scale)) == 1:
        return ()
    if len(scale) == 1 and rank and scale[0] == stored[axis % rank]:
        return tuple(scale[0] if i == axis % rank else 1 for i in range(rank))
    padded = tuple(scale) + (1,) * (rank - len(scale))  # over the leading axes
    return padded if len(scale) <= rank and all(s in (1, d) for s, d in zip(padded, stored)) else None


class _UniqueNames:
    """Tensor names not yet used anywhere in a model (its graphs and subgraphs)."""

    def __init__(self, model) -> None:
        self.used: set[str] = set()

        def visit(graph) -> None:
            self.used.update(i.name for i in graph.initializer)
            self.used.update(v.name for v in (*graph.input, *graph.output, *graph.value_info))
            for node in graph.node:
                self.used.update(node.output)
                for body in subgraphs(node):
                    visit(body)

        visit(model.graph)

    def fresh(self, name: str) -> str:
        candidate, count = name, 1
        while candidate in self.used:
            candidate, count = f"{name}{count}", count + 1
        self.used.add(candidate)
        return candidate


def _worth_storing(node, weight) -> bool:
    """A float weight whose int8 form, with its scales and the nodes that rebuild it, takes fewer bytes."""
    from onnx import TensorProto

    if weight.data_type != TensorProto.FLOAT or not weight.dims:
        return False
    size = int(np.prod(weight.dims))
    return 3 * size > 4 * weight.dims[weight_output_axis(node, len(weight.dims))] + NODE_BYTES


def _input_means(model, tensors: dict[str, int], samples: list[dict]) -> dict[str, np.ndarray]:
    """Each of ``tensors``' mean per channel (its value: the channel axis) over ``samples``, from the float model
    in ONNX Runtime."""
    sums: dict[str, np.ndarray] = {}
    for values in probe_tensors(model, list(tensors), samples):
        for name, value in values.items():
            channel = tensors[name] % value.ndim
            mean = value.astype(np.float64).mean(axis=tuple(i for i in range(value.ndim) if i != channel))
            sums[name] = sums.get(name, 0) + mean
    return {name: total / max(len(samples), 1) for name, total in sums.items()}


def _correct_bias(node, graph, inits: dict, readers: dict, error: np.ndarray, mean: np.ndarray,
                  names: _UniqueNames) -> None:
    """Subtract from ``node``'s bias the mean output shift its weight ``error`` causes on inputs of per-channel
    ``mean`` (a Conv without bias gets one; a bias other nodes read too, a Gemm with ``transA`` or ``beta`` other
    than 1, and MatMul, which has no bias, are left as they are)."""
    from onnx import helper, numpy_helper

    if node.op_type == "Conv":
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        per_group_in = error.shape[1]
        summed = error.reshape(error.shape[0], per_group_in, -1).sum(axis=2)  # [out, in per group]
        group_of_out = np.arange(error.shape[0]) // (error.shape[0] // groups)
        shift = (summed * mean.reshape(groups, per_group_in)[group_of_out]).sum(axis=1)
    else:  # Gemm: alpha * A @ B' + beta * C
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("transA", 0) or attributes.get("beta", 1.0) != 1.0:
            return
        shift = attributes.get("alpha", 1.0) * ((error if attributes.get("transB", 0) else error.T) @ mean)
    bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias_name is None:
        bias_name = names.fresh(f"{node.output[0]}_bias")
        graph.initializer.append(numpy_helper.from_array(np.zeros(shift.shape[0], np.float32), bias_name))
        inits[bias_name], readers[bias_name] = graph.initializer[-1], [node]
        if len(node.input) > 2:
            node.input[2] = bias_name
        else:
            node.input.append(bias_name)
    if bias_name not in inits or len(readers.get(bias_name, [])) != 1:
        return
    bias = numpy_helper.to_array(inits[bias_name]).astype(np.float64)
    if bias.shape != shift.shape:  # a broadcast Gemm bias
        return
    inits[bias_name].CopyFrom(numpy_helper.from_array((bias - shift).astype(np.float32), bias_name))
