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
