"""Knowledge distillation and quantization-aware training on small real models (digits teacher, tiny student)."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import openvino as ov
import pytest
import torch
import torch.nn.functional as F

from conftest import DIGITS_CALIB, DIGITS_MODEL, TinyNet
from edgeopt.data import SampleSet, load_samples
from edgeopt.device.runtime import RuntimeSettings, open_session, random_feeds
from edgeopt.distillation import DistillConfig, TrainingSet, distill_loss, evaluate_loss, fine_tune
from edgeopt.errors import BadInputError
from edgeopt.source import load_model


@pytest.fixture(scope="module")
def digits():
    """The trained digits CNN as teacher and its 300 labelled calibration samples."""
    source = load_model(DIGITS_MODEL)
    return source.torch_module, TrainingSet.from_samples(load_samples(DIGITS_CALIB, source.inputs), source.input_names)


def _student(seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return TinyNet()


def test_distillation_lowers_the_loss_and_teaches_the_task(digits):
    teacher, data = digits
    student, config = _student(), DistillConfig(epochs=5, lr=3e-3, batch_size=16, seed=0)
    before = evaluate_loss(student, teacher, data, config)
    losses = fine_tune(student, teacher, data, config, quiet=True)
    after = evaluate_loss(student, teacher, data, config)
    assert after < 0.5 * before and losses[-1] < losses[0]
    with torch.no_grad():
        accuracy = float((student(data.inputs[0]).argmax(1) == data.labels).float().mean())
    assert accuracy > 0.5  # from chance (0.1) towards the teacher, on labels it was trained with


def test_output_matching_without_labels(digits):
    teacher, data = digits
    unlabelled = TrainingSet(data.inputs, None)
    student, config = _student(), DistillConfig(epochs=5, lr=3e-3, batch_size=16)
    with torch.no_grad():
        student_out, teacher_out = student(data.inputs[0][:8]), teacher(data.inputs[0][:8])
    assert torch.equal(distill_loss(student_out, teacher_out, None, 4.0, 0.7), F.mse_loss(student_out, teacher_out))
    before = evaluate_loss(student, teacher, unlabelled, config)
    fine_tune(student, teacher, unlabelled, config, quiet=True)
    assert evaluate_loss(student, teacher, unlabelled, config) < 0.75 * before


def test_loss_is_kl_on_softened_logits_plus_task_loss():
    torch.manual_seed(0)
    student, teacher, labels = torch.randn(16, 10), torch.randn(16, 10), torch.randint(0, 10, (16,))
    assert float(distill_loss(teacher, teacher, labels, 4.0, 1.0)) == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(distill_loss(student, teacher, labels, 4.0, 0.0), F.cross_entropy(student, labels))
    kl = F.kl_div(F.log_softmax(student / 2, 1), F.softmax(teacher / 2, 1), reduction="batchmean") * 4
    mixed = 0.25 * kl + 0.75 * F.cross_entropy(student, labels)
    assert torch.allclose(distill_loss(student, teacher, labels, 2.0, 0.25), mixed, atol=1e-6)


def test_every_output_counts_and_the_gated_ones_choose():
    """Several outputs: the labelled one (first classifier-shaped) gets KL + task loss, every other MSE, summed;
    the distilled outputs are the gated ones (by index); integer outputs carry no loss."""
    from edgeopt.distillation import selected_outputs

    torch.manual_seed(0)
    logits, teacher_logits, labels = torch.randn(16, 10), torch.randn(16, 10), torch.randint(0, 10, (16,))
    marks, teacher_marks = torch.randn(16, 5, 2), torch.randn(16, 5, 2)
    ids = torch.zeros(16, dtype=torch.int64)
    both = distill_loss((logits, marks, ids), (teacher_logits, teacher_marks, ids), labels, 2.0, 0.25)
    expected = distill_loss(logits, teacher_logits, labels, 2.0, 0.25) + F.mse_loss(marks, teacher_marks)
    assert torch.allclose(both, expected, atol=1e-6)
    assert torch.allclose(distill_loss((logits, marks), (teacher_logits, teacher_marks), None, 2.0, 0.25),
                          F.mse_loss(logits, teacher_logits) + F.mse_loss(marks, teacher_marks))
    only_marks = selected_outputs((logits, marks, ids), (1,))
    assert len(only_marks) == 1 and only_marks[0] is marks


def test_deterministic_with_a_seed(digits):
    teacher, data = digits
    small = TrainingSet(tuple(t[:96] for t in data.inputs), data.labels[:96])
    runs = []
    for seed in (0, 0, 1):
        student = _student()
        fine_tune(student, teacher, small, DistillConfig(epochs=2, batch_size=32, seed=seed), quiet=True)
        runs.append(student.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not all(torch.equal(runs[0][k], runs[2][k]) for k in runs[0])


@pytest.mark.parametrize("params", [{"alpha": 1.5}, {"temperature": 0}, {"lr": -1.0}, {"epochs": -1}])
def test_bad_settings_are_typed_errors(params):
    with pytest.raises(BadInputError):
        DistillConfig(**params)


def test_distill_step_uses_train_data_and_bad_params_exit_2(cli, tiny_factory, tiny_calib, tmp_path):
    rng = np.random.default_rng(1)
    train = tmp_path / "train.npz"
    np.savez(train, input=rng.random((96, 1, 8, 8), dtype=np.float32), labels=rng.integers(0, 10, 96))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[[step]]\nname = "distill"\nepochs = 1\n')
    report = tmp_path / "report.json"
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--train", train, "--recipe", recipe,
                 "--precision", "fp32", "--no-step-report", "--out", tmp_path / "out", "--json", report, "--quiet")
    assert result.exit_code == 0, result.output
    described = json.loads(report.read_text())
    assert any(note.startswith("distill: 1 epoch(s) on 96 samples") for note in described["notes"])
    assert described["steps"] is None
    recipe.write_text('[[step]]\nname = "distill"\nalpha = 2.0\n')
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--recipe", recipe, "--out", tmp_path / "bad")
    assert result.exit_code == 2 and "distill: alpha must be in [0, 1]" in result.stderr
    assert not (tmp_path / "bad").exists()


def test_qat_exports_int8_to_openvino_and_onnx(cli, tiny_factory, tiny_calib, tmp_path):
    recipe = tmp_path / "qat.toml"
    recipe.write_text('[[step]]\nname = "qat"\nepochs = 1\nlr = 1e-4\n')
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--recipe", recipe, "--no-step-report",
                 "--out", tmp_path / "out", "--quiet")
    assert result.exit_code == 0, result.output
    ir_ops = {op.get_type_name() for op in ov.Core().read_model(str(tmp_path / "out" / "model.xml")).get_ops()}
    onnx_ops = {node.op_type for node in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node}
    assert "FakeQuantize" in ir_ops and {"QuantizeLinear", "DequantizeLinear"} <= onnx_ops
    feeds = random_feeds(load_model(tiny_factory).inputs, seed=2)
    outputs = [open_session(tmp_path / "out" / name, RuntimeSettings(runtime=runtime, threads=1)).infer(feeds)[0]
               for name, runtime in (("model.xml", "openvino"), ("model.onnx", "onnxruntime"))]
    assert outputs[0].shape == outputs[1].shape == (1, 10)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["artifacts"][0]["precision"] == "int8"


def test_qat_followed_by_int8_is_rejected(cli, tiny_factory, tiny_calib, tmp_path):
    result = cli("compress", tiny_factory, "--calib", tiny_calib, "--recipe", "qat,int8", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "qat already sets the model's precision" in result.stderr
    assert not (tmp_path / "out").exists()


def test_distill_on_a_torchscript_model_is_a_clear_error(tmp_path, tiny_calib):
    from edgeopt.passes.base import PassContext, WorkingModel
    from edgeopt.passes.distill import DistillStepConfig, distill

    scripted = torch.jit.trace(TinyNet().eval(), torch.zeros(1, 1, 8, 8))
    path = tmp_path / "tiny.pt"
    scripted.save(str(path))
    source = load_model(path, {"input": (1, 1, 8, 8)})
    model = WorkingModel(source, torch_module=copy.deepcopy(source.torch_module))
    ctx = PassContext(calibration=load_samples(tiny_calib, source.inputs))
    with pytest.raises(BadInputError, match="needs a PyTorch nn.Module from file.py:factory"):
        distill(model, ctx, DistillStepConfig())


def test_sample_set_without_labels_gives_no_training_labels():
    data = SampleSet([{"input": np.zeros((1, 1, 8, 8), np.float32)}] * 4, None, "zeros")
    assert TrainingSet.from_samples(data, ["input"]).labels is None
