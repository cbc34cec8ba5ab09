"""Bad input gives a one-line message, exit code 2, and leaves no output behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


def assert_clean_failure(result, out, code=2, mention=""):
    assert result.exit_code == code, result.output
    message = result.stderr.strip()
    assert message.startswith("edgeopt: ") and "\n" not in message, message
    assert "Traceback" not in result.output
    assert mention.lower() in message.lower()
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temp leftovers


def test_missing_model(cli, tmp_path, tiny_calib):
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tmp_path / "nope.onnx", "--calib", tiny_calib, "--out", out), out,
                         mention="no such model file")


def test_corrupt_onnx(cli, tmp_path, tiny_calib):
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"\x08\x07this is not a protobuf" * 10)
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", model, "--calib", tiny_calib, "--out", out), out, mention="not a valid ONNX")


def test_truncated_onnx(cli, tmp_path, tiny_onnx, tiny_calib):
    model = tmp_path / "truncated.onnx"
    model.write_bytes(tiny_onnx.read_bytes()[:-500])
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", model, "--calib", tiny_calib, "--out", out), out, mention="truncated.onnx")


def test_ir_without_weights(cli, tmp_path, tiny_ir, tiny_calib):
    xml = tmp_path / "lonely.xml"
    xml.write_text(tiny_ir.read_text())
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", xml, "--calib", tiny_calib, "--out", out), out, mention="weights file")


def test_calibration_shape_mismatch(cli, tmp_path, tiny_onnx):
    calib = tmp_path / "wrong.npz"
    np.savez(calib, input=np.zeros((8, 3, 16, 16), np.float32))
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_onnx, "--calib", calib, "--out", out), out, mention="expects [1,1,8,8]")


def test_empty_calibration(cli, tmp_path, tiny_onnx):
    calib = tmp_path / "empty.npz"
    np.savez(calib, input=np.zeros((0, 1, 8, 8), np.float32))
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_onnx, "--calib", calib, "--out", out), out, mention="empty")


def test_missing_calibration(cli, tmp_path, tiny_onnx):
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_onnx, "--calib", tmp_path / "none.npz", "--out", out), out,
                         mention="no such data")


def test_wrong_input_shape_option(cli, tmp_path, tiny_onnx, tiny_calib):
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_onnx, "--calib", tiny_calib, "--out", out, "--input-shape",
                             "input=1,3,8,8"), out, mention="--input-shape gives")


def test_dynamic_onnx_needs_a_shape(cli, tmp_path, tiny_torch, tiny_calib):
    """A dynamic dimension neither --input-shape, the file nor the data's arrays size (a hook) is bad input;
    .npz arrays size it (their headers), and the notes say so."""
    module, example = tiny_torch
    model = tmp_path / "dynamic.onnx"
    torch.onnx.export(module, (example,), str(model), dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch", 3: "width"}})
    hook = tmp_path / "hook.py"
    hook.write_text("import numpy as np\ndef samples():\n    return [np.zeros((1, 1, 8, 8), np.float32)] * 4\n")
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", model, "--calib", f"{hook}:samples", "--out", out), out,
                         mention="--input-shape input=")
    result = cli("compress", model, "--calib", tiny_calib, "--out", tmp_path / "sized", "--quiet")
    assert result.exit_code == 0, result.output
    notes = json.loads((tmp_path / "sized" / "report.json").read_text())["notes"]
    assert "dynamic input dimensions sized by the calibration data's samples (no --input-shape): input[3] = 8" in notes
    result = cli("compress", model, "--calib", tiny_calib, "--out", out, "--input-shape", "input=1,1,8,8", "--quiet")
    assert result.exit_code == 0, result.output
    assert (out / "model.xml").is_file()
    notes = json.loads((out / "report.json").read_text())["notes"]  # the width runs at the given size only
    assert any(note.startswith("dynamic input dimensions kept dynamic in the OpenVINO IR: input[0]")
               and "fixed in the OpenVINO IR, which runs at these sizes only: input[3] = 8" in note
               for note in notes)  # each artifact keeps what it can (tests/test_dynamic_axes.py)


def test_dynamic_batch_alone_defaults_to_one(cli, tmp_path, tiny_torch, tiny_calib):
    module, example = tiny_torch
    model = tmp_path / "dynamic.onnx"
    torch.onnx.export(module, (example,), str(model), dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}})
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", tiny_calib, "--out", out, "--format", "openvino")
    assert result.exit_code == 0, result.output
    said = "dynamic input dimensions kept dynamic in the OpenVINO IR: input[0] (checked at input=2,1,8,8"
    assert said in result.output  # said on the console and in the report
    assert any(said in note for note in json.loads((out / "report.json").read_text())["notes"])
    meta = json.loads(_recorded_sizes(out / "model.xml"))
    assert meta == {"input": [1, 1, 8, 8]}  # the size it was calibrated and is validated at


def test_onnx_from_ir_is_refused(cli, tmp_path, tiny_ir, tiny_calib):
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_ir, "--calib", tiny_calib, "--out", out, "--format", "onnx"), out,
                         mention="cannot be converted to ONNX")


@pytest.mark.parametrize("args, mention", [
    (["--format", "tflite"], "unknown format"),
    (["--recipe", "int8,turbo"], "unknown recipe step 'turbo'"),
])
def test_bad_options(cli, tmp_path, tiny_onnx, tiny_calib, args, mention):
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", tiny_onnx, "--calib", tiny_calib, "--out", out, *args), out, mention=mention)


def test_failed_run_keeps_the_previous_output(cli, tmp_path, tiny_onnx, tiny_calib):
    out = tmp_path / "out"
    assert cli("compress", tiny_onnx, "--calib", tiny_calib, "--out", out, "--quiet").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    empty = tmp_path / "empty.npz"
    np.savez(empty, input=np.zeros((0, 1, 8, 8), np.float32))
    assert cli("compress", tiny_onnx, "--calib", empty, "--out", out).exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_already_quantized_onnx_model_is_refused_for_a_precision_step(cli, tmp_path, tiny_onnx, tiny_calib):
    """A model ONNX Runtime's quantizer wrote (here dynamic int8: MatMulInteger) is no FP32 reference: exit 2,
    one line naming what is quantized, nothing written."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(str(tiny_onnx), str(quantized), weight_type=QuantType.QInt8)
    out = tmp_path / "out"
    assert_clean_failure(cli("compress", quantized, "--calib", tiny_calib, "--out", out), out,
                         mention="already quantized (")


def _recorded_sizes(xml) -> str:
    import openvino as ov

    return ov.Core().read_model(str(xml)).get_rt_info(["framework", "edgeopt.input_shapes"]).astype(str)
