"""The ``int8_ac`` step: nncf.quantize_with_accuracy_control on the OpenVINO model, judged on the eval set."""

from __future__ import annotations

import json

import numpy as np
import openvino as ov

from edgeopt.device.runtime import open_session, random_feeds
from edgeopt.recurrent import OPENVINO_COMPUTE


def test_int8_ac_quantizes_within_the_gate_without_labels(cli, tiny_factory, tmp_path):
    """Without labels the metric is the cosine to the FP32 model; the artifact keeps quality and runs."""
    data = tmp_path / "unlabelled.npz"
    np.savez(data, input=np.random.default_rng(2).random((48, 1, 8, 8), dtype=np.float32))
    out = tmp_path / "out"
    result = cli("compress", tiny_factory, "--calib", data, "--eval", data, "--recipe", "int8_ac", "--format",
                 "openvino", "--min-cosine", "0.98", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["artifacts"][0]["precision"] == "int8"
    assert any(note.startswith("int8_ac: cosine to FP32 on 48 evaluation samples") for note in report["notes"])
    assert report["quality"]["passed"]
    model = ov.Core().read_model(str(out / "model.xml"))
    ops = {op.get_type_name() for op in model.get_ops()}
    assert "FakeQuantize" in ops or "FakeConvert" in ops  # quantized, not left in float
    # the report names what stayed float: every compute operation is counted, and those named are float
    decided = report["decisions"]["int8_ac"]
    compute = [op.get_friendly_name() for op in model.get_ops() if op.get_type_name() in OPENVINO_COMPUTE]
    assert decided["compute_operations"] == len(compute) > 0
    assert set(decided["float_operations"]) < set(compute)
    assert any(f"float after it: {len(decided['float_operations'])} of {len(compute)} compute operations" in note
               for note in report["notes"])
    session = open_session(out / "model.xml")
    assert np.isfinite(session.infer(random_feeds(session.static_inputs))[0]).all()


def test_int8_ac_needs_eval_data_and_openvino_only(cli, tiny_factory, tiny_calib, tmp_path):
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--recipe", "int8_ac", "--format", "openvino",
                 "--out", tmp_path / "a")
    assert result.exit_code == 2 and "needs evaluation data" in result.stderr
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--eval", tiny_calib, "--recipe", "int8_ac",
                 "--format", "openvino,onnx", "--out", tmp_path / "b")  # by default: the formats the steps write
    assert result.exit_code == 2 and "--format openvino" in result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_float_compute_ops_names_what_no_quantizer_feeds():
    """The structural reading behind ``decisions.int8_ac``: a MatMul NNCF was told to leave float is named, the
    quantized one is not."""
    import nncf
    from openvino import opset13 as ops

    from edgeopt.passes.accuracy_control import float_compute_ops

    rng = np.random.default_rng(0)
    x = ops.parameter([1, 16], np.float32, name="x")
    first = ops.matmul(x, ops.constant(rng.standard_normal((16, 16)).astype(np.float32)), False, False)
    first.set_friendly_name("first")
    second = ops.matmul(ops.relu(first), ops.constant(rng.standard_normal((16, 4)).astype(np.float32)), False, False)
    second.set_friendly_name("second")
    model = ov.Model([second], [x])
    data = nncf.Dataset([rng.standard_normal((1, 16)).astype(np.float32) for _ in range(8)])
    quantized = nncf.quantize(model, data, subset_size=8, ignored_scope=nncf.IgnoredScope(names=["second"]))
    assert float_compute_ops(quantized) == (["second"], 2)
    assert float_compute_ops(model) == (["first", "second"], 2)
