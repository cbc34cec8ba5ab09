"""The element-wise simplifications of edgeopt.onnx_prep.normalise on a PP-LCNetV3-style block (PP-OCRv4's
backbone, as Paddle2ONNX writes it at opset 12): Convs followed by a learnable affine (scalar Mul, Add) and a
hard-swish spelled out as ``x * clip(x + 3, 0, 6) / 6``. Same values, fewer ops, and the difference shows in what
ONNX Runtime runs of the INT8 graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from edgeopt.onnx_prep import fold_conv_affine, fold_input_affine, hard_swishes, normalise
from tests.ort_support import optimized_ops


class Affine(nn.Module):
    """PP-LCNetV3's learnable affine block: one scale and one shift for the whole tensor."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.tensor([scale])), nn.Parameter(torch.tensor([shift]))

    def forward(self, x):
        return self.scale * x + self.shift


class SpelledHardSwish(nn.Module):
    def forward(self, x):
        return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


class LcNetBlock(nn.Module):
    """Depthwise then pointwise Conv, each with an affine block, a hard-swish and the activation's affine block
    (which the next Conv reads: the pointwise one without padding, the next block's depthwise one padded)."""

    def __init__(self, channels: int, index: int):
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pw = nn.Conv2d(channels, channels, 1)
        self.lab1, self.lab2 = Affine(0.8 + 0.15 * index, 0.5), Affine(1.2, 0.3 * index - 0.2)
        self.act_lab1, self.act_lab2 = Affine(1.3, 0.1 + index), Affine(0.7, -0.4)
        self.act = SpelledHardSwish()

    def forward(self, x):
        x = self.act_lab1(self.act(self.lab1(self.dw(x))))
        return self.act_lab2(self.act(self.lab2(self.pw(x))))


@pytest.fixture(scope="module")
def lcnet(tmp_path_factory):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), Affine(1.1, 0.2), SpelledHardSwish(),
                           *[LcNetBlock(32, i) for i in range(3)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(32, 10)).eval()
    path = tmp_path_factory.mktemp("lcnet") / "lcnet.onnx"
    with torch.no_grad():
        torch.onnx.export(module, (torch.zeros(1, 3, 48, 48),), str(path), dynamo=False, opset_version=12,
                          input_names=["x"], output_names=["logits"])
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 3, 48, 48)).astype(np.float32)} for _ in range(16)]
    return onnx.load(str(path)), samples


def _outputs(model, samples) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, s)[0] for s in samples]


def test_affine_blocks_fold_into_convs_and_hard_swishes_shrink_with_the_same_values(lcnet):
    original, samples = lcnet
    kinds = [n.op_type for n in original.graph.node]
    assert kinds.count("Clip") == 7 and kinds.count("Div") == 7  # the exporter spelled out every hard-swish
    prepared = normalise(original)
    kinds = [n.op_type for n in prepared.model.graph.node]
    assert "14 constant Mul/Add after a Conv folded into its weights and bias" in prepared.steps
    assert "6 constant scalar Mul/Add before unpadded Convs folded into them" in prepared.steps  # the pointwise
    assert "opset 13 -> 14 (onnx.version_converter) for HardSwish" in prepared.steps
    assert "7 hard-swish(es) written as HardSwish" in prepared.steps
    assert "Clip" not in kinds and "Div" not in kinds and kinds.count("HardSwish") == 7
    # left: the activation affine blocks read by padded Convs or the pool
    assert kinds.count("Mul") == 3 and kinds.count("Add") == 3
    onnx.checker.check_model(prepared.model)
    for got, want in zip(_outputs(prepared.model, samples), _outputs(original, samples)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_quantized_simplified_graph_runs_fewer_ops_in_onnx_runtime(lcnet, tmp_path):
    """quantize_static's recipe on the simplified graph: ONNX Runtime runs every Conv as QLinearConv and no
    QLinearAdd, Div or Clip is left of the affine blocks and hard-swishes but the three affine blocks ahead of a
    padded Conv or the pool (on the graph as exported it runs a
    QLinearAdd per affine shift and per ``x + 3``, and a float Div between QDQ pairs per hard-swish)."""
    from edgeopt.data import SampleSet
    from edgeopt.passes.onnx_int8 import _ort

    original, samples = lcnet
    calibration = SampleSet(samples, None, "test")
    upgraded = onnx.version_converter.convert_version(original, 13)
    before = optimized_ops(_ort(upgraded, calibration, 16, []), tmp_path)
    after = optimized_ops(_ort(normalise(original).model, calibration, 16, []), tmp_path)
    assert after.count("QLinearConv") == before.count("QLinearConv") == 7
    assert before.count("QLinearAdd") >= 20 and before.count("Div") == 7 and after.count("QLinearAdd") == 3
    assert not {"Div", "Clip", "Add"} & set(after)
    # quantize_static leaves HardSwish float between a DequantizeLinear and a QuantizeLinear, and ONNX Runtime
    # runs it as its function body (HardSigmoid, Mul) in float: no QLinearMul on a quantized gate; the graph is
    # still 20+ ops shorter
    assert after.count("HardSigmoid") == after.count("Mul") == 7, after
    assert len(after) < len(before) - 20, (len(after), len(before))

def test_constants_that_do_not_broadcast_per_channel_or_shared_outputs_stay():
    """A Mul by a constant that varies along the width, and a Conv whose output two nodes read, are left alone;
    a per-channel shift of shape [1, C, 1, 1] folds."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    width = numpy_helper.from_array(rng.standard_normal((1, 1, 1, 5)).astype(np.float32), "width")
    shift = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "shift")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "width"], ["y"]),
             helper.make_node("Conv", ["x", "w"], ["b"]), helper.make_node("Add", ["b", "shift"], ["z"]),
             helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "shift"], ["u"]),
             helper.make_node("Relu", ["c"], ["v"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yzuv"],
                              [weight, width, shift])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = [{"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)}]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds[0])
    assert fold_conv_affine(model) == 1 and hard_swishes(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Conv", "Mul", "Conv", "Conv", "Add", "Relu"]
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tensors_a_subgraph_reads_are_kept():
    """A Conv output that an ``If`` body reads from the outer scope keeps its Mul (the body still finds it)."""
    weight = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    two = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    cond = numpy_helper.from_array(np.array(True), "cond")
    branch = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "two"], ["y"]),
             helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"],
                              [weight, two, cond])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert fold_conv_affine(model) == 0 and fold_input_affine(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Conv", "Mul", "If"]


@pytest.mark.parametrize("opset, ops", [(13, ["HardSigmoid", "Mul"]), (14, ["HardSwish"])])
def test_hard_swish_is_one_op_from_opset_14_and_two_below(opset, ops):
    """``x * clip(x + 3, 0, 6) / 6`` (and ``x * clip(x + 3, 0, 6) * (1/6)``) → HardSwish, or x * HardSigmoid(x)
    where the opset has no HardSwish; the same values."""
    constants = [numpy_helper.from_array(np.array(v, np.float32), n)
                 for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("sixth", 1.0 / 6.0))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"]),
             helper.make_node("Add", ["three", "y"], ["b"]), helper.make_node("Clip", ["b", "zero", "six"], ["d"]),
             helper.make_node("Mul", ["d", "sixth"], ["e"]), helper.make_node("Mul", ["e", "y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 50])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"x": np.linspace(-8, 8, 100, dtype=np.float32).reshape(2, 50)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert hard_swishes(model) == 2
    assert [n.op_type for n in model.graph.node] == ops + ops
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class SamePadded(nn.Module):
    """"Same" padding of stride-2 layers as transformers' EfficientNet exports it: ``ZeroPad2d`` then a Conv
    with ``padding="valid"`` (auto_pad VALID in the graph), one with its own padding too, and an average pool
    that counts the padding; a MaxPool's zero Pad stays (its own pads are -inf, not zeros)."""

    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.conv = nn.Conv2d(4, 8, 3, stride=2, padding="valid")
        self.padded = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(self.pad(x))
        x = self.padded(nn.functional.pad(x, (1, 1, 0, 2)))
        x = nn.functional.avg_pool2d(nn.functional.pad(x, (1, 1, 1, 1)), 3, stride=1)
        return nn.functional.max_pool2d(nn.functional.pad(x, (1, 0, 1, 0)), 2)


@pytest.mark.parametrize("opset", [11, 17])
def test_zero_pads_fold_into_the_conv_or_average_pool_after_them(opset, tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "padded.onnx"
    with torch.no_grad():
        torch.onnx.export(SamePadded().eval(), (torch.zeros(1, 4, 15, 15),), str(path), dynamo=False,
                          opset_version=opset, input_names=["x"])
    original = onnx.load(str(path))
    assert [n.op_type for n in original.graph.node].count("Pad") == 4
    result = normalise(original)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Pad") == 1 and "3 zero Pad(s) folded into the Conv or pool after them" in result.steps
    pads = {n.op_type + str(i): [a for a in n.attribute if a.name in ("pads", "auto_pad")]
            for i, n in enumerate(result.model.graph.node) if n.op_type in ("Conv", "AveragePool")}
    assert all(len(attrs) == 1 and attrs[0].name == "pads" for attrs in pads.values()), pads
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 4, 15, 15)).astype(np.float32)} for i in range(3)]
    for got, want in zip(_outputs(result.model, samples), _outputs(original, samples)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class Crepe(nn.Module):
    """CREPE's layers (torchcrepe): "same" zero Pads of 31/32 rows before 64x1 Convs on a 1024-sample frame. Folded
    into the Convs, ONNX Runtime ran the trained model 3.7x slower (its float Conv leaves the fast path)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(1, 32, (512, 1), stride=(4, 1))
        self.convs = nn.ModuleList(nn.Conv2d(32, 32, (64, 1)) for _ in range(3))

    def forward(self, x):
        x = torch.relu(self.first(nn.functional.pad(x[:, None, :, None], (0, 0, 254, 254))))
        for conv in self.convs:
            x = torch.relu(conv(nn.functional.pad(x, (0, 0, 31, 32))))
        return x.flatten(1)


def test_zero_pads_stay_where_folding_them_slows_onnx_runtime(tmp_path):
    """With a sample to time on, normalise keeps the fold only where ONNX Runtime does not run the folded graph
    slower (paired rounds); either way the steps say which, with the measured ratio when the Pads stay."""
    torch.manual_seed(0)
    path = tmp_path / "crepe.onnx"
    with torch.no_grad():
        torch.onnx.export(Crepe().eval(), (torch.zeros(1, 1024),), str(path), dynamo=False, opset_version=13,
                          input_names=["input"])
    original = onnx.load(str(path))
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32)}
    result = normalise(original, feeds=feeds)
    pads = [n.op_type for n in result.model.graph.node].count("Pad")
    kept = [s for s in result.steps if s.startswith("4 zero Pad(s) kept")]
    assert (pads, len(kept)) in ((4, 1), (0, 0)), result.steps
    assert not kept or float(kept[0].rsplit("interval ", 1)[1].split("-")[0]) >= 1.05  # decisively slower
    assert kept or "4 zero Pad(s) folded into the Conv or pool after them" in result.steps
    np.testing.assert_allclose(_outputs(result.model, [feeds])[0], _outputs(original, [feeds])[0], rtol=1e-4,
                               atol=1e-4)
    assert [n.op_type for n in normalise(original).model.graph.node].count("Pad") == 0  # no sample: folded


def test_normalised_graph_declares_only_the_opsets_it_uses_or_the_source_did():
    """ONNX Runtime's optimiser writes every domain it knows into the file (9 on openWakeWord's embedding model:
    ai.onnx.training, com.microsoft.nchwc, org.pytorch.aten, ...); the normalised graph keeps the source's own
    declarations and what its nodes use."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4), helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 3)])
    normalised = normalise(model).model
    assert sorted(opset.domain for opset in normalised.opset_import) == ["", "ai.onnx.ml"]
    assert ort.InferenceSession(normalised.SerializeToString(), providers=["CPUExecutionProvider"])
