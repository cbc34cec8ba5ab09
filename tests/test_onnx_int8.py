"""The ONNX INT8 path on models as other toolkits export them, the FP32 comparison, and unsupported ops.

Fast subset of bench/conformance.py: a conv net exported at opset 11 with its weights as Constant nodes (as
Paddle2ONNX and old exporters write them), side by side with ONNX Runtime's quantize_static on the same file
and data; a model where INT8 loses to FP32 (flagged larger and slower); a custom op (exit 2, node and op named).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from edgeopt.onnx_prep import constants_to_initializers, normalise, unsupported_nodes


class ConvNet(nn.Module):
    """Conv-BN-ReLU blocks and a classifier on 3x32x32: weights dominate the file, as in real CNNs."""

    def __init__(self):
        super().__init__()
        layers, width = [], 3
        for out in (32, 64, 64, 128):
            layers += [nn.Conv2d(width, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(),
                       nn.MaxPool2d(2) if out != 64 else nn.Identity()]
            width = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def export_with_constants(module, example, path, opset: int) -> None:
    """Export at ``opset`` with a dynamic batch axis, then move every initializer into a Constant node."""
    with torch.no_grad():
        torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=opset, input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "batch"}})
    model = onnx.load(str(path))
    nodes = [helper.make_node("Constant", [], [init.name], value=init) for init in model.graph.initializer]
    del model.graph.initializer[:]
    nodes += list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def opset11_const(tmp_path_factory):
    torch.manual_seed(0)
    module = ConvNet().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, as a trained model has
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("opset11")
    path = folder / "convnet.onnx"
    export_with_constants(module, torch.zeros(1, 3, 32, 32), path, opset=11)
    rng = np.random.default_rng(0)
    calib, held = folder / "calib.npz", folder / "eval.npz"
    np.savez(calib, x=rng.standard_normal((48, 3, 32, 32)).astype(np.float32))
    np.savez(held, x=rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    return path, calib, held


def _run(path, feeds_list):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(None, feeds)[0] for feeds in feeds_list]


def _cosine(a, b) -> float:
    a, b = np.concatenate([x.ravel() for x in a]), np.concatenate([x.ravel() for x in b])
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_normalise_moves_constants_upgrades_opset_and_keeps_outputs(opset11_const, tmp_path):
    path, calib, _ = opset11_const
    original = onnx.load(str(path))
    assert not original.graph.initializer
    prepared = normalise(original)
    assert prepared.opset == 13 and prepared.model.graph.initializer
    assert not [n for n in prepared.model.graph.node if n.op_type in ("Constant", "BatchNormalization")]
    assert any("Constant node(s) moved" in step for step in prepared.steps)
    assert len(original.graph.node) > len(prepared.model.graph.node)  # the caller's model is untouched
    onnx.save(prepared.model, str(tmp_path / "n.onnx"))
    feeds = [{"x": x[None]} for x in np.load(calib)["x"][:4]]
    for got, want in zip(_run(tmp_path / "n.onnx", feeds), _run(path, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_constants_to_initializers_counts(opset11_const):
    model = onnx.load(str(opset11_const[0]))
    constants = sum(n.op_type == "Constant" for n in model.graph.node)
    assert constants_to_initializers(model) == constants
    assert not [n for n in model.graph.node if n.op_type == "Constant"]


def _ir_weight_scales(xml) -> set[str]:
    """How the INT8 IR scales its int8 weight constants (i8 Constant → Convert → Multiply by scale)."""
    import openvino as ov

    kinds = set()
    for op in ov.Core().read_model(str(xml)).get_ops():
        if op.get_type_name() != "Constant" or op.get_element_type().get_type_name() != "i8":
            continue
        for convert in (t.get_node() for t in op.output(0).get_target_inputs()):
            for mul in (t.get_node() for t in convert.output(0).get_target_inputs()):
                scales = [i.get_source_output().get_node() for i in mul.inputs()
                          if i.get_source_output().get_node().get_type_name() == "Constant"]
                if mul.get_type_name() == "Multiply" and scales:
                    kinds.add("per-channel" if max(list(scales[0].get_output_shape(0)) or [1]) > 1 else "per-tensor")
    return kinds


def _anchor(path, calib, out):
    """ONNX Runtime's quantize_static as a user would run it on this file (opset 13, per-channel QDQ)."""
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = version_converter.convert_version(onnx.load(str(path)), 13)
    upgraded = out.with_name("upgraded.onnx")
    onnx.save(model, str(upgraded))
    samples = iter({"x": x[None]} for x in np.load(calib)["x"])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(samples, None)

    quantize_static(str(upgraded), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def test_opset11_constant_weights_int8_onnx_shrinks_per_channel(opset11_const, tmp_path):
    from edgeopt.pipeline import compress

    path, calib, held = opset11_const
    result = compress(path, calib, out=tmp_path / "out", eval_data=held, quiet=True,
                      input_shapes={"x": (1, 3, 32, 32)})
    onnx_artifact = next(a for a in result.artifacts if a.format == "onnx")
    assert path.stat().st_size / onnx_artifact.bytes >= 3.0  # weights stored as int8 initializers
    int8 = onnx.load(str(onnx_artifact.path))
    inits = {i.name: i for i in int8.graph.initializer}
    weight_scales = [numpy_helper.to_array(inits[n.input[1]]) for n in int8.graph.node
                     if n.op_type == "DequantizeLinear" and n.input[0] in inits
                     and inits[n.input[0]].data_type == TensorProto.INT8 and len(inits[n.input[0]].dims) == 4]
    assert weight_scales and all(s.size > 1 for s in weight_scales)  # per-channel
    assert _ir_weight_scales(next(a for a in result.artifacts if a.format == "openvino").path) == {"per-channel"}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    decision = report["decisions"]["onnx_int8"]
    assert decision["backend"] in ("nncf", "ort")
    assert "opset 11 -> 13 (onnx.version_converter)" in decision["normalisation"]
    assert {c["backend"] for c in decision["candidates"]} == {"nncf", "ort"}
    assert set(report["vs_fp32"]) == {"openvino", "onnx"}
    # Fidelity at least the anchor's on the same file and data (no timing asserted here: that is the bench's).
    _anchor(path, calib, tmp_path / "anchor.onnx")
    feeds = [{"x": x[None]} for x in np.load(held)["x"]]
    reference = _run(path, feeds)
    ours, theirs = _cosine(_run(onnx_artifact.path, feeds), reference), _cosine(_run(tmp_path / "anchor.onnx", feeds),
                                                                                reference)
    assert ours >= theirs - 0.01, (ours, theirs)


@pytest.fixture(scope="module")
def int8_loses(tmp_path_factory):
    """A 1x1 conv with 2 channels on 2x64x64: its weights (16 bytes) cost less than INT8's scales and zero
    points, and quantizing and dequantizing 8192 activations costs far more than the float conv itself."""
    folder = tmp_path_factory.mktemp("loses")
    weight = numpy_helper.from_array(np.array([[[[0.5]], [[-0.25]]], [[[0.75]], [[1.0]]]], np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 64, 64])], [weight])
    path = folder / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    calib = folder / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((16, 2, 64, 64)).astype(np.float32))
    return path, calib


def test_int8_larger_and_slower_than_fp32_is_flagged(cli, int8_loses, tmp_path):
    path, calib = int8_loses
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", calib, "--out", out, "--format", "onnx")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    versus = report["vs_fp32"]["onnx"]
    assert versus["bytes"] > versus["fp32_bytes"] and versus["larger"]
    # Several times slower in ONNX Runtime (Q/DQ of every activation around a trivial conv): measured in paired
    # rounds, the whole interval on the p50 ratio lies above the threshold, whatever the host's load.
    low, high = versus["p50_ratio_interval"]
    assert versus["slower"] and 1.05 < low <= versus["p50_ratio"] <= high, versus
    assert report["flagged"]["onnx"] == ["larger than FP32", "slower than FP32"]
    assert "the onnx artifact is larger than FP32 and slower than FP32" in result.stderr  # the exit summary
    assert "FLAGGED: larger than FP32, slower than FP32" in result.stdout  # and the table


def test_paired_ratios_decide_by_measurement():
    """The sequential test on the p50 ratio: a candidate doing four times the work is measured slower; one doing
    a quarter of it is not; the interval is the median's order-statistics interval."""
    from edgeopt.vs_fp32 import median_interval, paired_ratios

    assert median_interval(range(1, 7)) == (1, 6)  # too few rounds for anything narrower at 90%
    assert median_interval(range(1, 21)) == (6, 15)  # P(Binomial(20, 1/2) <= 5) = 0.021 per side

    def work(times):  # single-threaded pure Python, so that the ratio is the work's, not a thread pool's
        return lambda: sum(range(5000 * times))

    _, _, ratios = paired_ratios(work(1), work(4))
    assert median_interval(ratios)[0] > 1.05
    _, _, ratios = paired_ratios(work(4), work(1))
    assert median_interval(ratios)[1] <= 1.05


def test_custom_op_is_one_line_exit_2_naming_node_and_op(cli, tmp_path):
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("FancyActivation", ["c"], ["y"], name="fancy_act_1", domain="com.example")], "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                      helper.make_opsetid("com.example", 1)]), str(path))
    assert unsupported_nodes(onnx.load(str(path))) == [("fancy_act_1", "com.example::FancyActivation")]
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((2, 3, 8, 8), np.float32))
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", calib, "--out", out)
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert "\n" not in message and "fancy_act_1" in message and "com.example::FancyActivation" in message
    assert not out.exists()


def test_optimize_never_picks_int8_slower_than_float():
    from edgeopt.optimization.candidate import Candidate, choose

    def measured(label, precision, p50, size):
        return Candidate(label, "stage", precision, label, eligible=True, file_bytes=size, gate_passed=True,
                         figures={"p50_ms": p50, "file_mb": size / 1e6}, validation={"latency_ms": {}})

    fp32, int8 = measured("fp32", "fp32", 1.0, 4_000_000), measured("int8", "int8", 1.4, 1_000_000)
    assert choose([fp32, int8], "file_mb") is fp32  # smaller, but slower than float: not chosen
    assert any("slower than float" in note for note in int8.notes)
    faster = measured("int8", "int8", 0.6, 1_000_000)
    assert choose([fp32, faster], "file_mb") is faster


def test_backend_choice_prefers_fusable_then_fidelity_then_size():
    from edgeopt.passes.onnx_int8 import Built, choose

    nncf = Built("nncf", model=object(), bytes=400, cosine=0.998, unfused=0.6)  # faithful, but runs unfused
    ort = Built("ort", model=object(), bytes=300, cosine=0.990, unfused=0.0)
    assert choose([nncf, ort]) is ort
    fused_nncf = Built("nncf", model=object(), bytes=400, cosine=0.998, unfused=0.0)
    worse = Built("ort", model=object(), bytes=300, cosine=0.95, unfused=0.0)
    assert choose([fused_nncf, worse]) is fused_nncf  # both fuse: fidelity first
    close = Built("ort", model=object(), bytes=300, cosine=0.995, unfused=0.0)
    assert choose([fused_nncf, close]) is close  # fidelity within 0.01: the smaller file


def test_unfused_share_of_nncf_graph_is_found(opset11_const):
    """NNCF quantizes op inputs only; where a Conv's output feeds a float op, ONNX Runtime cannot fuse it."""
    from edgeopt.passes.onnx_int8 import unfused_share

    model = onnx.load(str(opset11_const[0]))
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"]),
         helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"]),
         helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
         helper.make_node("Conv", ["x", "w"], ["c2"]), helper.make_node("Sigmoid", ["c2"], ["y"])],
        "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert model is not None and unfused_share(helper.make_model(graph)) == 0.5


def test_average_pool_wider_than_its_input_quantizes_faithfully():
    """``transformers``' EfficientNet pools with ``AvgPool2d(2560, ceil_mode=True)`` on 7x7: float ONNX Runtime
    clips the window, but quantized (``count_include_pad=1``, as torch exports it) it fuses into a
    QLinearAveragePool with a wrong output (cosine 0.000 measured on EfficientNet, 0.05 here). Normalisation reads it as the GlobalAveragePool it is, before either quantizer."""
    from edgeopt.data import SampleSet
    from edgeopt.passes.onnx_int8 import quantize_onnx, worst_output_cosine

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[64, 64], strides=[64, 64], ceil_mode=1,
                           count_include_pad=1),
         helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "fc", "b"], ["y"], transB=1)],
        "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32), "fc"),
         numpy_helper.from_array(np.zeros(10, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    samples = [{"x": rng.standard_normal((1, 3, 7, 7)).astype(np.float32)} for _ in range(24)]
    assert any("GlobalAveragePool" in step for step in normalise(model).steps)
    result = quantize_onnx(model, SampleSet(samples, None, "test"), subset_size=16, nncf_options={},
                           backends=("ort",))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    held = samples[16:]
    cosine = worst_output_cosine([got.run(None, s) for s in held], [want.run(None, s) for s in held])
    assert cosine >= 0.99
