"""The static rule that gives a CNN float compute with int8 weights where ONNX Runtime's int8 kernels cannot pay
(edgeopt.onnx_work), with real ONNX Runtime: its arithmetic counted from the graph, the same kind every run, and
int8 compute kept for nets whose activations fold into QLinearConv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.data import SampleSet
from edgeopt.onnx_work import FLOAT_COMPUTE_INTENSITY, work_of
from edgeopt.passes.onnx_int8 import BACKENDS, WEIGHTS_ONLY, quantize_onnx
from tests.ort_support import optimized_ops


def _mobile_block(activation: str):
    """A 3x3 Conv (3->16), a depthwise 3x3, a 1x1 (16->16), each followed by ``activation``, then a pooled Gemm
    (16->4) on 1x3x32x32: a MobileNetV3-like block, little arithmetic per activation element."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (16, 3, 3, 3), "dw": (16, 1, 3, 3), "pw": (16, 16, 1, 1), "fc": (4, 16)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node(activation, ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "dw"], ["c2"], name="dw", group=16, pads=[1] * 4),
             helper.make_node(activation, ["c2"], ["a2"]),
             helper.make_node("Conv", ["a2", "pw"], ["c3"], name="pw"),
             helper.make_node(activation, ["c3"], ["a3"]),
             helper.make_node("GlobalAveragePool", ["a3"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(1)
    return SampleSet([{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(8)], None, "test")


def test_arithmetic_per_activation_element_is_counted_from_the_graph(samples):
    counted = work_of(_mobile_block("HardSwish"), samples.samples[0])
    # Per output element: 3*3*3 MACs (conv1), 9 (depthwise), 16 (1x1), 16 (Gemm); elements read and written.
    macs = 16 * 32 * 32 * 27 + 16 * 32 * 32 * 9 + 16 * 32 * 32 * 16 + 4 * 16
    elements = (3 + 16) * 32 * 32 + 2 * (16 + 16) * 32 * 32 + 16 + 4
    assert (counted.compute_ops, counted.macs, counted.elements) == (4, macs, elements)
    assert counted.unfolded_activations == 3 and counted.activation_share == 0.75
    assert counted.intensity < FLOAT_COMPUTE_INTENSITY and counted.float_compute
    relu = work_of(_mobile_block("Relu"), samples.samples[0])
    assert relu.macs == macs and relu.unfolded_activations == 0 and not relu.float_compute  # Relu folds


def test_a_net_int8_kernels_cannot_pay_for_gets_int8_weights_and_float_compute(samples, tmp_path):
    result = quantize_onnx(_mobile_block("HardSwish"), samples, subset_size=8, nncf_options={})
    assert [c.backend for c in result.candidates] == [WEIGHTS_ONLY]  # decided before building: nothing raced
    described = result.describe()
    assert described["backend"] == WEIGHTS_ONLY and described["work"]["compute"] == "float"
    assert "float compute" in result.reason and "MACs per activation element" in result.reason
    assert 'onnx_backend = "ort"' in result.reason  # how to have int8 compute instead
    kinds = optimized_ops(result.model, tmp_path)
    assert "Conv" in kinds and not any(k.startswith("QLinear") for k in kinds)  # float kernels, weights folded
    int8 = [i for i in result.model.graph.initializer if i.data_type == TensorProto.INT8]
    assert sorted(tuple(i.dims) for i in int8) == [(4, 16), (16, 1, 3, 3), (16, 3, 3, 3), (16, 16, 1, 1)]


def test_folding_activations_keep_int8_compute_and_a_pin_overrides_the_rule(samples, tmp_path):
    relu = quantize_onnx(_mobile_block("Relu"), samples, subset_size=8, nncf_options={})
    assert [c.backend for c in relu.candidates] == list(BACKENDS)
    assert relu.describe()["work"]["compute"] == "int8" and relu.backend != WEIGHTS_ONLY
    pinned = quantize_onnx(_mobile_block("HardSwish"), samples, subset_size=8, nncf_options={}, backends=("ort",))
    assert pinned.backend == "ort" and pinned.work is None  # a pin builds what it names
    assert any(k.startswith("QLinear") for k in optimized_ops(pinned.model, tmp_path))


def test_a_weight_computed_in_the_graph_is_counted_by_its_probed_shape(samples):
    """A Conv whose weight comes out of another node (an Identity here; a DequantizeLinear or Cast in exports)
    sums over that weight's shape like an initializer's, and the weight is not an activation element."""
    model = _mobile_block("HardSwish")
    conv = next(n for n in model.graph.node if n.name == "conv1")
    model.graph.node.insert(0, helper.make_node("Identity", ["w1"], ["w1_copy"]))
    conv.input[1] = "w1_copy"
    assert work_of(model, samples.samples[0]) == work_of(_mobile_block("HardSwish"), samples.samples[0])
