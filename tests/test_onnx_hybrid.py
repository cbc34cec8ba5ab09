"""The ONNX INT8 path on a hybrid graph: a Conv backbone with an attention block (as PP-OCRv4's SVTR recogniser)
gets the per-block candidate ``ort-hybrid``, Convs static (QLinearConv), MatMuls dynamic (DynamicQuantizeMatMul).

A small recogniser-like model (Conv + BatchNorm + hard-swish backbone, a depthwise Conv, the feature map read as a
sequence by one pre-norm attention block with a GELU FFN, per-position class logits), exported by torch at
opset 13 and calibrated on generated images.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from ort_support import optimized_ops
from torch import nn

from edgeopt.data import SampleSet
from edgeopt.model_type import detect_model_type
from edgeopt.onnx_prep import normalise
from edgeopt.passes.onnx_int8 import (
    BACKENDS,
    HYBRID_BACKEND,
    HYBRID_CONV_SHARE,
    TRANSFORMER_BACKENDS,
    conv_weight_share,
    default_backends,
    quantize_onnx,
)

SHAPE = (1, 3, 32, 64)


class Recogniser(nn.Module):
    def __init__(self, width: int = 96, heads: int = 4, classes: int = 40):
        super().__init__()

        def block(cin, cout, k, stride=1, groups=1):
            return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                                 nn.BatchNorm2d(cout), nn.Hardswish())

        self.backbone = nn.Sequential(block(3, 32, 3, 2), block(32, 32, 3, groups=32), block(32, 64, 1),
                                      block(64, 128, 3, (2, 1)), block(128, width, 3, (2, 1)))
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        features = self.backbone(x)  # (1, width, 4, 32)
        b, d = features.shape[:2]
        seq = features.flatten(2).transpose(1, 2)  # (1, 128, width)
        t = seq.shape[1]
        q, k, v = self.qkv(self.ln1(seq)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attention = (q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5).softmax(-1)
        seq = seq + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        seq = seq + self.down(nn.functional.gelu(self.up(self.ln2(seq))))
        return self.head(seq).softmax(-1)


@pytest.fixture(scope="module")
def recogniser(tmp_path_factory):
    torch.manual_seed(0)
    module = Recogniser().eval()
    with torch.no_grad():  # trained-like BatchNorm statistics, so Conv+BN folding is not an identity
        for norm in (m for m in module.modules() if isinstance(m, nn.BatchNorm2d)):
            norm.running_mean.uniform_(-0.2, 0.2)
            norm.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("recogniser") / "recogniser.onnx"
    with torch.no_grad():
        torch.onnx.export(module, torch.zeros(SHAPE), str(path), dynamo=False, opset_version=13,
                          input_names=["x"], output_names=["probs"])
    rng = np.random.default_rng(0)
    samples = [{"x": (rng.uniform(-1, 1, SHAPE) * 0.5 + np.linspace(-0.5, 0.5, SHAPE[-1])).astype(np.float32)}
               for _ in range(24)]
    return onnx.load(str(path)), samples


def _weight_matmuls(graph) -> list:
    initializers = {init.name for init in graph.initializer}
    return [n for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in initializers]


def test_a_conv_backbone_with_attention_gets_the_hybrid_candidate(recogniser):
    prepared = normalise(recogniser[0]).model
    assert detect_model_type(onnx_model=prepared).is_transformer  # MatMul-Softmax-MatMul: a transformer ...
    assert conv_weight_share(prepared) >= HYBRID_CONV_SHARE  # ... whose Conv weights are a substantial share
    assert default_backends(prepared, transformer=True) == TRANSFORMER_BACKENDS + (HYBRID_BACKEND,)
    assert default_backends(prepared, transformer=False) == BACKENDS


def test_a_transformer_with_a_patch_embedding_conv_does_not():
    """One small patch-embedding Conv in front of large projections (ViT's layout): dynamic only, as before."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("patch", (64, 3, 4, 4)), ("w1", (64, 256)), ("w2", (256, 64)))]
    nodes = [helper.make_node("Conv", ["x", "patch"], ["c"], strides=[4, 4]),
             helper.make_node("Reshape", ["c", "to_seq"], ["s"]),
             helper.make_node("MatMul", ["s", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    weights.append(numpy_helper.from_array(np.array([1, 64, 64], np.int64), "to_seq"))
    graph = helper.make_graph(nodes, "vit_like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert conv_weight_share(model) == pytest.approx(3072 / (3072 + 2 * 16384))
    assert default_backends(model, transformer=True) == TRANSFORMER_BACKENDS


def test_hybrid_quantizes_convs_statically_and_matmuls_dynamically(recogniser, tmp_path):
    model, samples = recogniser
    result = quantize_onnx(model, SampleSet(samples, None, "test"), subset_size=16, nncf_options={},
                           transformer=True)
    built = {b.backend: b for b in result.candidates}
    assert set(built) == {*TRANSFORMER_BACKENDS, HYBRID_BACKEND}
    hybrid = built[HYBRID_BACKEND]
    assert hybrid.error is None and hybrid.unfused == 0.0 and hybrid.cosine > 0.95
    graph = hybrid.model.graph
    initializers = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert len(convs) == 5
    for conv in convs:  # int8 per-channel weights behind a DequantizeLinear, and a quantized input
        weight = producer[conv.input[1]]
        assert weight.op_type == "DequantizeLinear"
        assert initializers[weight.input[0]].data_type == TensorProto.INT8
        assert len(initializers[weight.input[1]].dims) == 1  # one scale per output channel
        assert producer[conv.input[0]].op_type == "DequantizeLinear"
    assert not _weight_matmuls(graph)  # every constant-weight MatMul/Gemm is now integer ...
    integer = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert len(integer) == len(_weight_matmuls(normalise(model).model.graph)) == 5  # qkv, proj, up, down, head
    for node in integer:  # ... with its activation quantized on each call, its weight int8
        assert producer[node.input[0]].op_type == "DynamicQuantizeLinear"
        assert initializers[node.input[1]].data_type == TensorProto.INT8
    ops = optimized_ops(hybrid.model, tmp_path)  # what ONNX Runtime runs: every Conv and MatMul fused
    assert ops.count("QLinearConv") == 5 and "Conv" not in ops
    assert ops.count("DynamicQuantizeMatMul") == 5
    # The dynamic recipe leaves the Convs' compute float, their weights stored int8 too (Cast and Mul, folded
    # when ONNX Runtime loads it): no float 4-D weight is left in either file.
    for backend in (HYBRID_BACKEND, "ort-dynamic"):
        weights = [i for i in built[backend].model.graph.initializer if len(i.dims) == 4 and np.prod(i.dims[1:]) > 1]
        assert len(weights) == 5 and all(i.data_type == TensorProto.INT8 for i in weights), backend
    assert "Conv" in optimized_ops(built["ort-dynamic"].model, tmp_path)
