"""The source file's dynamic input dimensions stay dynamic in the ONNX artifact and the OpenVINO IR where each
still computes the source's result at other sizes (``edgeopt.dynamic_axes``), checked by running both at twice
the size."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgeopt.device.runtime import open_session
from edgeopt.dynamic_axes import reopen
from edgeopt.evaluate import sample_cosines
from edgeopt.onnx_prep import normalise
from edgeopt.source import load_model


class PooledNet(nn.Module):
    """A fully convolutional classifier: runs at any batch and image size. ``view(size(0), -1)`` exports as
    Shape → Gather → Reshape, which a static-shape optimiser folds into a constant batch of 1."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.mean(x, dim=(2, 3), keepdim=True)
        return self.head(x.view(x.size(0), -1))


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """PooledNet exported at opset 13 with dynamic batch, height and width; calibration data at 1x3x16x16."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("pooled")
    path = folder / "pooled.onnx"
    torch.onnx.export(PooledNet().eval(), (torch.zeros(1, 3, 16, 16),), str(path), dynamo=False, opset_version=13,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}})
    calib = folder / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((32, 3, 16, 16), dtype=np.float32))
    return path, calib


def _session(model):
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(sample_cosines(a.reshape(1, -1), b.reshape(1, -1))[0])


def _dims(path) -> list:
    value = onnx.load(str(path)).graph.input[0]
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_int8_artifacts_keep_the_dynamic_dimensions_and_run_at_other_sizes(cli, pooled, tmp_path):
    import openvino as ov

    model, calib = pooled
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", calib, "--input-shape", "x=1,3,16,16", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert _dims(out / "model.onnx") == ["batch", 3, "height", "width"]  # the source's own names
    ir = ov.Core().read_model(str(out / "model.xml"))
    assert ir.inputs[0].get_partial_shape().to_string() == "[?,3,?,?]"
    assert json.loads(ir.get_rt_info(["framework", "edgeopt.input_shapes"]).astype(str)) == {"x": [1, 3, 16, 16]}
    report = json.loads((out / "report.json").read_text())
    assert set(report["decisions"]["dynamic_axes"]) == {"onnx", "openvino"}
    for fmt, label in (("onnx", "ONNX artifact"), ("openvino", "OpenVINO IR")):
        decided = report["decisions"]["dynamic_axes"][fmt]
        assert decided["opened"] == ["x[0]", "x[2]", "x[3]"] and decided["fixed"] == []
        assert decided["probe_shapes"] == [{"x": [2, 3, 32, 32]}, {"x": [2, 3, 15, 15]}]  # 2x, then 1 shorter
        assert decided["cosine"] >= decided["calibrated_cosine"] - 0.02 and decided["samples"] == 3
        assert any(note.startswith(f"dynamic input dimensions kept dynamic in the {label}: x[0], x[2], x[3]")
                   for note in report["notes"])
    # at a size neither edgeopt's check nor calibration used, the INT8 files still track the source
    x = np.random.default_rng(1).random((3, 3, 24, 40), dtype=np.float32)
    want, = _session(model).run(None, {"x": x})
    got, = _session(out / "model.onnx").run(None, {"x": x})
    assert got.shape == want.shape == (3, 4) and _cosine(got, want) > 0.98
    got = ov.Core().compile_model(ir, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({"x": x})[0]
    assert got.shape == want.shape and _cosine(got, want) > 0.98


def test_a_validator_takes_the_recorded_sizes_for_dynamic_dimensions(cli, pooled, tmp_path, profiles):
    model, calib = pooled
    out = tmp_path / "out"
    assert cli("compress", model, "--calib", calib, "--input-shape", "x=1,3,16,16", "--out", out,
               "--quiet").exit_code == 0
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert json.loads(meta["edgeopt.input_shapes"]) == {"x": [1, 3, 16, 16]}
    profiles("ort", 'extends = "generic-x86-avx2-2core"\n[budgets]\nmax_cv = 1e6\nmax_p99_over_p50 = 1e6\n'
                    'p50_ms = 1e4\np95_ms = 1e4\np99_ms = 1e4\n[runtime]\nname = "onnxruntime"\n')
    result = cli("validate", out / "model.onnx", "--target", "ort", "--runs", 5, "--warmup", 1, "--min-seconds", 0,
                 "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["measured_with"]["input_shapes"] == {"x": [1, 3, 16, 16]}
    profiles("ov", 'extends = "generic-x86-avx2-2core"\n[budgets]\nmax_cv = 1e6\nmax_p99_over_p50 = 1e6\n'
                   'p50_ms = 1e4\np95_ms = 1e4\np99_ms = 1e4\n')
    in_openvino = cli("validate", out / "model.onnx", "--target", "ov", "--runs", 5, "--warmup", 1,
                      "--min-seconds", 0, "--json", "-")  # OpenVINO reads the ONNX file's metadata too
    assert in_openvino.exit_code == 0, in_openvino.output
    assert json.loads(in_openvino.stdout)["measured_with"]["input_shapes"] == {"x": [1, 3, 16, 16]}
    given = cli("validate", out / "model.onnx", "--target", "ort", "--runs", 5, "--warmup", 1, "--min-seconds", 0,
                "--input-shape", "x=2,3,24,24", "--json", "-")  # a size given wins over the recorded one
    assert json.loads(given.stdout)["measured_with"]["input_shapes"] == {"x": [2, 3, 24, 24]}
    for shape, expected in ((), [1, 3, 16, 16]), (("--input-shape", "x=2,3,24,24"), [2, 3, 24, 24]):
        ir = cli("validate", out / "model.xml", "--target", "ov", "--runs", 5, "--warmup", 1, "--min-seconds", 0,
                 *shape, "--json", "-")  # the dynamic IR, compiled static at the size it runs at
        assert ir.exit_code == 0, ir.output
        measured = json.loads(ir.stdout)["measured_with"]
        assert measured["input_shapes"] == {"x": expected}
        assert measured["settings_effective"]["compiled_at"] == {"x": expected}, measured
    for artifact in ("model.onnx", "model.xml"):  # loaded as a model: the recorded sizes, no --input-shape needed
        assert load_model(out / artifact).inputs[0].shape == (1, 3, 16, 16)
        assert load_model(out / artifact, {"x": (2, 3, 8, 8)}).inputs[0].shape == (2, 3, 8, 8)
    golden = cli("golden", "create", out / "model.xml", "--data", calib, "--out", tmp_path / "golden", "--samples", 4)
    assert golden.exit_code == 0, golden.output
    session = open_session(out / "model.xml")  # compiled at the recorded sizes; again for another size fed
    assert session.compiled_shapes == {"x": [1, 3, 16, 16]} and session.inputs[0].shape == (None, 3, None, None)
    assert session.infer({"x": np.zeros((2, 3, 24, 32), np.float32)})[0].shape == (2, 4)
    assert session.compiled_shapes == {"x": [2, 3, 24, 32]}


def test_the_optimiser_folds_no_size_the_source_leaves_dynamic(pooled):
    """ONNX Runtime's basic optimiser, given the fixed sizes, folds ``view(size(0), -1)`` into a Reshape to batch
    1: that graph cannot run at batch 2, and ``reopen`` says so and keeps the dimensions fixed. Told which
    axes the source leaves dynamic, the optimiser keeps the Shape sub-graph and the graph runs at any size."""
    model, _ = pooled
    source = load_model(model, {"x": (1, 3, 16, 16)})
    sample = {"x": np.random.default_rng(2).random((1, 3, 16, 16), dtype=np.float32)}
    folded = normalise(source.onnx_model(), feeds=sample).model
    kept, reopened = reopen(folded, model, source.declared_inputs, [sample])
    assert kept is folded and reopened.opened == []
    assert reopened.fixed == ["x[0] = 1", "x[2] = 16", "x[3] = 16"]
    assert "the artifact does not run at x=2,3,32,32" in reopened.reason
    assert "the artifact does not run at x=2,3,16,16" in reopened.reason  # the batch alone fails too

    dynamic = normalise(source.onnx_model(), feeds=sample, dynamic={"x": [0, 2, 3]}).model
    assert [d.dim_value for d in dynamic.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 16, 16]
    opened, reopened = reopen(dynamic, model, source.declared_inputs, [sample])
    assert reopened.opened == ["x[0]", "x[2]", "x[3]"] and reopened.fixed == []
    assert reopened.cosine == pytest.approx(1.0, abs=1e-5)  # FP32 against FP32
    x = np.random.default_rng(3).random((2, 3, 20, 28), dtype=np.float32)
    got, = _session(opened.SerializeToString()).run(None, {"x": x})
    want, = _session(model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_only_the_batch_opens_where_the_source_runs_at_one_image_size(cli, tmp_path, tiny_torch, tiny_calib):
    """TinyNet's Linear head takes 16x4x4 features: the source itself fails at twice the width, so the width
    stays fixed (with why) and the batch alone is opened."""
    module, example = tiny_torch
    model = tmp_path / "dynamic.onnx"
    torch.onnx.export(module, (example,), str(model), dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch", 3: "width"}})
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", tiny_calib, "--out", out, "--input-shape", "input=1,1,8,8", "--quiet")
    assert result.exit_code == 0, result.output
    for decided in json.loads((out / "report.json").read_text())["decisions"]["dynamic_axes"].values():
        assert decided["opened"] == ["input[0]"] and decided["fixed"] == ["input[3] = 8"]
        assert decided["probe_shapes"] == [{"input": [2, 1, 8, 8]}]  # the batch alone: nothing to shorten
    assert _dims(out / "model.onnx") == ["batch", 1, 8, 8]
    x = np.random.default_rng(4).random((5, 1, 8, 8), dtype=np.float32)
    got, = _session(out / "model.onnx").run(None, {"input": x})
    assert got.shape == (5, 10)


class HeightMixer(nn.Module):
    """A Linear across the image height (16 rows), pooled over the width: runs at any batch and width, at one
    height only (a text-line recogniser's layout)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.rows = nn.Linear(16, 4)

    def forward(self, x):
        x = self.rows(torch.relu(self.conv(x)).transpose(2, 3))  # batch x 8 x width x 4
        return x.mean(dim=2).flatten(1)


def test_the_dimensions_the_source_runs_at_open_and_the_others_stay_fixed_with_why(tmp_path):
    torch.manual_seed(0)
    model = tmp_path / "mixer.onnx"
    torch.onnx.export(HeightMixer().eval(), (torch.zeros(1, 3, 16, 24),), str(model), dynamo=False, opset_version=13,
                      input_names=["x"], dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}})
    source = load_model(model, {"x": (1, 3, 16, 24)})
    sample = {"x": np.random.default_rng(5).random((1, 3, 16, 24), dtype=np.float32)}
    graph = normalise(source.onnx_model(), feeds=sample, dynamic={"x": [0, 2, 3]}).model
    opened, reopened = reopen(graph, model, source.declared_inputs, [sample])
    assert reopened.opened == ["x[0]", "x[3]"] and reopened.fixed == ["x[2] = 16"]
    assert reopened.probe_shapes == [{"x": [2, 3, 16, 48]}, {"x": [2, 3, 16, 23]}]
    assert reopened.reason.startswith("the source does not run at x=2,3,32,48")  # all of them first
    assert "the source does not run at x=1,3,32,24" in reopened.reason  # then the height alone
    assert "MatMul dimension mismatch" in reopened.reason and "ONNXRuntimeError" not in reopened.reason  # the cause
    assert [d.dim_param or d.dim_value for d in opened.graph.input[0].type.tensor_type.shape.dim] == \
        ["batch", 3, 16, "width"]
    assert reopened.note().endswith(f"fixed in the ONNX artifact, which runs at these sizes only: x[2] = 16 "
                                    f"({reopened.reason})")


def _graph(path, nodes, inputs, output, rank, initializers=()):
    """A one-output float graph at opset 13, saved at ``path``; ``inputs``: name -> declared dims; the output's
    ``rank`` dimensions unnamed."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
                                           for n, d in inputs.items()],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, [None] * rank)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return model


def _mean_graphs(tmp_path):
    """The mean over a dynamic width: the source divides by the width it reads from the shape; the "artifact" by
    16, the calibrated width, as a graph that folded the shape would. Same cosine at any width, not the same
    scale."""
    from onnx import helper, numpy_helper

    total = helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    source = _graph(tmp_path / "mean.onnx", [
        total, helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["width_i"], axis=0),
        helper.make_node("Cast", ["width_i"], ["width"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Div", ["total", "width"], ["y"])], {"x": ["n", "w"]}, "y", 2,
        [axes, numpy_helper.from_array(np.array(1, np.int64), "one")])
    folded = _graph(tmp_path / "folded.onnx", [total, helper.make_node("Div", ["total", "sixteen"], ["y"])],
                    {"x": [1, 16]}, "y", 2, [axes, numpy_helper.from_array(np.array(16, np.float32), "sixteen")])
    return source, folded


def test_a_size_folded_into_a_scale_keeps_the_dimension_fixed(tmp_path):
    _, folded = _mean_graphs(tmp_path)
    declared = load_model(tmp_path / "mean.onnx", {"x": (1, 16)}).declared_inputs
    samples = [{"x": np.random.default_rng(i).random((1, 16), dtype=np.float32) + 0.5} for i in range(3)]
    kept, reopened = reopen(folded, tmp_path / "mean.onnx", declared, samples)
    assert reopened.opened == ["x[0]"] and reopened.fixed == ["x[1] = 16"]  # the batch alone is fine
    assert reopened.reason == "at x=2,32 an output's norm is 100.0% off the source's, 0.0% at the calibrated sizes"
    assert reopened.cosine == pytest.approx(1.0)  # which cosine alone could not tell


def test_a_source_onnx_runtime_cannot_run_as_given_keeps_every_dimension_fixed(tmp_path):
    _, folded = _mean_graphs(tmp_path)
    declared = load_model(tmp_path / "mean.onnx", {"x": (1, 16)}).declared_inputs
    strict = _graph(tmp_path / "strict.onnx", [onnx.helper.make_node("Relu", ["x"], ["y"])], {"x": ["n", 8]}, "y", 2)  # declares a width of 8: ONNX Runtime refuses the 16-wide sample
    assert strict is not None
    kept, reopened = reopen(folded, tmp_path / "strict.onnx", declared, [{"x": np.ones((1, 16), np.float32)}])
    assert kept is folded and reopened.opened == [] and reopened.fixed == ["x[0] = 1", "x[1] = 16"]
    assert reopened.reason.startswith("ONNX Runtime does not run the source file as it is (")


def test_an_input_the_artifact_lacks_is_neither_opened_nor_recorded(tmp_path):
    from onnx import helper

    source = tmp_path / "two.onnx"
    _graph(source, [helper.make_node("Relu", ["x"], ["y"])], {"x": ["n", 4], "u": ["n", 4]}, "y", 2)
    artifact = _graph(tmp_path / "one.onnx", [helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, "y", 2)
    declared = load_model(source, {"x": (1, 4), "u": (1, 4)}).declared_inputs
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32),
                "u": np.zeros((1, 4), np.float32)} for i in range(3)]
    opened, reopened = reopen(artifact, source, declared, samples)
    assert reopened.opened == ["x[0]"]
    meta = {p.key: p.value for p in opened.metadata_props}
    assert json.loads(meta["edgeopt.input_shapes"]) == {"x": [1, 4]}


def test_validate_refuses_sizes_it_cannot_run_at_in_one_line(cli, tmp_path, profiles):
    """Sizes given for an input the model lacks, or for one input of two that must agree (the other at its
    recorded size), are bad input (exit 2, one line) in either runtime, not an internal error."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "y"], ["z"], axis=1)], "joined",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4]) for name in ("x", "y")],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.metadata_props.add(key="edgeopt.input_shapes", value=json.dumps({"x": [1, 4], "y": [1, 4]}))
    path = tmp_path / "joined.onnx"
    onnx.save(model, str(path))
    budgets = '[budgets]\nmax_cv = 1e6\nmax_p99_over_p50 = 1e6\np50_ms = 1e4\np95_ms = 1e4\np99_ms = 1e4\n'
    profiles("ort", f'extends = "generic-x86-avx2-2core"\n{budgets}[runtime]\nname = "onnxruntime"\n')
    profiles("ov", f'extends = "generic-x86-avx2-2core"\n{budgets}')
    validate = ("validate", path, "--runs", 3, "--warmup", 1, "--min-seconds", 0)
    ok = cli(*validate, "--target", "ort", "--input-shape", "x=3,4", "--input-shape", "y=3,4", "--json", "-")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["measured_with"]["batch"] == 3
    for target in ("ort", "ov"):
        unknown = cli(*validate, "--target", target, "--input-shape", "w=1,4")
        assert unknown.exit_code == 2 and "unknown input(s) w; the model's inputs are x, y" in unknown.output
        partial = cli(*validate, "--target", target, "--input-shape", "x=3,4")
        assert partial.exit_code == 2, partial.output
        assert "x=3,4, y=1,4" in partial.output and "Traceback" not in partial.output
        assert len(partial.output.strip().splitlines()) == 1, partial.output


def test_an_openvino_ir_source_keeps_its_dimensions_fixed_and_says_why(cli, pooled, tmp_path):
    import openvino as ov

    model, calib = pooled
    ir = tmp_path / "pooled.xml"
    ov.save_model(ov.convert_model(str(model)), str(ir))  # x: [?, 3, ?, ?]
    out = tmp_path / "out"
    result = cli("compress", ir, "--calib", calib, "--input-shape", "x=1,3,16,16", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert "dynamic_axes" not in report["decisions"]
    assert ("dynamic input dimensions fixed in the artifacts, which run at these sizes only: x[0] = 1, x[2] = 16, "
            "x[3] = 16 (an OpenVINO IR source: ") in " ".join(report["notes"])


def test_an_openvino_session_compiles_again_after_a_feed_that_does_not_fit(cli, pooled, tmp_path):
    model, calib = pooled
    out = tmp_path / "out"
    assert cli("compress", model, "--calib", calib, "--input-shape", "x=1,3,16,16", "--format", "openvino",
               "--out", out, "--quiet").exit_code == 0
    session = open_session(out / "model.xml")
    with pytest.raises(Exception):
        session.infer({"x": np.zeros((1, 4, 16, 16), np.float32)})  # 4 channels: the runtime refuses
    assert session.infer({"x": np.zeros((2, 3, 24, 24), np.float32)})[0].shape == (2, 4)
    assert session.compiled_shapes == {"x": [2, 3, 24, 24]}


class PadToEight(nn.Module):
    """Pads the width to a multiple of 8 (as detectors and OCR models pad to their stride), then a stride-8 conv:
    traced at width 16 the padding folds to 0, which is right at every multiple of 16 and wrong elsewhere."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, (3, 8), stride=(1, 8), padding=(1, 0))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = nn.functional.pad(x, (0, (8 - x.shape[3] % 8) % 8))
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def test_a_padding_folded_at_the_calibrated_size_keeps_the_width_fixed(tmp_path):
    """Twice the width is a multiple of 8 too, so only the probe one shorter shows the folded padding."""
    torch.manual_seed(0)
    module, source = PadToEight().eval(), tmp_path / "pad.onnx"
    torch.onnx.export(module, (torch.zeros(1, 3, 8, 16),), str(source), dynamo=False, opset_version=13,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch", 3: "width"}})
    folded = tmp_path / "folded.onnx"  # traced at width 16 without dynamic axes: the padding is the constant 0
    torch.onnx.export(module, (torch.zeros(1, 3, 8, 16),), str(folded), dynamo=False, opset_version=13,
                      input_names=["x"], output_names=["y"])
    declared = load_model(source, {"x": (1, 3, 8, 16)}).declared_inputs
    samples = [{"x": np.random.default_rng(i).random((1, 3, 8, 16), dtype=np.float32)} for i in range(3)]
    _, reopened = reopen(onnx.load(str(folded)), source, declared, samples)
    assert reopened.opened == ["x[0]"] and reopened.fixed == ["x[3] = 16"]
    assert "at x=2,3,8,15 an output's norm is" in reopened.reason  # 2x (32) passed; one shorter did not


def test_an_output_declared_with_a_size_the_graph_does_not_compute_ships_with_the_computed_one(tmp_path, cli):
    """``y`` declared ``[N, 5]`` while the graph computes ``[N, 4]``: the INT8 file keeps the source's symbolic
    batch and the computed width, so ONNX Runtime neither warns on load nor refuses a binding."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "wrong",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [weight])
    model = tmp_path / "wrong.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32))
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", tmp_path / "c.npz", "--format", "onnx", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    dims = onnx.load(str(out / "model.onnx")).graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", 4]
    session = open_session(out / "model.onnx")
    run = session.bind({"x": np.ones((3, 16), np.float32)})
    run(), run()


TOKENS = '''import torch
from torch import nn


class Pooled(nn.Module):
    """Token ids -> 4 scores, mean-pooled over the sequence: runs at any batch and length."""

    def __init__(self):
        super().__init__()
        self.embed, self.mix, self.head = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(torch.relu(self.mix(self.embed(ids))).mean(dim=1))


def build():
    torch.manual_seed(0)
    return Pooled().eval(), torch.zeros(1, 8, dtype=torch.long), AXES
'''


def test_a_factory_declares_its_sequence_axis_dynamic_as_torch_onnx_export_takes_it(cli, tmp_path):
    """``(module, example, dynamic_axes)``: the input takes forward()'s name, both artifacts declare the batch
    and the length dynamic again, and the ONNX artifact runs at another length."""
    factory = tmp_path / "tokens.py"
    factory.write_text(TOKENS.replace("AXES", "{'ids': {0: 'batch', 1: 'sequence'}, 'output': {0: 'batch'}}"))
    ids = np.random.default_rng(0).integers(0, 50, (32, 8))
    np.savez(tmp_path / "c.npz", ids=ids)
    out = tmp_path / "out"
    result = cli("compress", f"{factory}:build", "--calib", tmp_path / "c.npz", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    for decided in json.loads((out / "report.json").read_text())["decisions"]["dynamic_axes"].values():
        assert decided["opened"] == ["ids[0]", "ids[1]"], decided
    assert onnx.load(str(out / "model.onnx")).graph.input[0].name == "ids"
    got, = _session(out / "model.onnx").run(None, {"ids": ids[:3, None].repeat(3, axis=1).reshape(3, 24)})
    assert got.shape == (3, 4)


@pytest.mark.parametrize("axes, says", [("{'tokens': [1]}", "dynamic_axes names unknown input(s) tokens; "
                                                            "the model's inputs are ids"),
                                        ("{'ids': [2]}", "dynamic_axes['ids'] must list axes of a rank-2 input"),
                                        ("[1]", "the third item (dynamic_axes) is a list")])
def test_dynamic_axes_a_factory_gets_wrong_are_refused_in_one_line(cli, tmp_path, axes, says):
    factory = tmp_path / "tokens.py"
    factory.write_text(TOKENS.replace("AXES", axes))
    np.savez(tmp_path / "c.npz", ids=np.zeros((4, 8), np.int64))
    result = cli("compress", f"{factory}:build", "--calib", tmp_path / "c.npz", "--out", tmp_path / "out")
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
