"""Models with ``If`` branches (Silero VAD picks its 16 kHz or 8 kHz network by the rank-0 sample rate): NNCF
calibrates each branch on the samples that take it; what it cannot do is one line naming the node, op and branch."""

from __future__ import annotations

import numpy as np
import onnx
import openvino as ov
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.passes.quantize import unsupported_message


def _branch(name: str, gather: bool, rng):
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), f"{name}_w")]
    nodes, x = [], "input"
    if gather:
        inits.append(numpy_helper.from_array(np.arange(8, dtype=np.int64), f"{name}_idx"))
        nodes.append(helper.make_node("Gather", ["input", f"{name}_idx"], [f"{name}_g"], axis=1, name=f"{name}_gather"))
        x = f"{name}_g"
    nodes.append(helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_y"], name=f"{name}_matmul"))
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 4])],
                             inits)


@pytest.fixture(scope="module")
def branching(tmp_path_factory):
    """output = input @ W16 if sr == 16000 else input[:, idx] @ W8, with a rank-0 int64 ``sr``."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="is16k"),
         helper.make_node("If", ["is16k"], ["output"], name="pick", then_branch=_branch("wide", False, rng),
                          else_branch=_branch("narrow", True, rng))],
        "branching", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8]),
                      helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(16000, np.int64), "sr16k")])
    folder = tmp_path_factory.mktemp("branching")
    path = folder / "branching.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    inputs = rng.standard_normal((8, 1, 8)).astype(np.float32)
    one_rate, both_rates = folder / "one.npz", folder / "both.npz"
    np.savez(one_rate, input=inputs, sr=np.array(16000, np.int64))  # shared by every sample: one branch only
    np.savez(both_rates, input=inputs, sr=np.array([16000, 8000] * 4, np.int64))  # per sample: both branches
    return path, one_rate, both_rates


def test_branch_no_calibration_sample_takes_is_explained(branching):
    """NNCF's "Calibration dataset must not be empty" on a model with If: say that a branch got no samples.
    (From the command line, data that gives the rate one value no longer gets here: the rate is pinned and the
    branch folded, ``tests/test_pinned_inputs.py``.)"""
    import nncf

    from edgeopt.passes.quantize import _branch_hint

    model = ov.Core().read_model(str(branching[0]))
    hint = _branch_hint(model, nncf.ValidationError("Calibration dataset must not be empty."))
    assert "branch of If" in hint and "no calibration sample takes" in hint
    assert _branch_hint(model, nncf.ValidationError("something else")) == ""


def test_calibration_taking_every_branch_compresses(cli, branching, tmp_path):
    path, _, both_rates = branching
    result = cli("compress", path, "--calib", both_rates, "--out", tmp_path / "out", "--format", "openvino,onnx")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "model.xml").exists() and (tmp_path / "out" / "model.onnx").exists()


def test_error_names_node_op_and_branch(branching):
    model = ov.Core().read_model(str(branching[0]))
    # NNCF 3.4 on Silero VAD's op18 file: "Could not find a node node_select_3 in NNCFGraph!"
    message = unsupported_message(model, RuntimeError("Could not find a node narrow_gather in NNCFGraph!"))
    assert message.startswith("node 'narrow_gather' (op Gather, in the else branch of If '")
    assert message.endswith("Could not find a node narrow_gather in NNCFGraph!")


def test_an_if_condition_of_shape_1x1_is_read_as_a_scalar(cli, branching, tmp_path):
    """torch 1.12 exported openWakeWord's hey_jarvis head with an If on a [1, 1] condition, which ONNX allows
    (one element) and OpenVINO's frontend refuses; edgeopt reshapes it to a scalar for OpenVINO. The frontend's
    own reason, on the last line of its log, is what a refusal would say."""
    from edgeopt.errors import first_line

    path, _, both_rates = branching
    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    nodes[1].input[0] = "is16k_1x1"
    nodes.insert(1, helper.make_node("Reshape", ["is16k", "one_by_one"], ["is16k_1x1"], name="as_1x1"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1], np.int64), "one_by_one"))
    matrix = tmp_path / "if_1x1.onnx"
    onnx.save(model, str(matrix))
    with pytest.raises(Exception) as refused:
        ov.convert_model(str(matrix))
    assert first_line(refused.value).endswith(": Rank of If condition input must be equal to 0 or 1")
    result = cli("compress", matrix, "--calib", both_rates, "--out", tmp_path / "out", "--format", "openvino,onnx")
    assert result.exit_code == 0, result.output
    session = ov.Core().compile_model(str(tmp_path / "out" / "model.xml"), "CPU")
    data = np.load(both_rates)
    for index, rate in enumerate(data["sr"][:2]):
        feeds = {"input": data["input"][index], "sr": np.array(rate, np.int64)}
        expected = ov.Core().compile_model(str(path), "CPU")(feeds)[0]
        assert np.allclose(session(feeds)[0], expected, atol=0.2 * np.abs(expected).max())


def test_two_ifs_reading_one_condition_get_one_scalar():
    """Two Ifs on one [1, 1] condition: one Reshape serves both (two would define one tensor twice, which
    onnx.checker and ONNX Runtime refuse)."""
    from edgeopt.onnx_prep import scalar_if_conditions

    def branch(name: str):
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1])])

    nodes = [helper.make_node("Reshape", ["flag", "shape"], ["cond"]),
             helper.make_node("If", ["cond"], ["a"], then_branch=branch("t1"), else_branch=branch("e1")),
             helper.make_node("If", ["cond"], ["b"], then_branch=branch("t2"), else_branch=branch("e2"))]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                                             helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "ab"],
                              [numpy_helper.from_array(np.array([1, 1], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert scalar_if_conditions(model) == 2
    onnx.checker.check_model(model, full_check=True)
    assert sum(node.op_type == "Reshape" for node in model.graph.node) == 2  # the model's own, and one more
