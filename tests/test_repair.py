"""The repair ladder and the sensitivity analysis, on a CNN whose INT8 loses accuracy in one planted layer."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import report_schema_errors

HERE = Path(__file__).parent
OUTLIER_MODEL = f"{HERE / 'outlier_net.py'}:build"
PLANTED = "conv2"  # the layer that reads the outlier channel (tests/outlier_net.py)
MIXER_MODEL = f"{HERE / 'outlier_mixer.py'}:build"


@pytest.fixture(scope="module")
def outlier_data(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("outlier")
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", input=rng.standard_normal((64, 1, 3, 8, 8)).astype(np.float32))
    np.savez(folder / "eval.npz", input=rng.standard_normal((48, 1, 3, 8, 8)).astype(np.float32))
    return folder / "calib.npz", folder / "eval.npz"


@pytest.fixture
def outlier_int8(outlier_data):
    """The outlier CNN: (source, its FP32 OpenVINO model, the held-out samples, its INT8 model with the weights
    still under FakeQuantize, as the sensitivity analysis takes it)."""
    from edgeopt.data import load_samples
    from edgeopt.formats import FORMATS
    from edgeopt.passes.quantize import Int8Config, quantize_openvino
    from edgeopt.source import load_model

    source = load_model(OUTLIER_MODEL, {})
    fp32 = FORMATS["openvino"].from_torch(source.torch_module, source.example_input, source.input_names,
                                          source.output_names)
    evaluation = load_samples(outlier_data[1], source.inputs)
    int8 = quantize_openvino(fp32, None, load_samples(outlier_data[0], source.inputs), Int8Config(),
                             compress_weights=False).model
    return source, fp32, evaluation, int8


def test_sensitivity_puts_the_planted_outlier_layer_first(outlier_int8):
    from edgeopt.evaluate import QualityGate
    from edgeopt.sensitivity import analyse

    source, fp32, evaluation, int8 = outlier_int8
    result = analyse(fp32, int8, evaluation, QualityGate(), source.output_names)
    first, *others = result.ranked
    assert PLANTED in first.name and first.op_type == "Convolution"
    assert result.quantized_ops == len(result.ranked) == 4
    assert result.int8_score < 0.99 <= first.score  # only the planted layer in float recovers the gate
    assert all(op.score < 0.99 for op in others)
    # its input carries the outlier channel: the range statistics say so, the others' do not
    assert first.range_ratio > 10 * max(op.range_ratio for op in others)
    assert min(first.sqnr_db.values()) > max(min(op.sqnr_db.values()) for op in others)
    assert all(0 <= op.clipped < 1 for op in result.ranked)


def test_the_screen_ranks_every_operation_in_one_compile_and_only_the_worst_are_probed(outlier_int8):
    """The screen (every group switched to float in one compiled model emulating the INT8 one; each operation's
    output SQNR and added noise in one pass, on the samples INT8 gets most wrong) finds the planted layer; only the
    groups it puts worst, covering ``probe_share`` of the quantized operations, are kept alone in float in the
    INT8 model and judged, and the screen's figure is what that probe measures."""
    from edgeopt.evaluate import QualityGate
    from edgeopt.sensitivity import CAP_DB, SCREEN_SAMPLES, analyse

    source, fp32, evaluation, int8 = outlier_int8
    result = analyse(fp32, int8, evaluation, QualityGate(), source.output_names, probe_share=0.25)
    first, *others = result.ranked
    assert result.probed == 1 and first.probed and not any(op.probed for op in others)
    assert PLANTED in first.name and first.gain > 0 and first.score >= 0.99 > result.int8_score
    assert all(op.gain is None and op.score is None and op.sqnr_db is None for op in others)
    # the screen measures every group: the planted one recovers the most, and adds the most noise, by far
    assert first.screen_gain > 10 * max(op.screen_gain for op in others)
    assert [op.screen_gain for op in others] == sorted((op.screen_gain for op in others), reverse=True)
    assert first.screen_noise_db + 10 < min(op.screen_noise_db for op in others)
    assert first.screen_sqnr_db <= min(op.screen_sqnr_db for op in others)
    assert all(op.screen_noise_db <= CAP_DB for op in result.ranked)
    assert 0 < result.screen_seconds <= result.seconds
    # probing every group on as many samples as the screen runs on: the same order, and the screen's gain is the
    # probe's (INT8 emulated in f32)
    full = analyse(fp32, int8, evaluation.pick(list(range(SCREEN_SAMPLES))), QualityGate(), source.output_names)
    assert full.probed == len(full.ranked) == 4 and full.ranked[0].name == first.name
    assert [op.name for op in full.ranked] == [op.name for op in sorted(full.ranked, key=lambda o: -o.screen_gain)]
    assert all(abs(op.screen_gain - op.gain) <= 0.01 * first.gain for op in full.ranked)


def test_the_ranking_subset_is_the_samples_int8_gets_most_wrong(outlier_int8):
    """As NNCF's accuracy control ranks: the sensitivity runs on the evaluation samples with the lowest cosine of
    any gated output under INT8; asking for at least every sample keeps the set."""
    from edgeopt.evaluate import QualityGate, sample_cosines
    from edgeopt.judge import Judge

    source, fp32, evaluation, int8 = outlier_int8
    judge = Judge(fp32, evaluation, QualityGate(), source.output_names)
    verdict = judge(int8)
    cosines = sample_cosines(verdict.outputs.values[0], judge.reference_outputs.values[0])
    picked = judge.worst_samples(verdict, 8)
    worst = sorted(np.argsort(cosines)[:8])
    assert len(picked) == 8 and all(picked.samples[i] is evaluation.samples[j] for i, j in enumerate(worst))
    assert cosines[worst].max() <= np.sort(cosines)[8]
    assert judge.worst_samples(verdict, len(evaluation)) is evaluation


@pytest.mark.slow
def test_repair_passes_the_gate_names_the_ops_and_reproduces_in_one_step(cli, outlier_data, tmp_path):
    calib, evaluation = outlier_data
    plain = cli("compress", OUTLIER_MODEL, "--calib", calib, "--eval", evaluation, "--format", "openvino",
                "--out", tmp_path / "plain", "--quiet")
    assert plain.exit_code == 3, plain.output  # plain INT8 misses the gate
    out = tmp_path / "repaired"
    result = cli("compress", OUTLIER_MODEL, "--calib", calib, "--eval", evaluation, "--repair", "--out", out,
                 "--json", tmp_path / "report.json")
    assert result.exit_code in (0, 4), result.output  # 4: a spread budget on a busy host + result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report_schema_errors(report) == []
    repair = report["decisions"]["int8_repair"]
    assert repair["passed_rung"] in ("float_ops", "float_islands")
    assert [r["rung"] for r in repair["rungs"]][:3] == ["int8", "bias_correction", "preset"]
    assert not any(r["passed"] for r in repair["rungs"][:3])
    assert len(repair["float_ops"]) == 1 and PLANTED in repair["float_ops"][0]["name"]
    assert repair["float_ops"][0]["gain"] > 0 and repair["float_share"] == 0.25
    assert report["quality"]["passed"] and [a["format"] for a in report["artifacts"]] == ["openvino"]
    left_out = "ONNX: not written: int8_repair writes OpenVINO IR only"  # by default both, and it says why not
    assert left_out in report["notes"] and left_out in result.output
    assert PLANTED in result.output and "int8 repair: passed at rung" in result.output  # the CLI table
    page = (out / "repair.html").read_text()
    assert "Worst layers" in page and "data:image/png;base64," in page and PLANTED in page
    # the reverted model is kept without a new calibration: no int8 step makes it, and the report says so
    assert not any(r["rung"] == f"{repair['passed_rung']} k=1" for r in repair["rungs"])
    assert repair["recipe"] is None and "rerun int8_repair" in repair["no_recipe"]
    assert not (out / "recipe.toml").exists()
    # recalibrate = true calibrates it again with the operation in NNCF's ignored scope: one int8 step redoes that
    asked = tmp_path / "recalibrate.toml"
    asked.write_text('[[step]]\nname = "int8_repair"\nrecalibrate = true\n')
    out = tmp_path / "recalibrated"
    result = cli("compress", OUTLIER_MODEL, "--calib", calib, "--eval", evaluation, "--recipe", asked,
                 "--format", "openvino", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    repair = json.loads((out / "report.json").read_text())["decisions"]["int8_repair"]
    assert repair["rungs"][-1]["rung"] == f"{repair['passed_rung']} k=1" and repair["no_recipe"] is None
    recipe = tomllib.loads((out / "recipe.toml").read_text())
    assert [s["name"] for s in recipe["step"]] == ["int8"]
    assert any(PLANTED in name for name in recipe["step"][0]["ignored_scope"])
    again = cli("compress", OUTLIER_MODEL, "--calib", calib, "--eval", evaluation, "--recipe", out / "recipe.toml",
                "--format", "openvino", "--out", tmp_path / "again", "--quiet")
    assert again.exit_code == 0, again.output
    for name in ("model.xml", "model.bin"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()


@pytest.mark.slow
def test_repair_that_passes_before_the_float_rung_still_says_why_int8_lost_accuracy(cli, tmp_path):
    """Plain INT8 misses the gate on a token mixer with an outlier channel, the model_type rung (SmoothQuant) passes
    it: no operation stays in float, yet the report, the console and repair.html rank plain INT8's operations,
    draw the worst layers and say why none was left in float."""
    rng = np.random.default_rng(0)
    for name, count in (("calib", 64), ("eval", 48)):
        np.savez(tmp_path / f"{name}.npz", input=rng.standard_normal((count, 1, 8, 16)).astype(np.float32))
    out = tmp_path / "repaired"
    result = cli("compress", MIXER_MODEL, "--calib", tmp_path / "calib.npz", "--eval", tmp_path / "eval.npz",
                 "--repair", "--format", "openvino", "--out", out)
    assert result.exit_code in (0, 4), result.output  # 4: a spread budget on a busy host
    report = json.loads((out / "report.json").read_text())
    assert report_schema_errors(report) == []
    repair = report["decisions"]["int8_repair"]
    assert [(r["rung"], r["passed"]) for r in repair["rungs"]] == [("int8", False), ("model_type", True)]
    assert repair["passed_rung"] == "model_type" and repair["float_ops"] == [] and repair["float_share"] == 0
    assert repair["float_reason"].startswith("none: rung model_type passed")
    sensitivity = repair["sensitivity"]
    assert sensitivity["model"] == "int8" and sensitivity["int8_score"] <= repair["rungs"][0]["score"]  # its worst samples
    assert 1 < len(sensitivity["ranked"]) <= sensitivity["quantized_ops"]  # NNCF groups ops that revert together
    first = sensitivity["ranked"][0]
    assert "fc2" in first["name"] and first["gain"] > 0  # the layer that reads the outlier channel
    assert first["range_ratio"] > 10 * max(op["range_ratio"] or 0 for op in sensitivity["ranked"][1:])
    assert "why INT8 lost accuracy" in result.output and "none: rung model_type passed" in result.output
    page = (out / "repair.html").read_text()
    assert "Worst layers" in page and "data:image/png;base64," in page and "fc2" in page


def test_repair_needs_an_int8_step_and_evaluation_data(cli, outlier_data, tmp_path):
    calib, _ = outlier_data
    result = cli("compress", OUTLIER_MODEL, "--calib", calib, "--repair", "--precision", "fp16", "--out", tmp_path / "a")
    assert result.exit_code == 2 and "--repair repairs an int8 step" in result.stderr
    result = cli("compress", OUTLIER_MODEL, "--calib", calib, "--repair", "--out", tmp_path / "b")
    assert result.exit_code == 2 and "int8_repair: needs evaluation data (--eval)" in result.stderr
    result = cli("compress", OUTLIER_MODEL, "--calib", calib, "--repair", "--recipe", "/nonexistent.toml",
                 "--out", tmp_path / "c")
    assert result.exit_code == 2


@pytest.mark.slow
def test_optimize_repairs_when_int8_misses_the_gate_and_draws_the_worst_layers(outlier_data, tmp_path, profiles):
    from click.testing import CliRunner

    from edgeopt.cli import main

    calib, evaluation = outlier_data
    # no FP32 on this device (so the baseline cannot end the search); FP16 islands it runs
    profiles("int8-box", 'extends = "generic-x86-avx2-2core"\ndescription = "INT8, FP16"\n'
                         '[model]\nprecisions = ["int8", "fp16"]\n')
    plan = tmp_path / "plan.toml"
    plan.write_text('[[stage]]\nname = "baseline"\nstop_when_passed = false\n[[stage.candidate]]\nlabel = "fp32"\n'
                    'precision = "fp32"\nsteps = []\n'
                    '[[stage]]\nname = "cheap"\n[[stage.candidate]]\nlabel = "int8"\nprecision = "int8"\n'
                    'steps = [{ name = "int8" }]\n'
                    '[[stage]]\nname = "repair"\n[[stage.candidate]]\nlabel = "int8-repair"\nprecision = "int8"\n'
                    'steps = [{ name = "int8_repair" }]\nif_gate_failed = ["int8"]\n')
    result = CliRunner().invoke(main, ["optimize", OUTLIER_MODEL, "--target", "int8-box", "--calib",
                                       str(calib), "--eval", str(evaluation), "--plan", str(plan), "--out",
                                       str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--runs", "30",
                                       "--warmup", "5", "--min-seconds", "0"], catch_exceptions=False)
    assert result.exit_code in (0, 4), result.output  # 4: a spread budget on a busy host
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report_schema_errors(report) == []
    candidates = {c["label"]: c for c in report["candidates"]}
    assert candidates["int8"]["quality"]["gate_passed"] is False
    repaired = candidates["int8-repair"]
    assert report["chosen"] in ("int8-repair", None)
    assert repaired["quality"]["gate_passed"] and PLANTED in repaired["repair"]["float_ops"][0]["name"]
    assert repaired["repair"]["passed_rung"] == "float_islands" and repaired["repair"]["island_precision"] == "f16"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "worst layers (int8-repair)" in page and (tmp_path / "out" / "worst_layers.png").is_file()


@pytest.mark.slow
def test_repair_keeps_the_transformers_smooth_quant_choice_on_later_rungs(cli, tmp_path):
    """A transformer's int8 step chooses SmoothQuant by measurement (two calibrations): the repair records the
    choice with the rung and keeps it on every later rung and in the reproducing recipe, instead of choosing
    (and calibrating twice) again. A 2-layer BERT under a gate no INT8 model meets runs the whole ladder."""
    from conftest import ROOT
    from edgeopt.source import load_model

    model = f"{ROOT / 'bench' / 'conformance_models.py'}:bert_mini"
    rng = np.random.default_rng(0)
    for name, count in (("calib", 32), ("eval", 16)):
        np.savez(tmp_path / f"{name}.npz", **{
            spec.name: (rng.integers(0, 1000, (count, *spec.shape)) if i == 0 else np.ones((count, *spec.shape)))
            .astype(np.int64) for i, spec in enumerate(load_model(model, {}).inputs)})
    result = cli("compress", model, "--calib", tmp_path / "calib.npz", "--eval", tmp_path / "eval.npz", "--repair",
                 "--min-cosine", "0.99999", "--format", "openvino", "--out", tmp_path / "out", "--quiet")
    assert result.exit_code in (0, 3), result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    repair = report["decisions"]["int8_repair"]
    rungs = repair["rungs"]
    assert [r["rung"] for r in rungs][:3] == ["int8", "smooth_quant", "bias_correction"]
    if result.exit_code == 3:  # the closest model is kept: a reverted one when it came closer than every rung
        kept = next(n for n in report["notes"] if n.startswith("int8_repair: no rung passed"))
        assert bool(repair["float_ops"]) == ("keeping the closest model, float_" in kept), (kept, repair["float_ops"])
    chosen = rungs[0]["params"]["smooth_quant_alpha"]
    assert chosen in (0.95, -1.0)  # NNCF's alpha, or off
    assert rungs[1]["params"]["smooth_quant_alpha"] == 0.5
    assert all(r["params"]["smooth_quant_alpha"] in (chosen, 0.5) for r in rungs[2:])
    if result.exit_code == 0:
        recipe = tomllib.loads((tmp_path / "out" / "recipe.toml").read_text())
        assert recipe["step"][0]["smooth_quant_alpha"] in (chosen, 0.5)


def test_activation_ranges_of_a_tensor_that_is_also_a_model_output(tmp_path):
    """A quantizer on a tensor the model also returns (basic-pitch's contour feeds its note head): the probe
    cannot add that output again, so ranges are read by tensor, not by position (was an IndexError, exit 1)."""
    from edgeopt.data import load_samples
    from edgeopt.formats import FORMATS
    from edgeopt.passes.quantize import Int8Config, quantize_openvino
    from edgeopt.sensitivity import _activation_ranges
    from edgeopt.source import load_model

    (tmp_path / "two.py").write_text(
        "import torch\nclass Two(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.a, self.b = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3)\n"
        "    def forward(self, x):\n        first = torch.relu(self.a(x))\n        return first, self.b(first)\n"
        "def build():\n    torch.manual_seed(0)\n    return Two().eval(), torch.zeros(1, 3, 12, 12)\n")
    source = load_model(f"{tmp_path / 'two.py'}:build", {})
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).standard_normal((16, 1, 3, 12, 12), np.float32))
    samples = load_samples(tmp_path / "c.npz", source.inputs)
    fp32 = FORMATS["openvino"].from_torch(source.torch_module, source.example_input, source.input_names,
                                          source.output_names)
    int8 = quantize_openvino(fp32, None, samples, Int8Config(), compress_weights=False).model
    ranges = _activation_ranges(fp32, int8, samples)
    assert len(ranges) >= 2 and all(ratio >= 1 and 0 <= clipped <= 1 for ratio, clipped in ranges.values())
