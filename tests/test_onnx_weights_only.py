"""The ONNX candidate with int8 weights and float compute (edgeopt.passes.onnx_weights_only), with real ONNX
Runtime: the rebuilt weights fold when a session loads, bias correction cancels the rounding's mean shift, and the
choice takes the candidate only by decisive speed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.data import SampleSet
from edgeopt.passes.onnx_weights_only import fold_weight_dequantize, symmetric_int8, weights_only
from tests.ort_support import optimized_ops


def _conv_gemm(rng, bias: bool = True):
    """Two 3x3 Convs (the second depthwise, without bias), a 1x1 Conv and a Gemm on 1x8x16x16; inputs offset from
    zero so that weight rounding shifts the outputs' means."""
    shapes = {"c1": (16, 8, 3, 3), "c2": (16, 1, 3, 3), "c3": (32, 16, 1, 1), "fc": (10, 32)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in shapes.items()]
    inits += [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
              numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "bfc")]
    nodes = [helper.make_node("Conv", ["x", "c1", "b1"] if bias else ["x", "c1"], ["h1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Conv", ["r1", "c2"], ["h2"], name="dw", group=16, pads=[1] * 4),
             helper.make_node("Conv", ["h2", "c3"], ["h3"], name="pw"),
             helper.make_node("GlobalAveragePool", ["h3"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "bfc"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def net():
    rng = np.random.default_rng(0)
    samples = [{"x": (rng.standard_normal((1, 8, 16, 16)) + 1.5).astype(np.float32)} for _ in range(16)]
    return _conv_gemm(rng), SampleSet(samples, None, "test")


def _run(model, samples):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, s)[0] for s in samples])


def test_weights_are_stored_int8_and_folded_back_to_float_when_onnx_runtime_loads(net, tmp_path):
    model, calibration = net
    stored = weights_only(model, calibration, 16, [])
    inits = {i.name: i for i in stored.graph.initializer}
    kinds = [n.op_type for n in stored.graph.node]
    assert "DequantizeLinear" not in kinds and kinds.count("Cast") == 4  # four weights, each Cast and Mul
    for node in (n for n in stored.graph.node if n.op_type in ("Conv", "Gemm")):
        assert node.input[1] not in inits  # computed from the int8 initializer, not a float one
    int8 = [i for i in stored.graph.initializer if i.data_type == TensorProto.INT8]
    assert sorted(tuple(i.dims) for i in int8) == sorted([(16, 8, 3, 3), (16, 1, 3, 3), (32, 16, 1, 1), (10, 32)])
    # ONNX Runtime folds Cast and Mul of constants when the session loads: float Conv/Gemm on float weights, the
    # same ops as the FP32 model's optimised graph (a DequantizeLinear would stay and run on every call).
    kinds = {"stored": sorted(optimized_ops(stored, tmp_path)), "fp32": sorted(optimized_ops(model, tmp_path))}
    assert kinds["stored"] == kinds["fp32"] and "Cast" not in kinds["stored"]
    got, want = _run(stored, calibration.samples), _run(model, calibration.samples)
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > 0.9999
    assert len(stored.SerializeToString()) < 0.45 * len(model.SerializeToString())


def test_weight_dequantize_takes_the_form_onnx_runtime_runs_fastest(tmp_path):
    """``nncf.compress_weights`` writes int8 weights behind DequantizeLinear, which ONNX Runtime runs on every call
    (resnet_digits 1.11-1.29x FP32's p50) but for a MatMul's on axis 1, which it fuses into an 8-bit MatMulNBits
    (NNCF writes ``axis=-1``, which it does not); some scales its DequantizeLinear refuses (NNCF's ``[out, in]``
    for a Conv1d weight, ``[out, 1, 1]`` for a Conv2d one). Conv weights rebuilt in float, folded at load (a scale
    per ``(out, in)`` pair requantized per output channel); the MatMul's kept, on axis 1, fused; a weight in a QDQ
    group ONNX Runtime fuses (its Conv reads a dequantized activation and feeds a QuantizeLinear) left as it is."""
    rng = np.random.default_rng(0)
    conv1d = rng.integers(0, 256, (6, 4, 3)).astype(np.uint8)  # asymmetric, scale and zero point [out, in]
    scale1d, zero1d = rng.random((6, 4)).astype(np.float32) / 50, rng.integers(100, 156, (6, 4)).astype(np.uint8)
    conv2d = rng.integers(-127, 128, (5, 6, 3, 3)).astype(np.int8)  # symmetric, scale [out, 1, 1]
    scale2d = rng.random((5, 1, 1)).astype(np.float32) / 50
    fc = rng.integers(-127, 128, (5, 3)).astype(np.int8)  # per output column, as NNCF writes it: axis -1
    scalefc = rng.random(3).astype(np.float32) / 50
    arrays = {"w1": conv1d, "s1": scale1d, "z1": zero1d, "w2": conv2d, "s2": scale2d,
              "z2": np.zeros_like(scale2d, np.int8), "w3": fc, "s3": scalefc, "w4": conv1d.astype(np.int8) // 2,
              "s4": np.float32(0.01), "xs": np.float32(0.05), "xz": np.uint8(128)}
    nodes = [helper.make_node("DequantizeLinear", ["w1", "s1", "z1"], ["f1"]),
             helper.make_node("Conv", ["x", "f1"], ["h1"]),
             helper.make_node("Unsqueeze", ["h1", "axes"], ["u"]),
             helper.make_node("DequantizeLinear", ["w2", "s2", "z2"], ["f2"]),
             helper.make_node("Conv", ["u", "f2"], ["h2"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["h2"], ["p"], axes=[2, 3], keepdims=0),
             helper.make_node("DequantizeLinear", ["w3", "s3"], ["f3"], axis=-1),
             helper.make_node("MatMul", ["p", "f3"], ["y"]),
             helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),  # a QDQ Conv: ONNX Runtime's to fuse
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w4", "s4"], ["f4"]),
             helper.make_node("Conv", ["xd", "f4"], ["c4"]),
             helper.make_node("QuantizeLinear", ["c4", "xs", "xz"], ["q4"]),
             helper.make_node("DequantizeLinear", ["q4", "xs", "xz"], ["y4"])]
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items()]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axes"))
    graph = helper.make_graph(nodes, "w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3]),
                               helper.make_tensor_value_info("y4", TensorProto.FLOAT, [1, 6, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert fold_weight_dequantize(model) == (["w1", "w2", "w3"], ["w1"])
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert [producer[f].op_type for f in ("f1", "f2", "f3", "f4")] == ["Mul", "Mul", "DequantizeLinear",
                                                                        "DequantizeLinear"]
    assert {"w1", "s1", "z1", "s2", "z2", "w3", "s3"}.isdisjoint(inits) and {"w4", "s4"} <= set(inits)
    assert [inits[producer[f].input[1]].shape for f in ("f1", "f2")] == [(6, 1, 1), (5, 1, 1, 1)]
    dq = producer["f3"]
    assert inits[dq.input[1]].shape == (3,) and [a.i for a in dq.attribute if a.name == "axis"] == [1]
    x = rng.standard_normal((1, 4, 10)).astype(np.float32)
    w1 = (conv1d.astype(np.float32) - zero1d[..., None]) * scale1d[..., None]
    w2 = conv2d * scale2d[..., None]
    h1 = np.stack([sum(np.convolve(x[0, i], w1[o, i, ::-1], "valid") for i in range(4)) for o in range(6)])
    padded = np.pad(h1[:, None, :], ((0, 0), (1, 1), (1, 1)))  # the Unsqueeze, then the Conv's pads
    h2 = np.array([[[(padded[:, r:r + 3, c:c + 3] * w2[o]).sum() for c in range(8)] for r in range(1)]
                   for o in range(5)])
    want = h2.mean(axis=(1, 2)) @ (fc * scalefc)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0][0]
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) > 0.9999
    ran = optimized_ops(model, tmp_path)
    assert "MatMulNBits" in ran and "Cast" not in ran and "Sub" not in ran  # fused; the rest folded at load


@pytest.mark.parametrize("opset, readers, kept", [(13, 1, True), (13, 2, False), (11, 1, False)])
def test_a_matmul_weight_stays_dequantized_only_where_onnx_runtime_fuses_it(tmp_path, opset, readers, kept):
    """A weight two MatMuls share (an unrolled RNN's step) is not fused, and below opset 13 a per-axis
    DequantizeLinear does not load: those are folded to float at load, as any other; a second fold changes
    nothing."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (8, 8)).astype(np.int8), "w"),
             numpy_helper.from_array(np.full(8, 0.01, np.float32), "s")]
    dq = helper.make_node("DequantizeLinear", ["w", "s"], ["f"], **({"axis": 1} if opset >= 13 else {}))
    if opset < 13:
        inits[1] = numpy_helper.from_array(np.float32(0.01), "s")
    nodes = [dq] + [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", "f"], [f"y{i}"])
                    for i in range(readers)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(f"y{readers - 1}", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    x = rng.standard_normal((1, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fold_weight_dequantize(model)
    assert ("DequantizeLinear" in [n.op_type for n in model.graph.node]) is kept
    assert fold_weight_dequantize(model) == ([], [])  # already in its form
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())  # fused: int8 activation blocks
    ran = optimized_ops(model, tmp_path)
    assert ("MatMulNBits" in ran) is kept and "DequantizeLinear" not in ran and "Cast" not in ran


def test_bias_correction_cancels_the_mean_shift_of_rounding(net):
    """One layer stored int8 at a time: on the calibration samples its mean output error is the rounding's shift
    minus the estimate, zero (to float rounding) for the unpadded 1x1 Conv and the Gemm, whose outputs are linear
    in their input's mean; uncorrected int8 weights shift them by ``naive``."""
    model, calibration = net
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    layers = {"pw": ("h2", "h3", "c3"), "fc": ("f", "y", "fc")}  # node: input, output, weight
    names = [n.name for n in model.graph.node if n.name]
    for node, (source, output, weight) in layers.items():
        stored = weights_only(model, calibration, 16, [n for n in names if n != node])
        probed = []
        for m in (model, stored):
            m = onnx.ModelProto.FromString(m.SerializeToString())
            m.graph.output.extend([helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in (source, output)])
            probed.append(ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]))
        inputs, errors = [], []
        for sample in calibration.samples:
            x, want = probed[0].run([source, output], sample)
            errors.append(probed[1].run([output], sample)[0] - want)
            inputs.append(x)
        channel_means = lambda arrays: np.mean([a.mean(axis=tuple(i for i in range(a.ndim) if i != 1))  # noqa
                                                for a in arrays], axis=0)
        w = inits[weight].reshape(inits[weight].shape[0], -1)
        values, scale = symmetric_int8(w, 0)
        naive = (values * scale[:, None] - w) @ channel_means(inputs)
        shift = channel_means(errors)
        assert np.abs(naive).max() > 1e-4 and np.abs(shift).max() < 0.02 * np.abs(naive).max(), (node, shift, naive)


def test_a_conv_without_bias_gets_one_and_weights_too_small_to_pay_stay_float():
    rng = np.random.default_rng(1)
    model = _conv_gemm(rng, bias=False)
    samples = SampleSet([{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(4)], None, "t")
    stored = weights_only(model, samples, 4, ["fc"])  # an ignored node keeps its weight
    nodes = {n.name: n for n in stored.graph.node if n.name}
    assert len(nodes["conv1"].input) == 3 and nodes["fc"].input[1] == "fc"
    tiny = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")]))
    with pytest.raises(ValueError, match="none shrinks the file"):  # 16 bytes: int8, scales and nodes cost more
        weights_only(tiny, samples, 4, [])


def test_weights_only_wins_only_by_decisive_speed_and_never_sets_the_fidelity_bar():
    """Near-lossless by construction, the float-compute candidate would otherwise push every int8-compute one out
    of the fidelity tolerance: it is judged against their best, never the rule's pick, and chosen only when
    decisively faster (PP-OCR's classifier: 0.44x of quantize_static's graph)."""
    from edgeopt.passes.onnx_int8 import WEIGHTS_ONLY, Built, choose, contenders, pick

    def built(vs_rule):
        candidates = [Built("nncf", model=object(), cosine=0.962, unfused=0.0),
                      Built("ort", model=object(), cosine=0.958, unfused=0.0),
                      Built(WEIGHTS_ONLY, model=object(), cosine=0.99999, unfused=0.0, vs_rule=vs_rule)]
        for b in contenders(candidates):
            b.contender = True
        return candidates

    tie = built((0.95, 0.91, 0.99))
    assert all(b.contender for b in tie)  # the int8-compute candidates still contend
    rule = choose(tie)
    assert rule.backend == "ort" and pick(tie, rule)[0] is rule
    quicker = built((0.44, 0.41, 0.47))
    chosen, reason = pick(quicker, choose(quicker))
    assert chosen.backend == WEIGHTS_ONLY and "float compute" in reason and f'"{WEIGHTS_ONLY}" pins it' in reason
    alone = [Built(WEIGHTS_ONLY, model=object(), cosine=0.9999, unfused=0.0)]
    assert choose(alone).backend == WEIGHTS_ONLY  # pinned: the only candidate
    worse = built(None)
    worse[2].cosine = 0.90  # below the int8-compute candidates' tolerance: out
    assert WEIGHTS_ONLY not in {b.backend for b in contenders(worse)}


def _model(nodes, inits, inputs=(("x", [1, 8, 6, 6]),), outputs=(("y", [1, 8, 6, 6]),), ir=None):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    if ir is not None:
        model.ir_version = ir
    return model


def test_shared_weights_colliding_names_and_weights_read_elsewhere():
    """A weight two bias-less Convs share is stored once and each Conv gets a bias of its own; new names never
    collide with existing ones; a weight a subgraph, an ignored node or the graph's inputs also read stays float
    (an IR 3 file lists every weight as an input: normalise drops those, and the weights are constants again)."""
    from edgeopt.onnx_prep import normalise

    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "W")
    taken = numpy_helper.from_array(np.ones(1, np.float32), "W_w")  # what the rebuilt weight would be called
    shared = _model([helper.make_node("Conv", ["x", "W"], ["a"], name="first", pads=[1] * 4),
                     helper.make_node("Conv", ["a", "W"], ["b"], name="second", pads=[1] * 4),
                     helper.make_node("Mul", ["b", "W_w"], ["y"])], [weight, taken])
    samples = SampleSet([{"x": (rng.standard_normal((1, 8, 6, 6)) + 1).astype(np.float32)} for _ in range(4)],
                        None, "t")
    stored = weights_only(shared, samples, 4, [])
    onnx.checker.check_model(stored)  # unique names, every input defined
    convs = [n for n in stored.graph.node if n.op_type == "Conv"]
    assert convs[0].input[1] == convs[1].input[1] != "W_w" and convs[0].input[2] != convs[1].input[2]
    assert [n.op_type for n in stored.graph.node].count("Cast") == 1
    got, want = _run(stored, samples.samples), _run(shared, samples.samples)
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999
    with pytest.raises(ValueError, match="read elsewhere"):
        weights_only(shared, samples, 4, ["second"])  # one reader ignored: the weight stays float
    legacy = _model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1] * 4)], [weight],
                    inputs=(("x", [1, 8, 6, 6]), ("W", [8, 8, 3, 3])), ir=3)
    with pytest.raises(ValueError, match="read elsewhere"):
        weights_only(legacy, samples, 4, [])
    normalised = normalise(legacy).model
    assert [i.name for i in normalised.graph.input] == ["x"]
    assert any(i.data_type == TensorProto.INT8 for i in weights_only(normalised, samples, 4, []).graph.initializer)


def test_gemm_alpha_scales_the_correction():
    rng = np.random.default_rng(4)
    weight = numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.3).astype(np.float32), "fc")
    bias = numpy_helper.from_array(np.zeros(32, np.float32), "b")
    model = _model([helper.make_node("Gemm", ["x", "fc", "b"], ["y"], alpha=0.05)], [weight, bias],
                   inputs=(("x", [1, 64]),), outputs=(("y", [1, 32]),))
    samples = [{"x": (rng.standard_normal((1, 64)) + 2).astype(np.float32)} for _ in range(8)]
    stored = weights_only(model, SampleSet(samples, None, "t"), 8, [])
    error = np.mean([a - b for a, b in zip(_run(stored, samples), _run(model, samples))], axis=0)
    values, scale = symmetric_int8(numpy_helper.to_array(weight), 1)
    naive = 0.05 * np.mean([s["x"][0] for s in samples], axis=0) @ (values * scale - numpy_helper.to_array(weight))
    assert np.abs(error).max() < 0.02 * np.abs(naive).max()


def test_the_gate_floor_binds_weights_only_too_and_the_reason_names_it_where_it_alone_reaches_the_gate():
    from edgeopt.passes.onnx_int8 import WEIGHTS_ONLY, Built, choose, contenders, pick, weights_only_rescue

    def built(wo_cosine, conv_cosine=0.995):
        candidates = [Built("ort", model=object(), bytes=100, cosine=0.96, unfused=0.0),
                      Built("ort-conv", model=object(), bytes=104, cosine=conv_cosine, unfused=0.5),
                      Built(WEIGHTS_ONLY, model=object(), bytes=105, cosine=wo_cosine, unfused=0.0,
                            vs_rule=(0.6, 0.55, 0.65), p50_ratio=0.7)]
        for b in contenders(candidates, 0.99):
            b.contender = True
        return candidates

    below = built(0.986)  # faster, but under the gate that ort-conv reaches: out
    assert not below[2].contender and pick(below, choose(below, 0.99), 0.99)[0].backend == "ort-conv"
    above = built(0.9999)
    assert pick(above, choose(above, 0.99), 0.99)[0].backend == WEIGHTS_ONLY
    none = built(0.9999, conv_cosine=0.97)  # no int8-compute candidate reaches the gate
    none[2].vs_rule = (0.97, 0.93, 1.01)  # not decisively faster: the rule's pick stays, and the reason says
    chosen, reason = pick(none, choose(none, 0.99), 0.99)
    assert chosen.backend != WEIGHTS_ONLY and f'misses the quality gate\'s cosine 0.99, which {WEIGHTS_ONLY}' in reason
    assert f'onnx_backend = "{WEIGHTS_ONLY}" pins it' in reason
    none[2].p50_ratio_interval = (0.65, 0.8)  # not slower than FP32: quantize_onnx takes it as the rescue
    assert weights_only_rescue(none, chosen, 0.99) is none[2]
    none[2].p50_ratio_interval = (1.05, 1.2)  # a tie with FP32 (it computes as FP32 does): still the rescue
    assert weights_only_rescue(none, chosen, 0.99) is none[2]
    none[2].p50_ratio_interval = (1.15, 1.3)  # decisively slower than FP32: the hint only
    assert weights_only_rescue(none, chosen, 0.99) is None
    assert weights_only_rescue(none, chosen, None) is None and weights_only_rescue(above, above[1], 0.99) is None


@pytest.mark.parametrize("groups, out", [(8, 8), (8, 16), (2, 8)])  # depthwise, channel multiplier 2, two groups
def test_grouped_conv_correction_matches_the_mean_shift(groups, out):
    rng = np.random.default_rng(groups + out)
    weight = (rng.standard_normal((out, 8 // groups, 3, 3)) * 0.3).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "W"], ["y"], group=groups)],
                   [numpy_helper.from_array(weight, "W")], outputs=(("y", [1, out, 4, 4]),))
    samples = [{"x": (rng.standard_normal((1, 8, 6, 6)) + np.arange(8).reshape(1, 8, 1, 1)).astype(np.float32)}
               for _ in range(8)]
    stored = weights_only(model, SampleSet(samples, None, "t"), 8, [])
    got, want = _run(stored, samples), _run(model, samples)
    shift = (got - want).mean(axis=(0, 2, 3))
    values, scale = symmetric_int8(weight, 0)
    error = (values * scale[:, None, None, None] - weight).sum(axis=(2, 3))  # [out, in per group]
    means = np.mean([s["x"][0, :, 1:5, 1:5].mean(axis=(1, 2)) for s in samples], axis=0)  # what y's windows see
    naive = (error * means.reshape(groups, -1)[np.arange(out) // (out // groups)]).sum(axis=1)
    assert np.abs(naive).max() > 1e-3 and np.abs(shift).max() < 0.25 * np.abs(naive).max(), (shift, naive)


def test_weights_only_is_measured_when_every_int8_file_misses_the_gate(cli, tiny_onnx, tmp_path):
    """Where every int8-compute candidate misses the gate's cosine, weights-only is built too: reaching the gate
    and not slower than FP32 it is the rescue (the fastest file that passes, not one that fails), else the exit
    names it and how to pin it. It is not built where some int8 file reaches the gate."""
    import json

    data = tmp_path / "d.npz"
    np.savez(data, input=np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32))
    for floor, out in (("0.99", tmp_path / "loose"), ("0.99998", tmp_path / "tight")):
        result = cli("compress", tiny_onnx, "--calib", data, "--eval", data, "--format", "onnx", "--min-cosine",
                     floor, "--out", out)
        decided = json.loads((out / "report.json").read_text())["decisions"]["onnx_int8"]
        cosines = {c["backend"]: c["min_output_cosine"] for c in decided["candidates"]}
        int8 = [c for backend, c in cosines.items() if backend != "weights-only"]
        if min(max(int8), 1.0) >= float(floor):
            assert "weights-only" not in cosines, cosines
            continue
        assert "weights-only" in cosines, cosines  # built to measure it
        if result.exit_code == 3:
            assert decided["rescue"] is not None and 'onnx_backend = "weights-only" pins it' in result.output
        else:
            assert result.exit_code == 0 and decided["backend"] == "weights-only", result.output
            assert decided["chosen_by"] in ("rescue", "speed") and decided["rescue"] is None


def test_a_pinned_backend_is_kept_when_weights_only_would_rescue_the_gate(cli, tiny_onnx, tmp_path):
    """A recipe that names a backend gets that backend: where it misses the gate, weights-only is measured for the
    exit's hint, never swapped in by speed."""
    import json

    data = tmp_path / "d.npz"
    np.savez(data, input=np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32))
    recipe = tmp_path / "ort.toml"
    recipe.write_text('[[step]]\nname = "int8"\nonnx_backend = "ort"\n')
    out = tmp_path / "out"
    result = cli("compress", tiny_onnx, "--calib", data, "--eval", data, "--format", "onnx", "--min-cosine",
                 "0.99998", "--recipe", recipe, "--out", out)
    decided = json.loads((out / "report.json").read_text())["decisions"]["onnx_int8"]
    assert decided["backend"] == "ort", decided
    wo = [c for c in decided["candidates"] if c["backend"] == "weights-only"]
    assert not wo or (not wo[0]["contender"] and (result.exit_code == 0 or decided["rescue"] is not None))


def test_weights_only_rescues_a_gate_every_int8_compute_file_misses():
    """An outlier channel the output never reads (its weights row 0) sets the per-tensor input scale, so int8
    activations round every other value to 0: each int8-compute candidate misses the gate's cosine, weights-only
    (float activations) reaches it and, computing as FP32 does, is chosen as the rescue, and the report says so."""
    from edgeopt.data import SampleSet
    from edgeopt.passes.onnx_int8 import WEIGHTS_ONLY, quantize_onnx

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((512, 512)).astype(np.float32) / 20
    weight[0] = 0.0  # the outlier channel does not reach the output
    model = _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [numpy_helper.from_array(weight, "W")],
                   inputs=(("x", [1, 512]),), outputs=(("y", [1, 512]),))

    def samples(count: int) -> list[dict]:
        rows = rng.standard_normal((count, 1, 512)).astype(np.float32)
        rows[:, 0, 0] = 1e4
        return [{"x": row} for row in rows]

    calibration, held_out = SampleSet(samples(32), None, "calibration"), SampleSet(samples(16), None, "evaluation")
    result = quantize_onnx(model, calibration, subset_size=32, nncf_options={}, held_out=held_out, cosine_floor=0.99)
    decided = result.describe()
    computed = [c for c in result.candidates if c.backend != WEIGHTS_ONLY and c.cosine is not None]
    assert computed and all(c.cosine < 0.9 for c in computed), [(c.backend, c.cosine) for c in computed]
    assert result.backend == WEIGHTS_ONLY and decided["chosen_by"] == "rescue" and decided["rescue"] is None
    assert "as a rescue" in decided["reason"] and "pins int8 compute" in decided["reason"]
    # a gate judging by a task metric or labels: weights-only is measured for the exit's hint, never chosen
    hinted = quantize_onnx(model, calibration, subset_size=32, nncf_options={}, held_out=held_out, hint_floor=0.99)
    rescue = hinted.describe()["rescue"]
    assert hinted.backend != WEIGHTS_ONLY and hinted.describe()["chosen_by"] != "rescue"
    assert rescue["backend"] == WEIGHTS_ONLY and rescue["cosine"] > 0.99 and rescue["p50_ratio"] > 0
    assert not next(c for c in hinted.candidates if c.backend == WEIGHTS_ONLY).contender
