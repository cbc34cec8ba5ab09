"""The ONNX INT8 path on a transformer: ONNX Runtime's candidate is its dynamic quantization.

A small BERT-like encoder (token embedding Gather, LayerNorm, attention with an additive padding mask built from
``torch.finfo.min``, Softmax, GELU FFN whose intermediate units include outlier neurons, as trained BERTs have),
exported by torch at opset 17 and calibrated with padded masks.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from ort_support import optimized_ops
from torch import nn

from edgeopt.data import SampleSet
from edgeopt.model_type import ffn_down_projections
from edgeopt.onnx_prep import normalise
from edgeopt.passes.onnx_int8 import gemm_as_matmul, quantize_onnx, unfused_share

LENGTH, VOCAB = 16, 200


class Layer(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, inner: int = 256):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, inner), nn.Linear(inner, width)

    def forward(self, x, mask_bias):
        b, t, d = x.shape

        def split(y):
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / (d // self.heads) ** 0.5 + mask_bias
        context = (scores.softmax(-1) @ split(self.v(x))).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.o(context))
        return self.ln2(x + self.down(nn.functional.gelu(self.up(x))))


class Encoder(nn.Module):
    def __init__(self, width: int = 64, layers: int = 2):
        super().__init__()
        self.tokens, self.ln = nn.Embedding(VOCAB, width), nn.LayerNorm(width)
        self.positions = nn.Parameter(torch.randn(1, LENGTH, width) * 0.1)
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))

    def forward(self, input_ids, attention_mask):
        x = self.ln(self.tokens(input_ids) + self.positions)
        mask_bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


def _samples(count: int, rng) -> list[dict]:
    samples = []
    for _ in range(count):
        mask = np.ones((1, LENGTH), np.int64)
        mask[0, rng.integers(6, LENGTH):] = 0  # padded sentences
        samples.append({"input_ids": rng.integers(0, VOCAB, (1, LENGTH)).astype(np.int64), "attention_mask": mask})
    return samples


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    torch.manual_seed(0)
    module = Encoder().eval()
    with torch.no_grad():  # outlier neurons in the FFN's intermediate units
        for layer in module.layers:
            units = torch.tensor([3, 77])
            layer.up.weight[units] *= 40
            layer.up.bias[units] = 4.0
            layer.down.weight[:, units] /= 40
    path = tmp_path_factory.mktemp("encoder") / "encoder.onnx"
    example = (torch.zeros(1, LENGTH, dtype=torch.int64), torch.ones(1, LENGTH, dtype=torch.int64))
    with torch.no_grad():
        torch.onnx.export(module, example, str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["hidden"])
    rng = np.random.default_rng(0)
    return onnx.load(str(path)), _samples(32, rng), _samples(16, rng)


def _mean_cosine(model, reference, samples) -> float:
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"])
    values = []
    for feeds in samples:
        a, b = got.run(None, feeds)[0].ravel(), want.run(None, feeds)[0].ravel()
        values.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    return float(np.mean(values))


def test_ffn_down_projections_are_found(encoder):
    prepared = normalise(encoder[0]).model
    down = ffn_down_projections(onnx_model=prepared)
    producer = {out: node for node in prepared.graph.node for out in node.output}
    assert len(down) == 2  # one per layer: the projection fed by the GELU (spelled out with Erf at opset 17)
    for node in (n for n in prepared.graph.node if n.name in down):
        assert node.op_type in ("MatMul", "Gemm")
        upstream, seen = [producer.get(node.input[0])], set()
        while upstream and not seen & {"Erf", "Gelu"}:
            current = upstream.pop()
            if current is not None:
                seen.add(current.op_type)
                upstream += [producer.get(i) for i in current.input]
        assert seen & {"Erf", "Gelu"}


def test_transformer_onnx_int8_is_dynamic_fused_and_faithful(encoder, tmp_path):
    model, calib, held = encoder
    result = quantize_onnx(model, SampleSet(calib, None, "test"), subset_size=32, nncf_options={}, transformer=True,
                           ffn_down_float=True, backends=("ort-dynamic",))
    assert result.backend == "ort-dynamic"
    graph = result.model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {init.name: init for init in graph.initializer}
    down = set(ffn_down_projections(onnx_model=normalise(model).model))
    assert len(down) == 2
    assert not [n for n in graph.node if n.op_type == "QuantizeLinear"]  # nothing quantized with a fixed range
    for node in (n for n in graph.node if n.op_type == "DynamicQuantizeLinear"):  # LayerNorm, Softmax stay float
        users = {c.op_type for c in graph.node if set(c.input) & set(node.output)}
        assert users <= {"MatMulInteger", "Mul"}, users
    float_matmuls = [n for n in graph.node if n.op_type == "MatMul" and n.name not in down
                     and any(i in initializers for i in n.input)]
    assert not float_matmuls  # every projection with a constant weight is integer, but the FFN down-projections
    for node in (n for n in graph.node if n.name in down):  # float activations, int8 weights
        assert getattr(producer.get(node.input[0]), "op_type", "") != "DequantizeLinear"
        weight = producer[node.input[1]]
        assert weight.op_type == "DequantizeLinear" and initializers[weight.input[0]].data_type == TensorProto.INT8
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.output[0] in
                  {i for c in graph.node if c.op_type == "DequantizeLinear" for i in c.input})
    assert initializers[gather.input[0]].data_type in (TensorProto.INT8, TensorProto.UINT8)  # the 8-bit token table
    ran = optimized_ops(result.model, tmp_path)
    # ONNX Runtime fuses the runtime quantization and dequantization with each integer MatMul (q, k, v, o, up in
    # each of the 2 layers): none left as MatMulInteger
    fused = ran.count("DynamicQuantizeMatMul") + ran.count("MatMulIntegerToFloat")
    assert fused == 2 * 5 and "MatMulInteger" not in ran
    assert _mean_cosine(result.model, model, held) >= 0.99


def test_gemm_as_matmul_computes_the_same():
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = gemm_as_matmul(model)
    assert [(n.op_type, n.name) for n in rewritten.graph.node] == [("MatMul", "fc"), ("Add", "fc_bias")]
    assert [n.op_type for n in model.graph.node] == ["Gemm"]  # a copy: the input model is unchanged
    x = {"x": rng.normal(size=(2, 3)).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]  # noqa: E731
    np.testing.assert_allclose(run(rewritten), run(model), rtol=1e-5, atol=1e-6)


def test_dequantized_gemm_without_quantize_after_counts_as_fused():
    """ONNX Runtime fuses DQ→Gemm with dequantized inputs into QGemm with a float output; a MatMul needs a Q."""
    nodes = [helper.make_node("DequantizeLinear", [f"{t}q", "s", "z"], [t]) for t in ("x", "w", "b")]
    nodes += [helper.make_node("Gemm", ["x", "w", "b"], ["g"]), helper.make_node("Relu", ["g"], ["y"]),
              helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y2"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                               helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)])
    assert unfused_share(helper.make_model(graph)) == 0.5


def test_a_widening_projection_behind_an_activation_is_a_head_not_an_ffn_down_projection():
    """PP-OCRv5's recogniser ends in a 120 -> 18385 classifier behind a hard-swish: kept float as an "FFN
    down-projection" it was 53% of the weights, and the IR 0.70x FP32's size."""
    import openvino as ov
    import torch
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"up": (16, 64), "down": (64, 16), "head": (16, 100)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "up_w"], ["u"], name="up"), helper.make_node("Relu", ["u"], ["a"]),
         helper.make_node("MatMul", ["a", "down_w"], ["d"], name="down"), helper.make_node("Relu", ["d"], ["b"]),
         helper.make_node("MatMul", ["b", "head_w"], ["y"], name="head")],
        "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 100])],
        [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"{n}_w") for n, s in weights.items()])
    assert ffn_down_projections(onnx_model=helper.make_model(graph)) == ["down"]
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16), torch.nn.GELU(),
                                 torch.nn.Linear(16, 100)).eval()
    ov_model = ov.convert_model(module, example_input=torch.zeros(1, 8, 16))
    found = ffn_down_projections(ov_model=ov_model)
    matmuls = {op.get_friendly_name(): op for op in ov_model.get_ops() if op.get_type_name() == "MatMul"}
    assert len(found) == 1 and matmuls[found[0]].get_output_partial_shape(0)[-1].get_length() == 16
