"""The fast subset of the conformance corpus (bench/conformance.py), through the bench's own code path.

Each entry marked ``fast`` in the corpus — no downloads: a conv net exported at opset 11 with Constant-node
weights, a dynamic-batch opset-17 export, a stateful GRU export with a rank-0 int64 input and its state batched on
axis 1, an LSTM with three outputs, a small ``transformers`` encoder — is compressed with the default command
(a subprocess: the exit code a user gets) and checked side by side with ONNX Runtime's ``quantize_static`` on the
same file and data. Latency is the bench's to measure, not the test's.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "conformance.py"


def _bench():
    spec = importlib.util.spec_from_file_location("conformance_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()
FAST = [entry for entry in bench.CORPUS if entry.fast]


def test_fast_subset_covers_the_forms_users_hold_models_in():
    forms = {entry.name: entry for entry in FAST}
    assert any(e.export_opset == 11 and e.constants and e.conv for e in FAST)  # Constant-node weights, old opset
    assert any(e.export_opset and e.export_opset >= 17 for e in FAST)  # a current opset, dynamic batch
    assert "gru-stateful-onnx13" in forms and "lstm-stateful" in forms and "bert-mini" in forms


def test_table_shows_each_entry_latest_measured_row(tmp_path):
    """``--table`` reads files and folders of rows files; per entry the row measured last wins, whichever file
    it is in; a row without ``measured_at`` (older rows files) counts as measured when its file was written."""
    import os

    def rows(path: Path, *entries: dict) -> None:
        path.write_text(json.dumps({"rows": [{"form": "f", "exit": 0, **e} for e in entries]}))

    folder = tmp_path / "rows"
    folder.mkdir()
    rows(folder / "a.json", {"name": "resnet18", "code": "new", "measured_at": "2026-12-03T07:00:00Z"},
         {"name": "regnet", "code": "untimed"})
    rows(folder / "b.json", {"name": "resnet18", "code": "old", "measured_at": "2026-12-03T06:00:00Z"},
         {"name": "regnet", "code": "timed", "measured_at": "2026-12-03T06:00:00Z"})
    os.utime(folder / "a.json", (1796274000, 1796274000))  # 2026-12-03T05:00:00Z: before b.json's rows
    rows(tmp_path / "c.json", {"name": "bert-mini", "code": "single", "measured_at": "2026-12-03T05:00:00Z"})
    latest = bench.saved_rows(f"{folder},{tmp_path / 'c.json'}")
    assert {name: row["code"] for name, row in latest.items()} == {"resnet18": "new", "regnet": "timed",
                                                                    "bert-mini": "single"}
    lines = bench.table([latest[e.name] for e in bench.CORPUS if e.name in latest]).splitlines()
    assert lines[0].startswith("| entry | code |") and len(lines) == 2 + 3


def test_average_pool_wider_than_its_input_reads_in_openvino(tmp_path):
    """EfficientNet as ``transformers`` writes it pools with ``AvgPool2d(2560, ceil_mode=True)`` on 7x7: ONNX
    Runtime clips the window, OpenVINO's ONNX frontend refuses it; edgeopt reads it as the global pool it is."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.source import load_model

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[64, 64], strides=[64, 64], ceil_mode=1)],
        "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 1, 1])], [weight])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.random.default_rng(1).standard_normal((1, 3, 7, 7)).astype(np.float32)
    model = load_model(path, {"x": (1, 3, 7, 7)}).openvino_model()
    got = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(got, want, atol=1e-5) and np.abs(want).max() > 0.1


def test_torch_average_pool_wider_than_its_input_converts():
    """The same pooler as a PyTorch module: OpenVINO converts it with dynamic shapes, then refuses the static
    ones; edgeopt converts the equivalent adaptive pool (in a copy: the user's module is left as it was)."""
    import numpy as np
    import openvino as ov
    import torch
    from torch import nn

    from edgeopt.source import to_openvino

    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AvgPool2d(64, ceil_mode=True), nn.Flatten()).eval()
    x = torch.randn(1, 3, 7, 7)
    model = to_openvino(module, (x,), ["x"])
    got = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x.numpy())[0]
    with torch.no_grad():
        want = module(x).numpy()
    assert np.allclose(got, want, atol=1e-5) and isinstance(module[1], nn.AvgPool2d)


@pytest.mark.slow
@pytest.mark.parametrize("entry", FAST, ids=[entry.name for entry in FAST])
def test_fast_entry(entry, tmp_path):
    row = bench.run_entry(entry, tmp_path / entry.name, timing=False)
    assert row["exit"] in (0, 3), row  # done, or the quality gate said no; never an internal error (1)
    report = json.loads((tmp_path / entry.name / "int8" / "report.json").read_text())
    # Every output is measured, in every artifact's report and in the bench's own per-output fidelity.
    assert row["outputs"] >= 1
    for fmt, names in row["report_outputs"].items():
        assert len(names) == row["outputs"], (fmt, names)
    assert len(row["fidelity_onnx"]) == len(row["fidelity_ir"]) == row["outputs"]
    # An artifact larger than FP32 is flagged; every artifact was compared with FP32 in its own runtime.
    assert set(report["vs_fp32"]) == {"openvino", "onnx"}
    for fmt, versus in report["vs_fp32"].items():
        assert ("larger than FP32" in report["flagged"].get(fmt, [])) == (versus["bytes"] > versus["fp32_bytes"])
        low, high = versus["p50_ratio_interval"]
        assert low <= versus["p50_ratio"] <= high and versus["rounds"] >= 6
    if entry.conv:
        assert row["onnx_size_ratio"] <= 1 / 3, row  # weights stored as int8 initializers
        assert row["anchor_error"] is None, row
        # at least quantize_static's fidelity (worst output) on the same file and data
        assert min(row["fidelity_onnx"]) >= min(row["fidelity_anchor"]) - 0.01, row
