"""ONNX Runtime helpers shared by the ONNX INT8 tests."""

from __future__ import annotations

import onnx
import onnxruntime as ort


def optimized_ops(model, tmp_path) -> list[str]:
    """The op types of ``model`` after ONNX Runtime's graph optimisations (what actually runs)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]
