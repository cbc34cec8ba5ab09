"""Every output counts: per-output fidelity in report.json, the gate on the worst gated output (--outputs),
top-1 agreement only for classifier outputs; and transformers recognised from the graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edgeopt.evaluate import Fidelity, Outputs, Quality, QualityGate, labelled_output
from edgeopt.model_type import detect_model_type

HERE = Path(__file__).resolve().parent


class FaceHeads(nn.Module):
    """MTCNN ONet-shaped: a conv trunk and three heads — box [1, 4], landmarks [1, 10], face probability [1, 2].
    The landmarks head is deliberately fragile: the difference of two nearly equal layers, scaled up, so INT8
    noise swamps it while the other two heads stay close."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                                   nn.AvgPool2d(5), nn.Flatten(), nn.Linear(128, 64), nn.ReLU())
        self.box, self.prob = nn.Linear(64, 4), nn.Linear(64, 2)
        self.mark_a, self.mark_b = nn.Linear(64, 10), nn.Linear(64, 10)
        with torch.no_grad():
            self.mark_b.weight.copy_(self.mark_a.weight + 1e-3 * torch.randn_like(self.mark_a.weight))
            self.mark_b.bias.copy_(self.mark_a.bias)

    def forward(self, x):
        h = self.trunk(x)
        return self.box(h), (self.mark_b(h) - self.mark_a(h)) * 100.0, torch.softmax(self.prob(h), dim=1)


@pytest.fixture(scope="module")
def three_outputs(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("three")
    torch.manual_seed(0)
    path = folder / "onet.onnx"
    torch.onnx.export(FaceHeads().eval(), (torch.zeros(1, 3, 48, 48),), str(path), dynamo=False, opset_version=13,
                      input_names=["image"], output_names=["box", "landmarks", "prob"])
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", image=rng.random((32, 3, 48, 48), dtype=np.float32))
    np.savez(folder / "eval.npz", image=rng.random((24, 3, 48, 48), dtype=np.float32))
    return {"model": path, "calib": folder / "calib.npz", "eval": folder / "eval.npz"}


def compress_ir(cli, model: dict, out, *extra: str):
    """``edgeopt compress`` of the three-output model to an IR, gated at cosine 0.98 on every output."""
    return cli("compress", model["model"], "--calib", model["calib"], "--eval", model["eval"], "--out", out,
               "--format", "openvino", "--min-cosine", "0.98", *extra)


def test_three_output_model_is_gated_on_every_output(tmp_path, three_outputs, cli):
    out = tmp_path / "all"
    result = compress_ir(cli, three_outputs, out)
    assert result.exit_code == 3, result.output
    report = json.loads((out / "report.json").read_text())
    quality = report["quality"]["artifacts"]["openvino"]
    outputs = quality["outputs"]
    assert list(outputs) == ["box", "landmarks", "prob"]
    assert outputs["landmarks"]["cosine"] < 0.98 <= min(outputs["box"]["cosine"], outputs["prob"]["cosine"])
    assert quality["fidelity"]["output"] == "landmarks" and "landmarks" in quality["check"]
    # top-1 agreement only where the output is a classifier (the softmax probabilities)
    assert outputs["prob"]["top1_agreement"] is not None
    assert outputs["box"]["top1_agreement"] is None and outputs["landmarks"]["top1_agreement"] is None
    assert "landmarks" in result.output and "fidelity per output" in result.output

    named = tmp_path / "named"
    result = compress_ir(cli, three_outputs, named, "--outputs", "box,prob")
    assert result.exit_code == 0, result.output
    report = json.loads((named / "report.json").read_text())
    assert report["quality"]["gate"]["outputs"] == ["box", "prob"]
    assert set(report["quality"]["artifacts"]["openvino"]["outputs"]) == {"box", "landmarks", "prob"}  # still reported


def test_int8_ac_scores_every_output(tmp_path, three_outputs, cli):
    """Accuracy control judged like the gate: the worst output's cosine, so it reverts what the fragile landmarks
    head needs (scored on the first output alone it stopped with the landmarks failing the gate)."""
    out = tmp_path / "ac"
    result = compress_ir(cli, three_outputs, out, "--recipe", "int8_ac")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert any(note.startswith("int8_ac: cosine to FP32 (worst of 3 outputs)") for note in report["notes"])
    outputs = report["quality"]["artifacts"]["openvino"]["outputs"]
    assert min(o["cosine"] for o in outputs.values()) >= 0.98
    assert report["artifacts"][0]["precision"] == "int8"


def test_unknown_gated_output_is_bad_input(tmp_path, three_outputs, cli):
    result = cli("compress", three_outputs["model"], "--calib", three_outputs["calib"], "--eval",
                 three_outputs["eval"], "--out", tmp_path / "o", "--outputs", "box,nose")
    assert result.exit_code == 2 and "nose" in result.output and "landmarks" in result.output


def test_gate_with_labels_checks_top1_and_the_other_outputs():
    def fidelity(name, cosine):
        return Fidelity(cosine, 0.0, 0.0, None, name)

    reference = Quality("original", 0.9, None, top1_output="prob")
    candidate = Quality("openvino", 0.9, fidelity("landmarks", 0.5), None,
                        (fidelity("box", 0.999), fidelity("landmarks", 0.5), fidelity("prob", 0.2)), "prob")
    ok, message = QualityGate().check(reference, candidate)
    assert not ok and "top-1 drop 0.00 pp" in message and "landmarks" in message
    ok, _ = QualityGate(outputs=("box", "prob")).check(reference, candidate)
    assert ok  # prob is judged by its labels, box by cosine; landmarks is not gated
    # a --min-cosine given on the command line judges the labelled output too
    from edgeopt.cli.gate_options import quality_gate

    assert not quality_gate(None, None, 0.9, 1.1).cosine_on_labelled
    given = quality_gate(None, 0.99, 0.9, 1.1, "box,prob")
    ok, message = given.check(reference, candidate)
    assert given.cosine_on_labelled and not ok and "cosine 0.20000 (min 0.99) on output 'prob'" in message


class SdpaEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = (t.reshape(1, 8, 4, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(attended.transpose(1, 2).reshape(1, 8, 32))


def test_transformers_recognised_from_sdpa_and_spelled_out_attention(tmp_path, tiny_torch):
    import onnx
    import openvino as ov

    example = torch.zeros(1, 8, 32)
    encoder = SdpaEncoder().eval()
    ir = ov.convert_model(encoder, example_input=example)
    assert "ScaledDotProductAttention" in {op.get_type_name() for op in ir.get_ops()}
    found = detect_model_type(ov_model=ir)
    assert found.is_transformer and "ScaledDotProductAttention" in found.reason
    path = tmp_path / "sdpa.onnx"
    torch.onnx.export(encoder, (example,), str(path), dynamo=False, opset_version=17)
    found = detect_model_type(onnx_model=onnx.load(str(path)))
    assert found.is_transformer and "MatMul-Softmax-MatMul" in found.reason
    assert detect_model_type(ov_model=ov.convert_model(str(path))).is_transformer

    fused = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=4)],
        "g", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8, 32]) for n in "qkv"],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 32])]))
    assert "MultiHeadAttention" in detect_model_type(onnx_model=fused).reason

    cnn, cnn_example = tiny_torch
    assert not detect_model_type(ov_model=ov.convert_model(cnn, example_input=cnn_example)).is_transformer
    assert detect_model_type("transformer").reason == "a transformers model"


def test_int8_notes_the_detected_transformer(tmp_path, cli):
    (tmp_path / "enc.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import torch\nfrom test_outputs import SdpaEncoder\n"
        "def build():\n    torch.manual_seed(0)\n    return SdpaEncoder().eval(), torch.zeros(1, 8, 32)\n")
    np.savez(tmp_path / "x.npz", input=np.random.default_rng(0).standard_normal((16, 1, 8, 32)).astype(np.float32))
    out = tmp_path / "out"
    result = cli("compress", f"{tmp_path / 'enc.py'}:build", "--calib", tmp_path / "x.npz", "--out", out,
                 "--format", "openvino")
    assert result.exit_code == 0, result.output
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert any("preset=mixed" in n and "model_type=transformer (fused attention op ScaledDotProductAttention)" in n
               and "chosen by worst-output cosine" in n for n in notes), notes


def _outputs(**shapes) -> Outputs:
    rng = np.random.default_rng(0)
    return Outputs(list(shapes), [rng.random((4, *shape[1:])) for shape in shapes.values()], list(shapes.values()))


def test_labels_are_scored_on_a_classifier_output_only():
    """A score per class: the softmax 'prob' before the box head that comes first, a lone unnamed logits output,
    never features such as a pooler's (an argmax there is meaningless) nor a guess among several heads."""
    heads = _outputs(box=(1, 4), landmarks=(1, 10), prob=(1, 2))
    heads.values[2] = heads.values[2] / heads.values[2].sum(axis=1, keepdims=True)
    assert labelled_output(heads) == "prob"
    assert labelled_output(heads, ("box", "landmarks")) is None  # no classifier gated, two to guess from
    assert labelled_output(_outputs(box=(1, 4), landmarks=(1, 10))) is None
    assert labelled_output(_outputs(output=(1, 1000))) == "output"  # unnamed logits still count
    assert labelled_output(_outputs(last_hidden_state=(1, 8, 16), pooler_output=(1, 16))) is None
    assert labelled_output(_outputs(logits=(1, 3), hidden_states=(1, 3))) == "logits"
    squeezed = Outputs(["output_0_squeeze_175"], [np.random.default_rng(0).random((4, 24))], [(24,)])
    assert labelled_output(squeezed) == "output_0_squeeze_175"  # madmom's key CNN: its batch axis squeezed away


def test_labels_without_a_classifier_are_noted_and_out_of_range_labels_refused(tmp_path, three_outputs, cli):
    folder = tmp_path / "data"
    folder.mkdir()
    images = np.load(three_outputs["eval"])["image"]
    np.savez(folder / "labelled.npz", image=images, labels=np.arange(len(images)) % 2)
    out = tmp_path / "features"
    result = compress_ir(cli, {**three_outputs, "eval": folder / "labelled.npz"}, out, "--outputs", "landmarks",
                         "--min-cosine", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["quality"]["artifacts"]["openvino"]["top1"] is None
    assert any(note.startswith("labels in ") and "not scored: no gated output gives one score per class "
               "(landmarks [1, 10])" in note for note in report["notes"]), report["notes"]

    np.savez(folder / "wide.npz", image=images, labels=np.full(len(images), 5))
    result = compress_ir(cli, {**three_outputs, "eval": folder / "wide.npz"}, tmp_path / "wide")
    assert result.exit_code == 2, result.output
    assert "label 5 is not a class of output 'prob', which scores 2 classes (0..1)" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "wide" / "report.json").exists()


def test_long_output_names_wrap_in_the_fidelity_table(capsys):
    """Output names from other toolkits run long (TensorFlow's ``StatefulPartitionedCall/...:0``): the table wraps
    them rather than cutting them to an ellipsis."""
    from types import SimpleNamespace

    from rich.console import Console

    from edgeopt.reporting.console import print_output_fidelity

    long = "StatefulPartitionedCall/functional_1/detection_head/box_regression_output_of_the_second_stage:0"
    rows = [SimpleNamespace(output=name, cosine=0.99, max_abs_error=0.1, mean_abs_error=0.01, top1_agreement=None)
            for name in (long, "scores")]
    result = SimpleNamespace(qualities={"onnx": SimpleNamespace(outputs=rows)},
                             gate=SimpleNamespace(gated=lambda quality: rows))
    print_output_fidelity(result, Console(width=80))
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "gated" in line)
    start, end = header.index("output"), header.index("gated")
    column = "".join(line[start:end].strip() for line in lines[lines.index(header) + 2:])
    assert "…" not in column and column.startswith(long)  # wrapped over lines, whole


def test_inf_or_nan_the_original_lacks_fails_the_gate_and_shared_ones_agree():
    """An INT8 log-mel that rounds a power to 0 gives -inf where FP32 is finite (openWakeWord's melspectrogram):
    such a sample scores cosine 0, disagrees, is counted, and fails the gate whatever the cosine; where the
    original itself gives inf or NaN, that position is left out (not the candidate's error)."""
    from edgeopt.evaluate import compare_outputs

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(10, 32)).astype(np.float32)
    reference[0, 3], reference[1, 2] = -np.inf, np.nan  # the original's own log of an exact zero, and a NaN
    outputs = reference + rng.normal(scale=1e-3, size=reference.shape).astype(np.float32)
    outputs[0, 3], outputs[1, 2] = -np.inf, 0.5  # the same inf; a finite value where the original has NaN
    agreeing = compare_outputs(outputs, reference, output="mel")
    assert agreeing.non_finite == 0 and agreeing.cosine > 0.999 and np.isfinite(agreeing.max_abs_error)
    assert agreeing.top1_agreement == 1.0
    outputs[4, 7], outputs[6, :] = -np.inf, np.nan
    broken = compare_outputs(outputs, reference, output="mel")
    assert broken.non_finite == 2 and broken.cosine == pytest.approx(0.8, abs=1e-5)  # 8 of 10 samples at ~1
    assert np.isfinite(broken.max_abs_error)  # the finite samples' errors
    assert broken.top1_agreement == pytest.approx(0.8)  # a broken sample disagrees
    scores = compare_outputs(outputs[:, :1], reference[:, :1] + 1.0, output="score")  # one value per sample
    vad = rng.uniform(0, 1, (20, 1))
    noisy = vad + rng.normal(0, 0.2, vad.shape)
    plain = compare_outputs(noisy, vad, output="speech").cosine
    vad[:5] = np.nan  # the original's own NaN scores are left out, not read as agreement
    assert compare_outputs(noisy, vad, output="speech").cosine == pytest.approx(compare_outputs(
        noisy[5:], vad[5:], output="speech").cosine) and compare_outputs(noisy, vad).cosine < plain + 0.1
    with np.errstate(divide="ignore"):
        logprobs = np.log(np.array([[0.0, 0.7, 0.3], [0.0, 0.2, 0.8]]))  # -inf at class 0 in the original
    swapped = np.log(np.array([[0.01, 0.3, 0.7], [0.01, 0.8, 0.2]]))  # finite, the other class on top
    assert compare_outputs(swapped, logprobs).top1_agreement == 0.0  # not 1.0 from the zero-filled -inf
    assert compare_outputs(np.zeros((4, 0)), np.zeros((4, 0))).cosine == 1.0  # an empty output
    assert scores.non_finite == 1 and 0 < scores.cosine < 1 and type(scores.cosine) is float  # reports: JSON
    gate = QualityGate(min_cosine=0.5)
    original = Quality("fp32", None, None)
    passed, message = gate.check(original, Quality("int8", None, broken, outputs=(broken,)))
    assert not passed and "output 'mel' gives inf or NaN on 2 sample(s)" in message, message
    assert gate.check(original, Quality("int8", None, agreeing, outputs=(agreeing,)))[0]
