"""A recurrent model that picks its network with an ``If`` on a rank-0 int64 sample rate, as Silero VAD does
(``silero_vad_op18_ifless.onnx``: both branches read the same outer-scope weights). With calibration data that
gives the rate one value, edgeopt pins it and folds the branch away. Without pinning, NNCF 3.4 cannot quantize
the OpenVINO model of such data: it calibrates each ``If`` branch on the samples that take it, and none takes
the other one ("Calibration dataset must not be empty", measured on this model); on Silero's own file its graph
builder fails earlier, following a Constant both ``If`` bodies share into the other body."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.onnx_prep import count_ops, pin_inputs

HIDDEN, FEATURES = 8, 16


def _cell(prefix: str, w_in: str):
    """One recurrent step: h' = tanh(x W_in + h W_h), p = sigmoid(h' W_out); state' = [h', h']."""
    nodes = [
        helper.make_node("Gather", ["state", "zero"], [f"{prefix}_h"], axis=0, name=f"{prefix}_h"),
        helper.make_node("MatMul", ["input", w_in], [f"{prefix}_x"], name=f"{prefix}_x"),
        helper.make_node("MatMul", [f"{prefix}_h", "w_h"], [f"{prefix}_r"], name=f"{prefix}_r"),
        helper.make_node("Add", [f"{prefix}_x", f"{prefix}_r"], [f"{prefix}_s"], name=f"{prefix}_s"),
        helper.make_node("Tanh", [f"{prefix}_s"], [f"{prefix}_hn"], name=f"{prefix}_hn"),
        helper.make_node("MatMul", [f"{prefix}_hn", "w_out"], [f"{prefix}_o"], name=f"{prefix}_o"),
        helper.make_node("Sigmoid", [f"{prefix}_o"], [f"{prefix}_p"], name=f"{prefix}_p"),
        helper.make_node("Unsqueeze", [f"{prefix}_hn", "zero_axis"], [f"{prefix}_u"], name=f"{prefix}_u"),
        helper.make_node("Concat", [f"{prefix}_u", f"{prefix}_u"], [f"{prefix}_state"], axis=0,
                         name=f"{prefix}_state"),
    ]
    return helper.make_graph(nodes, prefix, [], [
        helper.make_tensor_value_info(f"{prefix}_p", TensorProto.FLOAT, ["batch", 1]),
        helper.make_tensor_value_info(f"{prefix}_state", TensorProto.FLOAT, [2, "batch", HIDDEN])])


def vad_like(path, seed: int = 0) -> None:
    """input [batch, 16], state [2, batch, 8] (batched on axis 1), sr rank-0 int64; outputs output, stateN."""
    rng = np.random.default_rng(seed)
    weights = {"w_in16": (FEATURES, HIDDEN), "w_in8": (FEATURES, HIDDEN), "w_h": (HIDDEN, HIDDEN),
               "w_out": (HIDDEN, 1)}
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
             for name, shape in weights.items()]
    inits += [numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
              numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array([0], np.int64), "zero_axis")]
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="is16k"),
         helper.make_node("If", ["is16k"], ["output", "stateN"], name="rate",
                          then_branch=_cell("wide", "w_in16"), else_branch=_cell("narrow", "w_in8"))],
        "vad_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", FEATURES]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", HIDDEN]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", HIDDEN])],
        inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture(scope="module")
def vad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vad_like")
    path = folder / "vad.onnx"
    vad_like(path)
    rng = np.random.default_rng(1)
    data = {}
    for name, count in (("calib", 24), ("eval", 12)):
        arrays = {"input": rng.standard_normal((count, 1, FEATURES)).astype(np.float32),
                  "state": (rng.standard_normal((count, 2, 1, HIDDEN)) * 0.3).astype(np.float32)}
        data[name] = folder / f"{name}.npz"
        np.savez(data[name], **arrays, sr=np.full((count,), 16000, np.int64))  # one rate, stacked per sample
    both = folder / "both.npz"
    np.savez(both, **{k: v for k, v in np.load(data["calib"]).items() if k != "sr"},
             sr=np.array([16000, 8000] * 12, np.int64))
    return path, data["calib"], data["eval"], both


def test_pinning_folds_the_branch_and_keeps_the_outputs(vad):
    path = vad[0]
    model = onnx.load(str(path))
    pinned = pin_inputs(model, {"sr": np.array(16000, np.int64)}, {"input": [1, FEATURES], "state": [2, 1, HIDDEN]})
    assert count_ops(model, "If") == 1 and count_ops(pinned, "If") == 0
    assert [v.name for v in pinned.graph.input] == ["input", "state"]
    rng = np.random.default_rng(2)
    feeds = {"input": rng.standard_normal((1, FEATURES)).astype(np.float32),
             "state": rng.standard_normal((2, 1, HIDDEN)).astype(np.float32)}
    want = ort.InferenceSession(str(path)).run(None, {**feeds, "sr": np.array(16000, np.int64)})
    got = ort.InferenceSession(pinned.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    other = ort.InferenceSession(str(path)).run(None, {**feeds, "sr": np.array(8000, np.int64)})
    assert not np.allclose(other[0], want[0])  # the folded branch is really the one 16 kHz takes


@pytest.mark.slow
def test_one_sample_rate_compresses_with_the_rate_pinned(cli, vad, tmp_path):
    """The Silero case end to end (before pinning: exit 2, no calibration sample for the 8 kHz branch)."""
    path, calib, held, _ = vad
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", calib, "--eval", held, "--out", out, "--format", "openvino,onnx",
                 "--input-shape", "input=1,16", "--input-shape", "state=2,1,8")
    assert result.exit_code in (0, 3), result.output  # 3 would be the gate's honest verdict, never 1 or 2
    report = json.loads((out / "report.json").read_text())
    pinned = report["decisions"]["pinned_inputs"]
    assert pinned["values"] == {"sr": 16000} and pinned["if_ops_before"] == 1 and pinned["if_ops_after"] == 0
    assert pinned["checked_samples"] > 0 and pinned["max_abs_diff"] <= 1e-4
    assert any("pinned sr=16000" in note for note in report["notes"])
    assert set(report["quality"]["artifacts"]["openvino"]["outputs"]) == {"output", "stateN"}
    for fmt in ("openvino", "onnx"):
        assert report["quality"]["artifacts"][fmt]["outputs"]["output"]["cosine"] > 0.9
    onnx_inputs = [i.name for i in ort.InferenceSession(str(out / "model.onnx")).get_inputs()]
    assert onnx_inputs == ["input", "state"]
    import openvino as ov

    assert sorted(p.get_any_name() for p in ov.Core().read_model(str(out / "model.xml")).inputs) == ["input", "state"]


@pytest.mark.slow
def test_a_hook_giving_one_rate_pins_it_too(cli, vad, tmp_path):
    """The same from a ``file.py:function`` data hook yielding Python ints for the rate."""
    hook = tmp_path / "hook.py"
    hook.write_text("import numpy as np\n"
                    "def samples():\n"
                    "    rng = np.random.default_rng(3)\n"
                    "    for _ in range(16):\n"
                    f"        yield {{'input': rng.standard_normal((1, {FEATURES})).astype('float32'),\n"
                    f"               'state': (0.3 * rng.standard_normal((2, 1, {HIDDEN}))).astype('float32'),\n"
                    "               'sr': 16000}\n")
    out = tmp_path / "out"
    result = cli("compress", vad[0], "--calib", f"{hook}:samples", "--out", out, "--format", "onnx",
                 "--input-shape", "input=1,16", "--input-shape", "state=2,1,8")
    assert result.exit_code in (0, 3), result.output
    report = json.loads((out / "report.json").read_text())
    assert report["decisions"]["pinned_inputs"]["values"] == {"sr": 16000}
    assert [i.name for i in ort.InferenceSession(str(out / "model.onnx")).get_inputs()] == ["input", "state"]


@pytest.mark.slow
def test_two_sample_rates_keep_the_input(cli, vad, tmp_path):
    """Samples for both rates: nothing is pinned (the artifact keeps ``sr``); the If stays and NNCF's failure on
    it is one line naming the node, exit 2, or it compresses."""
    path, _, _, both = vad
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", both, "--out", out, "--format", "onnx",
                 "--input-shape", "input=1,16", "--input-shape", "state=2,1,8")
    assert result.exit_code in (0, 2, 3), result.output
    if result.exit_code == 2:
        assert "node '" in result.output
        return
    report = json.loads((out / "report.json").read_text())
    assert "pinned_inputs" not in report["decisions"]
    assert "sr" in [i.name for i in ort.InferenceSession(str(out / "model.onnx")).get_inputs()]


def test_one_value_per_sample_is_compared_across_samples():
    """A speech probability per chunk: per-sample cosine of one positive number is always 1, whatever the value."""
    from edgeopt.evaluate import compare_outputs

    reference = np.array([[0.9], [0.8], [0.1], [0.2]])
    swapped = np.array([[0.1], [0.2], [0.9], [0.8]])  # speech and silence swapped
    fidelity = compare_outputs(swapped, reference)
    assert fidelity.cosine == pytest.approx(-1.0) and fidelity.top1_agreement is None  # centred: anti-correlated
    three = float(swapped[:3, 0] @ reference[:3, 0] / np.linalg.norm(swapped[:3]) / np.linalg.norm(reference[:3]))
    assert compare_outputs(swapped[:3], reference[:3]).cosine == pytest.approx(three)  # 3 samples: uncentred
    saturated = np.array([[1.0], [0.99999994], [1.0], [1.0], [0.99999994], [1.0]])  # a confident sigmoid
    assert compare_outputs(saturated + 5e-4, saturated).cosine > 0.9999  # rounding noise is not centred on
    assert compare_outputs(reference.copy(), reference).cosine == pytest.approx(1.0)


def test_scores_clustered_away_from_zero_are_compared_around_their_mean():
    """DNSMOS's P.808 MOS head quantized in OpenVINO: scores of 2.1-3.1 off by up to 0.5 read cosine 0.998
    uncentred; around the reference's mean the same values read what their correlation says. An offset counts
    against them; a reference that does not vary is compared uncentred."""
    from edgeopt.evaluate import compare_outputs

    rng = np.random.default_rng(0)
    reference = 2.6 + 0.3 * rng.standard_normal((64, 1))
    noisy = reference + 0.15 * rng.standard_normal((64, 1))
    uncentred = float((noisy * reference).sum() / np.linalg.norm(noisy) / np.linalg.norm(reference))
    assert uncentred > 0.99 > compare_outputs(noisy, reference).cosine  # the gate's 0.99 now sees it
    assert compare_outputs(noisy, reference).cosine == pytest.approx(np.corrcoef(noisy[:, 0], reference[:, 0])[0, 1],
                                                                     abs=0.03)
    assert compare_outputs(reference + 0.3, reference).cosine < 0.9  # an offset of one spread
    assert compare_outputs(np.full((8, 1), 0.5), np.full((8, 1), 0.5)).cosine == pytest.approx(1.0)
