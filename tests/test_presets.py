"""``preset = "auto"`` (edgeopt.presets), with real OpenVINO and NNCF: a CNN whose activations have a negative tail
is quantized with PERFORMANCE and MIXED and keeps the one closer to FP32; one without keeps NNCF's PERFORMANCE; the
repair ladder tries MIXED only where ``auto`` did not, and pins what ``auto`` measured."""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
import torch
from torch import nn

from edgeopt.data import SampleSet
from edgeopt.passes.quantize import Int8Config, quantize_openvino
from edgeopt.passes.repair import _chosen, _ladder
from edgeopt.presets import MIXED, PERFORMANCE, auto_presets, negative_tail_activations


class Block(nn.Module):
    """Two 3x3 Convs, each followed by ``activation``, and a 1x1 Conv head, on 1x3x16x16."""

    def __init__(self, activation: nn.Module):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), activation, nn.Conv2d(16, 16, 3, padding=1),
                                  activation, nn.Conv2d(16, 4, 1))

    def forward(self, x):
        return self.body(x)


def _openvino(activation: nn.Module):
    torch.manual_seed(0)
    return ov.convert_model(Block(activation).eval(), example_input=torch.zeros(1, 3, 16, 16))


@pytest.mark.parametrize("activation, op", [
    (nn.SiLU(), "Swish"), (nn.GELU(), "Gelu"), (nn.Hardswish(), "HSwish"), (nn.LeakyReLU(0.1), "PRelu"),
    (nn.ReLU(), None), (nn.ReLU6(), None), (nn.Sigmoid(), None)])
def test_activations_with_a_negative_tail_make_auto_try_both_presets(activation, op):
    ov_model = _openvino(activation)
    assert negative_tail_activations(ov_model) == ([op] if op else [])
    assert auto_presets(ov_model, transformer=False) == ((PERFORMANCE, MIXED) if op else (PERFORMANCE,))
    assert auto_presets(ov_model, transformer=True) == (MIXED,)  # NNCF's for transformers, whatever the activation
    assert (("preset", {"preset": MIXED}) in _ladder(ov_model, None)) == (op is None)


def _asymmetric(quantized) -> list[bool]:
    """For each FakeQuantize on an activation's output: whether its range is asymmetric about zero."""
    ranges = [(op.input_value(3).get_node().get_data().ravel()[0], op.input_value(4).get_node().get_data().ravel()[0])
              for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize"
              and op.input_value(0).get_node().get_type_name() in ("Swish", "Relu")]
    assert ranges, "no FakeQuantize on an activation"
    return [not np.isclose(low, -high, rtol=0.02) and low != 0 for low, high in ranges]


def test_auto_keeps_the_preset_closer_to_fp32_and_says_so():
    rng = np.random.default_rng(0)
    calibration = SampleSet([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32) * 2} for _ in range(32)],
                            None, "test")
    auto = quantize_openvino(_openvino(nn.SiLU()), None, calibration, Int8Config())
    assert auto.measured_preset in (PERFORMANCE, MIXED)
    note = auto.note
    assert note.startswith(f"preset={auto.measured_preset} (chosen by worst-output cosine on 32 calibration samples: "
                           "performance 0.") and ", mixed 0." in note and "Swish activations have a negative tail" in note
    figures = dict(part.rsplit(" ", 1) for part in note.split("samples: ")[1].split(";")[0].split(", "))
    assert float(figures[auto.measured_preset]) == max(map(float, figures.values()))  # to the 4 digits shown
    assert set(_asymmetric(auto.model)) == {auto.measured_preset == MIXED}
    assert _chosen(auto) == {"preset": auto.measured_preset}  # the repair ladder's later rungs reuse the choice
    for preset in (PERFORMANCE, MIXED):  # a recipe's preset is used as given, nothing measured
        pinned = quantize_openvino(_openvino(nn.SiLU()), None, calibration, Int8Config(preset=preset))
        assert pinned.measured_preset is None and pinned.note.startswith(f"preset={preset} (set by the recipe)")
        assert set(_asymmetric(pinned.model)) == {preset == MIXED}
    relu = quantize_openvino(_openvino(nn.ReLU()), None, calibration, Int8Config())
    assert relu.measured_preset is None and _chosen(relu) == {}
    assert relu.note.startswith("preset=performance (NNCF's for CNNs: no activation with a negative tail)")
