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

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")  # ops whose constant input 1 is stored int8
BIASED_OPS = ("Conv", "Gemm")  # of those, the ones whose bias absorbs the rounding's mean shift
NODE_BYTES = 64  # about what the Cast and Mul that rebuild one weight add to the file


def symmetric_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` as symmetric int8 with one float32 scale per index of ``axis`` (max |w| / 127): (values,
    scales)."""
    reduce = tuple(i for i in range(weight.ndim) if i != axis)
    scale = np.maximum(np.abs(weight).max(axis=reduce), 1e-12).astype(np.float32) / 127.0
    shape = [1] * weight.ndim
    shape[axis] = -1
    return np.clip(np.rint(weight / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def weights_only(model, calibration: SampleSet, subset_size: int, ignored: list[str]):
    """A copy of ``model`` with the constant weight of each Conv/Gemm/MatMul (not in ``ignored``) stored as
    symmetric per-output-channel int8 behind ``Cast`` to float and ``Mul`` by its scales, activations float;
    each Conv's and Gemm's bias corrected for the mean shift its weight's rounding causes on the first
    ``subset_size`` calibration samples (:func:`_input_means`; NNCF's fast bias correction does the same for its
    int8 layers). Measured on PP-OCR's classifier (16 held-out crops): worst output's cosine to FP32 0.99983
    uncorrected, 0.99999 corrected (quantize_static's fully int8 graph 0.9999)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    skip = set(ignored)
    targets = {index for index, n in enumerate(graph.node) if n.op_type in WEIGHT_OPS and n.name not in skip
               and len(n.input) > 1 and n.input[1] in inits and _worth_storing(n, inits[n.input[1]])}
    if not targets:
        raise ValueError("no Conv/Gemm/MatMul weight whose int8 form makes the file smaller")
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    corrected = {graph.node[i].input[0]: (1 if graph.node[i].op_type == "Conv" else -1) for i in targets
                 if graph.node[i].op_type in BIASED_OPS}
    means = _input_means(model, corrected, calibration.samples[:subset_size])
    stored: dict[str, str] = {}  # float weight -> its float rebuilt from int8
    nodes = []
    for index, node in enumerate(graph.node):
        if index in targets:
            weight_name = node.input[1]
            weight = numpy_helper.to_array(inits[weight_name]).astype(np.float32)
            axis = _output_axis(node, weight.ndim)
            values, scale = symmetric_int8(weight, axis)
            shape = [1] * weight.ndim
            shape[axis] = -1
            scale = scale.reshape(shape)
            if node.input[0] in means:
                _correct_bias(node, graph, inits, readers, values * scale - weight, means[node.input[0]])
            if weight_name not in stored:  # short names and unnamed nodes: on a 0.5 MB model they are ~5% of it
                stored[weight_name] = f"{weight_name}_w"
                graph.initializer.extend([numpy_helper.from_array(values, f"{weight_name}_q"),
                                          numpy_helper.from_array(scale, f"{weight_name}_s")])
                nodes.append(helper.make_node("Cast", [f"{weight_name}_q"], [f"{weight_name}_f"],
                                              to=TensorProto.FLOAT))
                nodes.append(helper.make_node("Mul", [f"{weight_name}_f", f"{weight_name}_s"],
                                              [stored[weight_name]]))
            node.input[1] = stored[weight_name]
        nodes.append(node)
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    users = {name for node in graph.node for name in node.input}
    for name in stored:
        if name not in users:
            graph.initializer.remove(inits[name])
    del graph.value_info[:]  # the shapes normalisation inferred: runtimes infer them again, the file keeps less
    return model


def _worth_storing(node, weight) -> bool:
    """A float weight whose int8 form, with its scales and the nodes that rebuild it, takes fewer bytes."""
    from onnx import TensorProto

    if weight.data_type != TensorProto.FLOAT or not weight.dims:
        return False
    size = int(np.prod(weight.dims))
    return 3 * size > 4 * weight.dims[_output_axis(node, len(weight.dims))] + NODE_BYTES


def _output_axis(node, ndim: int) -> int:
    """The axis of a Conv/Gemm/MatMul weight that indexes output channels."""
    transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
    return 0 if node.op_type == "Conv" or transposed else ndim - 1


def _input_means(model, tensors: dict[str, int], samples: list[dict]) -> dict[str, np.ndarray]:
    """Each of ``tensors``' mean per channel (its value: the channel axis) over ``samples``, from the float model
    in ONNX Runtime."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    inputs = {i.name for i in model.graph.input}
    names = sorted(name for name in tensors if name not in inputs)  # graph inputs: read from the samples
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    del probe.graph.output[:]
    probe.graph.output.extend([helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = (ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
               if names else None)
    sums: dict[str, np.ndarray] = {}
    for sample in samples:
        values = session.run(names, {k: v for k, v in sample.items() if k in inputs}) if session else []
        for name, value in [*zip(names, values), *((n, np.asarray(sample[n])) for n in tensors if n in inputs)]:
            channel = tensors[name] % value.ndim
            mean = value.astype(np.float64).mean(axis=tuple(i for i in range(value.ndim) if i != channel))
            sums[name] = sums.get(name, 0) + mean
    return {name: total / max(len(samples), 1) for name, total in sums.items()}


def _correct_bias(node, graph, inits: dict, readers: dict, error: np.ndarray, mean: np.ndarray) -> None:
    """Subtract from ``node``'s bias the mean output shift its weight ``error`` causes on inputs of per-channel
    ``mean`` (a Conv without bias gets one; a bias other nodes read too, a Gemm that scales or transposes its
    input, and MatMul, which has no bias, are left as they are)."""
    from onnx import numpy_helper

    if node.op_type == "Conv":
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        per_group_in = error.shape[1]
        summed = error.reshape(error.shape[0], per_group_in, -1).sum(axis=2)  # [out, in per group]
        group_of_out = np.arange(error.shape[0]) // (error.shape[0] // groups)
        shift = (summed * mean.reshape(groups, per_group_in)[group_of_out]).sum(axis=1)
    elif node.op_type == "Gemm":
        attributes = {a.name: a for a in node.attribute}
        if ("transA" in attributes and attributes["transA"].i) or ("beta" in attributes and attributes["beta"].f != 1):
            return
        transposed = "transB" in attributes and attributes["transB"].i
        shift = (error if transposed else error.T) @ mean
    else:
        return
    bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias_name is None:
        bias_name = f"{node.input[1]}_bias_corrected"
        graph.initializer.append(numpy_helper.from_array(np.zeros(shift.shape[0], np.float32), bias_name))
        inits[bias_name] = graph.initializer[-1]
        readers[bias_name] = 1
        if len(node.input) > 2:
            node.input[2] = bias_name
        else:
            node.input.append(bias_name)
    if bias_name not in inits or readers.get(bias_name, 0) != 1:
        return
    bias = numpy_helper.to_array(inits[bias_name]).astype(np.float64)
    if bias.shape != shift.shape:  # a broadcast Gemm bias
        return
    inits[bias_name].CopyFrom(numpy_helper.from_array((bias - shift).astype(np.float32), bias_name))
