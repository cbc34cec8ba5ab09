"""Weight bytes: how many bytes of weight constants a model holds, by element type.

Counted as stored: an OpenVINO IR's ``Constant`` nodes (INT4 packs two values per byte; a weight-compressed
layer counts its integer weights plus its scales and zero points) and an ONNX model's initializers and
``Constant`` nodes. Integer index types (i32/i64: shapes, axes, gather indices) and booleans (masks) are
not weights and are left out. Unlike file size this excludes the graph description and file headers.
"""

from __future__ import annotations

from dataclasses import dataclass


_NOT_WEIGHTS = {"i32", "i64", "boolean", "int32", "int64", "bool"}


@dataclass(frozen=True)
class WeightBytes:
    total: int
    by_type: dict[str, int]  # element type -> bytes

    def describe(self) -> dict:
        return {"bytes": self.total, "by_type": dict(sorted(self.by_type.items()))}


def openvino_weight_bytes(model) -> WeightBytes:
    """Weight bytes of an ``openvino.Model``, each distinct constant once, as the IR serialiser stores them (an ONNX
    initializer several nodes read becomes one Constant per reader in memory, and one blob in the ``.bin``)."""
    by_type: dict[str, int] = {}
    seen = set()
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        kind = op.get_element_type().get_type_name()
        if kind in _NOT_WEIGHTS:
            continue
        key = (kind, _content_digest(op))
        if key[1] is not None and key in seen:
            continue
        seen.add(key)
        by_type[kind] = by_type.get(kind, 0) + op.get_byte_size()
    return WeightBytes(sum(by_type.values()), by_type)


def _content_digest(constant) -> str | None:
    """A digest of a Constant's bytes (None when they cannot be read as one buffer)."""
    import hashlib

    import numpy as np

    try:
        data = np.ascontiguousarray(constant.get_data())
        return hashlib.blake2b(data.view(np.uint8).ravel(), digest_size=16).hexdigest() + f"/{data.shape}"
    except Exception:
        return None


def onnx_weight_bytes(model) -> WeightBytes:
    """Weight bytes of an ``onnx.ModelProto``: initializers and ``Constant`` node values (raw data sizes)."""
    import onnx
    from onnx import numpy_helper

    tensors = list(model.graph.initializer)
    tensors += [attr.t for node in model.graph.node if node.op_type == "Constant"
                for attr in node.attribute if attr.type == onnx.AttributeProto.TENSOR]
    by_type: dict[str, int] = {}
    for tensor in tensors:
        kind = onnx.TensorProto.DataType.Name(tensor.data_type).lower()
        if kind in _NOT_WEIGHTS:
            continue
        size = len(tensor.raw_data) if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).nbytes
        by_type[kind] = by_type.get(kind, 0) + size
    return WeightBytes(sum(by_type.values()), by_type)
