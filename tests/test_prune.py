"""Structured channel pruning (torch-pruning) and unstructured sparsity (nncf.prune) on a tiny real model."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch_pruning as tp

from edgeopt.data import load_samples
from edgeopt.device.runtime import RuntimeSettings, open_session, random_feeds
from edgeopt.errors import BadInputError
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.prune import PruneConfig, prune
from edgeopt.passes.sparsify import SparsifyConfig, sparsify
from edgeopt.pipeline import compress
from edgeopt.source import load_model


@pytest.fixture
def working(tiny_factory, tiny_calib):
    source = load_model(tiny_factory)
    ctx = PassContext(calibration=load_samples(tiny_calib, source.inputs), quiet=True)
    return WorkingModel(source, torch_module=copy.deepcopy(source.torch_module)), ctx


def _counts(module, example):
    macs, params = tp.utils.count_ops_and_params(module, example)
    return params, macs


def test_prune_removes_channels_keeps_output_shape(working):
    model, ctx = working
    example = model.source.example_input
    params_before, macs_before = _counts(model.torch_module, example)
    prune(model, ctx, PruneConfig(ratio=0.5))
    net = model.torch_module
    assert (net.conv1.out_channels, net.conv2.in_channels, net.conv2.out_channels) == (4, 4, 8)
    assert (net.head.in_features, net.head.out_features) == (8 * 4 * 4, 10)  # the output layer keeps its classes
    with torch.no_grad():
        assert net(*example).shape == (1, 10)
    params_after, macs_after = _counts(net, example)
    assert params_after < 0.6 * params_before and macs_after < 0.6 * macs_before
    assert "params" in model.notes[-1] and "kept head" in model.notes[-1]


def test_prune_per_layer_ratios_ignored_layers_and_global(working):
    model, ctx = working
    prune(model, ctx, PruneConfig(ratio=0.5, ignored_layers=["conv1"], layer_ratios={"conv2": 0.25}))
    assert (model.torch_module.conv1.out_channels, model.torch_module.conv2.out_channels) == (8, 12)
    model.torch_module = copy.deepcopy(model.source.torch_module)
    prune(model, ctx, PruneConfig(ratio=0.5, scope="global", importance="l1"))
    remaining = model.torch_module.conv1.out_channels + model.torch_module.conv2.out_channels
    assert remaining == 12  # half of the 24 prunable channels, wherever they are least important


@pytest.mark.parametrize("params, message", [
    ({"ratio": 1.5}, r"ratio must be in \[0, 1\)"),
    ({"scope": "row"}, "scope must be"),
    ({"importance": "taylor2"}, "importance must be one of"),
    ({"ignored_layers": ["nope"]}, "no module named nope"),
])
def test_prune_rejects_bad_parameters(working, params, message):
    model, ctx = working
    with pytest.raises(BadInputError, match=message):
        prune(model, ctx, PruneConfig(**params))


def test_pruned_model_runs_in_openvino_and_onnxruntime(tiny_factory, tiny_calib, tmp_path):
    result = compress(tiny_factory, tiny_calib, out=tmp_path / "out", recipe="prune", step_report=False)
    outputs = {}
    for artifact in result.artifacts:
        session = open_session(artifact.path, RuntimeSettings(runtime=artifact.runtime, threads=1))
        assert [tuple(spec.shape) for spec in session.static_inputs] == [(1, 1, 8, 8)]  # batch dynamic, recorded 1
        outputs[artifact.format] = session.infer(random_feeds(session.static_inputs, seed=1))[0]
        assert outputs[artifact.format].shape == (1, 10)
    np.testing.assert_allclose(outputs["openvino"], outputs["onnx"], rtol=1e-4, atol=1e-5)
    unpruned = compress(tiny_factory, tiny_calib, out=tmp_path / "fp32", recipe="", formats=("openvino",))
    assert result.artifacts[0].bytes < 0.75 * unpruned.artifacts[0].bytes  # XML overhead weighs on a tiny net


@pytest.mark.parametrize("mode", ["local", "global"])
def test_sparsify_magnitude_zeroes_weights_in_place(working, mode):
    model, ctx = working
    sparsify(model, ctx, SparsifyConfig(ratio=0.5, mode=mode, epochs=1))
    net = model.torch_module
    assert not any("mask" in name for name, _ in net.named_parameters())  # masks stripped into the weights
    zeros = [float((layer.weight == 0).float().mean()) for layer in (net.conv1, net.conv2)]
    if mode == "local":
        assert all(abs(z - 0.5) < 0.05 for z in zeros)
    else:
        total = net.conv1.weight.numel() + net.conv2.weight.numel()
        overall = (zeros[0] * net.conv1.weight.numel() + zeros[1] * net.conv2.weight.numel()) / total
        assert abs(overall - 0.5) < 0.05
    assert float((net.head.weight == 0).float().mean()) < 0.01  # the output layer is left dense
    with torch.no_grad():
        assert net(*model.source.example_input).shape == (1, 10)


def test_sparsify_regularization_learns_masks(working):
    model, ctx = working
    sparsify(model, ctx, SparsifyConfig(ratio=0.5, mode="regularization", epochs=2, batch_size=8, mask_lr=0.5))
    net = model.torch_module
    assert float((net.conv2.weight == 0).float().mean()) > 0.2
    assert "regularization" in model.notes[-1]


def test_torch_steps_on_onnx_input_exit_2(cli, tiny_onnx, tiny_calib, tmp_path):
    for recipe in ("prune,int8", "distill", "sparsify", "qat"):
        result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--recipe", recipe, "--out", tmp_path / "out")
        assert result.exit_code == 2, result.output
        assert "need(s) a PyTorch model" in result.stderr and "Traceback" not in result.output
        assert not (tmp_path / "out").exists()


def test_cli_prune_distill_int8_step_report(cli, tiny_factory, tiny_calib, tmp_path):
    report = tmp_path / "report.json"
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--train", tiny_calib, "--recipe",
                 "prune,distill,int8", "--out", tmp_path / "out", "--json", report, "--quiet")
    assert result.exit_code == 0, result.output
    steps = json.loads(report.read_text())["steps"]
    rows = {row["step"]: row for row in steps["rows"]}
    assert list(rows) == ["original", "prune", "distill", "int8"]
    assert rows["prune"]["params"] < rows["original"]["params"] and rows["prune"]["macs"] < rows["original"]["macs"]
    assert max(rows["prune"]["ir_bytes"], rows["distill"]["ir_bytes"]) < rows["original"]["ir_bytes"]
    assert rows["int8"]["precision"] == "int8" and all(row["p50_ms"] > 0 for row in rows.values())
    assert steps["measured_with"]["settings"]["inference_precision"] == "f32"
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["steps"]["rows"] == steps["rows"]
    # size ratios are against the original model, not the pruned one
    assert saved["fp32_ir_bytes"] == pytest.approx(rows["original"]["ir_bytes"], rel=0.01)
    assert saved["fp32_ir_bytes"] > rows["prune"]["ir_bytes"]
    assert [s["name"] for s in saved["recipe_steps"]] == ["prune", "distill", "int8"]
