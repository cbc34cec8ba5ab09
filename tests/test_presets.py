"""``preset = "auto"`` (edgeopt.presets), with real OpenVINO and NNCF: a CNN whose activations have a negative tail
is quantized with PERFORMANCE and MIXED and keeps MIXED only where it is closer to FP32; one without (or with
recurrent cells) keeps NNCF's PERFORMANCE; the report says which and why; the repair ladder tries MIXED only where
``auto`` did not, pins what ``auto`` measured, and tries the transformer model type with its own preset.
``edgeopt.passes.closest``, the measurement, with models of known fidelity."""

from __future__ import annotations

import json

import numpy as np
import openvino as ov
import pytest
import torch
from openvino import opset13 as ops
from torch import nn

from conftest import report_schema_errors
from edgeopt.data import SampleSet
from edgeopt.passes.closest import quantize_closest
from edgeopt.passes.quantize import Int8Config, quantize_openvino
from edgeopt.passes.repair import _chosen, _ladder
from edgeopt.presets import MIXED, PERFORMANCE, TOLERANCE, auto_presets, negative_tail_activations


class Block(nn.Module):
    """Two 3x3 Convs, each followed by ``activation``, and a 1x1 Conv head, on 1x3x16x16."""

    def __init__(self, activation: nn.Module):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), activation, nn.Conv2d(16, 16, 3, padding=1),
                                  activation, nn.Conv2d(16, 4, 1))

    def forward(self, x):
        return self.body(x)


class Attending(nn.Module):
    """A SiLU Conv whose features attend to each other: a MatMul of two activations, no Softmax."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x):
        features = nn.functional.silu(self.conv(x)).flatten(2)
        return features @ features.transpose(1, 2)


class Recurrent(nn.Module):
    """Linear -> GELU -> LSTM on 1x8x4."""

    def __init__(self):
        super().__init__()
        self.proj, self.lstm = nn.Linear(4, 8), nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        return self.lstm(nn.functional.gelu(self.proj(x)))[0]


def _openvino(module: nn.Module, shape=(1, 3, 16, 16)):
    torch.manual_seed(0)
    return ov.convert_model(module.eval(), example_input=torch.zeros(*shape))


@pytest.mark.parametrize("activation, op", [
    (nn.SiLU(), "Swish"), (nn.GELU(), "Gelu"), (nn.Hardswish(), "HSwish"), (nn.LeakyReLU(0.1), "PRelu/LeakyRelu"),
    (nn.ReLU(), None), (nn.ReLU6(), None), (nn.Sigmoid(), None)])
def test_activations_with_a_negative_tail_make_auto_try_both_presets(activation, op):
    ov_model = _openvino(Block(activation))
    assert negative_tail_activations(ov_model) == ([op] if op else [])
    assert auto_presets(ov_model, transformer=False).presets == ((PERFORMANCE, MIXED) if op else (PERFORMANCE,))
    assert auto_presets(ov_model, transformer=True).presets == (MIXED,)  # NNCF's for transformers
    assert (("preset", {"preset": MIXED}) in _ladder(ov_model, None)) == (op is None)


def test_a_model_with_recurrent_cells_is_not_measured_and_keeps_the_preset_rung():
    ov_model = _openvino(Recurrent(), (1, 8, 4))
    auto = auto_presets(ov_model, transformer=False)
    assert auto.presets == (PERFORMANCE,) and "Gelu" in auto.reason and "recurrent cells is not measured" in auto.reason
    assert ("preset", {"preset": MIXED}) in _ladder(ov_model, None)


def _asymmetric(quantized) -> list[bool]:
    """For each FakeQuantize on a SiLU's output: whether its range is asymmetric about zero."""
    ranges = [(op.input_value(3).get_node().get_data().ravel()[0], op.input_value(4).get_node().get_data().ravel()[0])
              for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize"
              and op.input_value(0).get_node().get_type_name() == "Swish"]
    assert ranges, "no FakeQuantize on a SiLU output"
    return [not np.isclose(low, -high, rtol=0.02) for low, high in ranges]


@pytest.fixture(scope="module")
def calibration():
    rng = np.random.default_rng(0)
    return SampleSet([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32) * 2} for _ in range(32)],
                     None, "test")


def test_auto_measures_both_presets_and_records_why(calibration):
    auto = quantize_openvino(_openvino(Block(nn.SiLU())), None, calibration, Int8Config())
    choice = auto.preset
    assert choice.chosen_by == "measurement" and choice.samples == 32 and list(choice.cosines) == [PERFORMANCE, MIXED]
    closer = MIXED if choice.cosines[MIXED] > choice.cosines[PERFORMANCE] + TOLERANCE else PERFORMANCE
    assert choice.name == closer and auto.kwargs["preset"].value == closer
    assert auto.note.startswith(f"preset={closer} (chosen by worst-output cosine on 32 calibration samples: "
                                "performance: 0.") and "Swish activations have a negative tail" in auto.note
    assert set(_asymmetric(auto.model)) == {closer == MIXED}
    assert _chosen(auto) == {"preset": closer}  # the repair ladder's later rungs reuse the choice
    for preset in (PERFORMANCE, MIXED):  # a recipe's preset is used as given, nothing measured
        pinned = quantize_openvino(_openvino(Block(nn.SiLU())), None, calibration, Int8Config(preset=preset))
        assert (pinned.preset.chosen_by, pinned.preset.cosines) == ("recipe", None) and _chosen(pinned) == {}
        assert pinned.note.startswith(f"preset={preset} (set by the recipe)")
        assert set(_asymmetric(pinned.model)) == {preset == MIXED}
    relu = quantize_openvino(_openvino(Block(nn.ReLU())), None, calibration, Int8Config())
    assert relu.preset.chosen_by == "rule" and _chosen(relu) == {}
    assert relu.note.startswith("preset=performance (NNCF's for models that are not transformers: no activation "
                                "with a negative tail)")


def test_the_ladders_transformer_rung_uses_the_transformers_preset_not_the_pinned_one(calibration):
    ov_model = _openvino(Attending())
    rungs = dict(_ladder(ov_model, None))
    assert rungs["model_type"] == {"model_type": "transformer", "preset": "auto"} and "preset" not in rungs
    pinned_by_the_int8_rung = {"preset": PERFORMANCE}
    tried = quantize_openvino(ov_model, None, calibration, Int8Config(**{**pinned_by_the_int8_rung,
                                                                          **rungs["model_type"]}))
    assert tried.preset.name == MIXED and tried.note.startswith("preset=mixed (NNCF's for transformers)")


def test_the_report_records_the_preset(cli, tmp_path):
    onnx_path = tmp_path / "silu.onnx"
    torch.manual_seed(0)
    torch.onnx.export(Block(nn.SiLU()).eval(), (torch.zeros(1, 3, 16, 16),), str(onnx_path), input_names=["x"],
                      dynamo=False)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((16, 1, 3, 16, 16)).astype(np.float32))
    result = cli("compress", onnx_path, "--calib", tmp_path / "calib.npz", "--format", "openvino", "--out",
                 tmp_path / "out", "--json", tmp_path / "r.json", "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    preset = report["decisions"]["int8"]["preset"]
    assert preset["chosen_by"] == "measurement" and set(preset["cosines"]) == {PERFORMANCE, MIXED}
    assert f"preset={preset['name']} (chosen by worst-output cosine on 16 calibration samples" in report["notes"][0]
    assert report_schema_errors(report) == []


def _identity():
    """ReLU(x) on a [1, 8] input ``x``: the identity on the positive samples below."""
    parameter = ops.parameter([1, 8], ov.Type.f32, name="x")
    parameter.output(0).get_tensor().set_names({"x"})
    return ov.Model([ops.relu(parameter)], [parameter])


def _shifted(ov_model, shift: float):
    """``ov_model``'s input plus ``shift``: a model whose cosine to the identity falls as ``shift`` grows."""
    x = ov_model.get_parameters()[0]
    parameter = ops.parameter(x.get_partial_shape(), x.get_element_type(), name="x")
    parameter.output(0).get_tensor().set_names({"x"})
    return ov.Model([ops.add(parameter, ops.constant(np.float32(shift)))], [parameter])


@pytest.mark.parametrize("read_back", [False, True])
def test_the_closest_candidate_is_kept_and_the_first_wins_ties_and_the_tolerance(read_back):
    rng = np.random.default_rng(0)
    samples = [{"x": rng.uniform(0.5, 1.5, (1, 8)).astype(np.float32)} for _ in range(4)]

    def keep(candidates: dict, tolerance: float = 0.0):
        return quantize_closest(_identity(), samples, candidates, _shifted, tolerance=tolerance, read_back=read_back)

    closest = keep({"far": 0.5, "near": 0.0, "mid": 0.1})
    assert (closest.choice, closest.label, closest.samples) == (0.0, "near", 4)
    assert closest.cosines["near"] == pytest.approx(1.0) and closest.cosines["far"] < closest.cosines["mid"] < 1.0
    assert closest.figures.startswith("far: 0.") and ", near: 1.0000" in closest.figures
    assert keep({"first": 0.0, "second": 0.0}).label == "first"  # a tie keeps the first, the default
    gain = keep({"far": 0.5, "near": 0.0}).cosines
    assert keep({"far": 0.5, "near": 0.0}, tolerance=(gain["near"] - gain["far"]) * 2).label == "far"


def test_a_handful_of_calibration_samples_is_said_to_be_few(calibration):
    few = quantize_openvino(_openvino(Block(nn.ReLU())), None, SampleSet(calibration.samples[:4], None, "test"),
                            Int8Config())
    assert "subset=4 samples (few: activation ranges from fewer than 16 samples are noisy" in few.note
    enough = quantize_openvino(_openvino(Block(nn.ReLU())), None, calibration, Int8Config())
    assert "subset=32 samples, model_type" in enough.note


class FlaxNorm(nn.Module):
    """A Linear, then a LayerNorm written out as flax exports it (variance as E[x^2] - E[x]^2, clamped at 0, plus
    epsilon, divided by its square root), then a Linear: Magika's file-type classifier's layout, no attention."""

    def __init__(self):
        super().__init__()
        self.mix, self.head = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = self.mix(x)
        mean = h.sum(-1, keepdim=True) * (1 / 32)
        variance = torch.clamp(((h * h).sum(-1, keepdim=True) * (1 / 32)) - mean * mean, min=0.0)
        return self.head((h - mean) / torch.sqrt(variance + 1e-6))


def test_a_layernorm_written_out_is_seen_named_in_the_note_and_tried_as_a_transformer_by_repair():
    """Magika's INT8 read cosine 0.956 as a default model and 0.9999 with model_type = "transformer": a default
    model's normalisations by a computed statistic are counted, said in the model type's reason, and give the
    repair ladder its model_type rung (which only MatMuls of two activations gave)."""
    from edgeopt.model_type import detect_model_type

    kind = detect_model_type(None, _openvino(FlaxNorm(), (1, 16)))
    assert kind.name == "default" and kind.normalisations == 1, kind
    assert "1 normalisation(s) by a computed statistic" in kind.reason
    assert dict(_ladder(_openvino(FlaxNorm(), (1, 16)), None))["model_type"] == {"model_type": "transformer",
                                                                                  "preset": "auto"}
    assert detect_model_type(None, _openvino(Block(nn.ReLU()))).normalisations == 0
