"""ONNX models whose weights live in external data files (``model.onnx`` + ``model.onnx_data``), as exporters
write large models: loaded, compressed, counted and recorded with their data."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeopt.device.onnx_files import external_data_files
from edgeopt.device.validate import artifact_files
from edgeopt.out_guard import input_bytes


def _model_with_a_branch() -> onnx.ModelProto:
    """x -> MatMul(w1) -> If(flag: Add a constant | Sub it) -> MatMul(w2): weights as initializers and as a
    Constant inside the If's branches."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    shift = rng.standard_normal((16,)).astype(np.float32)

    def branch(op: str) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], [f"{op}_c"], value=numpy_helper.from_array(shift, f"{op}_shift"))
        return helper.make_graph([const, helper.make_node(op, ["h", f"{op}_c"], [f"{op}_y"])], op, [],
                                 [helper.make_tensor_value_info(f"{op}_y", TensorProto.FLOAT, [1, 16])])

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("If", ["flag"], ["b"], then_branch=branch("Add"), else_branch=branch("Sub")),
             helper.make_node("MatMul", ["b", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_data_files_are_read_without_onnx_as_onnx_reads_them(tmp_path):
    model = _model_with_a_branch()
    inline = onnx.ModelProto()
    inline.CopyFrom(model)
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=False, size_threshold=0,
                                                             convert_attribute=True)
    onnx.save(model, tmp_path / "one.onnx")
    expected = {t.external_data[0].value if t.external_data[0].key == "location" else None
                for t in onnx.external_data_helper._get_all_tensors(onnx.load(tmp_path / "one.onnx",
                                                                              load_external_data=False))
                if t.data_location == TensorProto.EXTERNAL}
    assert set(external_data_files(tmp_path / "one.onnx")) == expected and len(expected) == 4  # w1, w2, 2 branches
    onnx.save(inline, tmp_path / "inline.onnx")
    assert external_data_files(tmp_path / "inline.onnx") == ()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 64)
    assert external_data_files(tmp_path / "empty.onnx") == external_data_files(tmp_path / "junk.onnx") == ()


def test_a_model_with_external_data_compresses_and_is_counted_with_it(tmp_path, tiny_onnx, tiny_calib, cli):
    folder = tmp_path / "user"
    folder.mkdir()
    model = folder / "model.onnx"
    onnx.save(onnx.load(tiny_onnx), model, save_as_external_data=True, location="model.onnx_data",
              size_threshold=0)
    assert artifact_files(model) == {"model.onnx": model.stat().st_size,
                                     "model.onnx_data": (folder / "model.onnx_data").stat().st_size}
    assert input_bytes(model) == sum(artifact_files(model).values())  # the free-space estimate counts it too
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", tiny_calib, "--eval", tiny_calib, "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert set(report["inputs"]["model"]["files"]) == {"model.onnx", "model.onnx_data"}  # provenance: both
    assert report["quality"]["passed"] and sorted(p.name for p in folder.iterdir()) == ["model.onnx",
                                                                                         "model.onnx_data"]
    (folder / "model.onnx_data").unlink()
    result = cli("compress", model, "--calib", tiny_calib, "--out", tmp_path / "again", "--quiet")
    assert result.exit_code == 2 and "not a valid ONNX model" in result.output and "model.onnx_data" in result.output
    assert not (tmp_path / "again").exists()
