"""The ``int8_ac`` step: nncf.quantize_with_accuracy_control on the OpenVINO model, judged on the eval set."""

from __future__ import annotations

import json

import numpy as np
import openvino as ov

from edgeopt.device.runtime import open_session, random_feeds


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
    ops = {op.get_type_name() for op in ov.Core().read_model(str(out / "model.xml")).get_ops()}
    assert "FakeQuantize" in ops or "FakeConvert" in ops  # quantized, not left in float
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
