"""The external data files an ONNX model names (``model.onnx`` + ``model.onnx_data``, as exporters write models
over protobuf's 2 GiB or as asked), read from the protobuf with the standard library alone, so the on-device
validator counts and ships them without the ``onnx`` package.

Walks ModelProto.graph (and its functions) through initializers, sparse initializers and node attributes
(tensors and subgraphs, as an If's branches hold), skipping every other field by its length.
"""

from __future__ import annotations

import mmap
from pathlib import Path

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# field numbers (onnx.proto3)
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE = 1, 5, 15
_FUNCTION_NODE = 7
_NODE_ATTRIBUTE = 5
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS, _ATTR_SPARSE, _ATTR_SPARSES = 5, 6, 10, 11, 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_EXTERNAL, _ENTRY_KEY, _ENTRY_VALUE = 13, 1, 2


def external_data_files(path: str | Path) -> tuple[str, ...]:
    """The ``location`` of every tensor ``path`` stores outside itself, relative to its folder, in first-seen
    order; empty for a model that holds its weights, or a file too short to map. Malformed bytes end the walk
    (the runtime that loads the file says what is wrong with it)."""
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return ()
    with data:
        found: dict[str, None] = {}
        try:
            for number, start, end in _fields(data, 0, len(data)):
                if number == _MODEL_GRAPH:
                    _graph(data, start, end, found)
                elif number == _MODEL_FUNCTIONS:
                    _nodes(data, start, end, _FUNCTION_NODE, found)
        except (IndexError, ValueError):
            pass
        return tuple(found)


def _fields(data, start: int, end: int):
    """(field number, value start, value end) of each length-delimited field in ``data[start:end]``."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(data, pos)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        elif wire == _LEN:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise ValueError("truncated")
            yield number, pos, pos + length
            pos += length
        else:
            raise ValueError(f"wire type {wire}")


def _varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _graph(data, start: int, end: int, found: dict) -> None:
    for number, s, e in _fields(data, start, end):
        if number == _GRAPH_INITIALIZER:
            _tensor(data, s, e, found)
        elif number == _GRAPH_SPARSE:
            _sparse(data, s, e, found)
        elif number == _GRAPH_NODE:
            _node(data, s, e, found)


def _nodes(data, start: int, end: int, field: int, found: dict) -> None:
    for number, s, e in _fields(data, start, end):
        if number == field:
            _node(data, s, e, found)


def _node(data, start: int, end: int, found: dict) -> None:
    for number, s, e in _fields(data, start, end):
        if number != _NODE_ATTRIBUTE:
            continue
        for attr_number, a, b in _fields(data, s, e):
            if attr_number in (_ATTR_T, _ATTR_TENSORS):
                _tensor(data, a, b, found)
            elif attr_number in (_ATTR_G, _ATTR_GRAPHS):
                _graph(data, a, b, found)
            elif attr_number in (_ATTR_SPARSE, _ATTR_SPARSES):
                _sparse(data, a, b, found)


def _sparse(data, start: int, end: int, found: dict) -> None:
    for number, s, e in _fields(data, start, end):
        if number in (_SPARSE_VALUES, _SPARSE_INDICES):
            _tensor(data, s, e, found)


def _tensor(data, start: int, end: int, found: dict) -> None:
    for number, s, e in _fields(data, start, end):
        if number != _TENSOR_EXTERNAL:
            continue
        entry = {n: bytes(data[a:b]).decode("utf-8", "replace") for n, a, b in _fields(data, s, e)}
        if entry.get(_ENTRY_KEY) == "location" and _ENTRY_VALUE in entry:
            found.setdefault(entry[_ENTRY_VALUE], None)
