"""User task metrics (``--metric file.py:function``): the contract, targets from data, and the gate in compress,
int8_ac and optimize, on the tiny detector sample (two outputs, boxes and scores; targets: ragged boxes)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import ROOT
from edgeopt.device.runtime import TensorSpec
from edgeopt.device.task_metric import MetricSpec, MetricValues, call_metric, declared_spec, metric
from edgeopt.errors import BadInputError

DETECTOR = ROOT / "samples" / "tiny_detector"
MODEL = f"{DETECTOR / 'model.py'}:build"
CALIB = f"{DETECTOR / 'data.py'}:calib"
EVAL = f"{DETECTOR / 'data.py'}:eval"
F1 = f"{DETECTOR / 'metrics.py'}:f1"


def test_decorator_declares_direction_primary_and_drop():
    @metric(primary="cer", higher_is_better=False, max_rel_drop=0.05)
    def cer(outputs, targets):
        return {"cer": 0.1, "wer": 0.2}

    spec = declared_spec("m.py:cer", cer)
    assert (spec.primary, spec.higher_is_better, spec.max_drop, spec.max_rel_drop) == ("cer", False, None, 0.05)
    values = call_metric(spec, cer, [], None)
    assert values.value == 0.1 and values.values == {"cer": 0.1, "wer": 0.2}
    # lower is better: 0.1 -> 0.104 is a drop of 0.004, within 5% of 0.1; 0.106 is not
    assert spec.judge(values, MetricValues("m", "cer", {"cer": 0.104})).passed
    check = spec.judge(values, MetricValues("m", "cer", {"cer": 0.106}))
    assert not check.passed and math.isclose(check.drop, 0.006) and math.isclose(check.allowed, 0.005)
    # the command line's drop replaces the declared one
    assert spec.with_drops(max_drop=0.01).judge(values, MetricValues("m", "cer", {"cer": 0.106})).passed


def test_undecorated_metric_defaults_to_higher_is_better_and_one_percent():
    spec = declared_spec("m.py:acc", lambda outputs, targets: 0.5)
    assert spec.higher_is_better and spec.max_drop is None and spec.max_rel_drop == 0.01
    assert call_metric(spec, lambda o, t: np.float32(0.5), [], None).value == 0.5


@pytest.mark.parametrize("returned, message", [
    (float("nan"), "returned nan"), (float("inf"), "returned inf"), ("good", "returned a str"),
    ({"a": 1.0, "b": 2.0}, "no 'value'"), ({"f1": None}, "returned 'f1'=a NoneType"), ({}, "empty dict"),
    (True, "returned a bool"),
])
def test_bad_metric_results_are_refused_naming_the_metric(returned, message):
    spec = MetricSpec("hooks.py:bad")
    with pytest.raises(BadInputError, match="metric hooks.py:bad") as caught:
        call_metric(spec, lambda outputs, targets: returned, [], None)
    assert message in str(caught.value)


def test_a_raising_metric_is_one_line_naming_it():
    def broken(outputs, targets):
        raise KeyError("boxes")

    with pytest.raises(BadInputError, match=r"metric hooks.py:broken failed \(KeyError: 'boxes'\)"):
        call_metric(MetricSpec("hooks.py:broken"), broken, [], None)


def test_targets_from_npz_and_hooks(tmp_path):
    from edgeopt.data import load_samples

    inputs = [TensorSpec("input", [1, 2], "float32")]
    path = tmp_path / "d.npz"
    np.savez(path, input=np.zeros((3, 1, 2), np.float32), target_boxes=np.ones((3, 5, 4)), target_count=np.arange(3))
    data = load_samples(path, inputs)
    assert data.labels is None and set(data.targets[2]) == {"boxes", "count"} and data.targets[2]["count"] == 2
    np.savez(path, input=np.zeros((3, 1, 2), np.float32), target=np.arange(6).reshape(3, 2))
    assert load_samples(path, inputs).targets[1].tolist() == [2, 3]
    np.savez(path, input=np.zeros((3, 1, 2), np.float32), labels=np.arange(3))
    assert load_samples(path, inputs).targets == [0, 1, 2]  # labels are the targets when nothing else is
    np.savez(path, input=np.zeros((3, 1, 2), np.float32), target=np.arange(2))
    with pytest.raises(BadInputError, match="2 targets for 3 samples"):
        load_samples(path, inputs)
    hook = tmp_path / "hook.py"
    hook.write_text("import numpy as np\ndef data():\n"
                    "    return [(np.zeros((1, 2), np.float32), {'text': 'ab', 'boxes': np.ones((i, 4))})"
                    " for i in range(3)]\n")
    data = load_samples(f"{hook}:data", inputs)
    assert data.labels is None and data.targets[1]["text"] == "ab" and data.targets[2]["boxes"].shape == (2, 4)


def test_recipe_and_profile_name_a_metric(tmp_path):
    from edgeopt.recipe import parse_recipe
    from edgeopt.targets import load_target

    (tmp_path / "m.py").write_text("from edgeopt import metric\n@metric(primary='f1', max_drop=0.1)\n"
                                   "def f1(outputs, targets):\n    return {'f1': 1.0}\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text('metric = "m.py:f1"\n[[step]]\nname = "int8"\n')
    parsed = parse_recipe(str(recipe))
    assert parsed.metric.primary == "f1" and parsed.metric.max_drop == 0.1
    assert parsed.metric.name == f"{tmp_path / 'm.py'}:f1"
    recipe.write_text('metric = "m.py:nope"\n[[step]]\nname = "int8"\n')
    with pytest.raises(BadInputError, match="has no function 'nope'"):
        parse_recipe(str(recipe))
    profile = tmp_path / "dev.toml"
    profile.write_text('extends = "generic-x86-avx2-2core"\ndescription = "x"\n'
                       '[quality]\nmetric = "m.py:f1"\nmax_rel_drop = 0.03\n')
    target = load_target(str(profile))
    assert target.metric.max_rel_drop == 0.03 and target.metric.max_drop is None
    profile.write_text('extends = "generic-x86-avx2-2core"\ndescription = "x"\n[quality]\nmetrik = "m.py:f1"\n')
    with pytest.raises(BadInputError, match="unknown key 'quality.metrik'"):
        load_target(str(profile))


@pytest.fixture(scope="module")
def detector_int8(tmp_path_factory):
    """The tiny detector compressed to INT8 with F1 as the gate (and the step report)."""
    from click.testing import CliRunner

    from edgeopt.cli import main

    out = tmp_path_factory.mktemp("detector") / "out"
    result = CliRunner().invoke(main, ["compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", F1,
                                       "--format", "openvino", "--step-report", "--out", str(out)],
                                 catch_exceptions=False)
    return result, out, json.loads((out / "report.json").read_text())


def test_compress_is_gated_by_the_user_metric(detector_int8):
    result, out, report = detector_int8
    assert result.exit_code == 0, result.output
    quality = report["quality"]
    assert quality["gate"]["metric"] == {"name": F1, "primary": "f1", "direction": "higher", "max_drop": 0.02,
                                         "max_rel_drop": None}
    original = quality["original"]["metric"]
    assert original["primary"] == "f1" and set(original["values"]) == {"f1", "precision", "recall", "mean_iou"}
    assert original["value"] > 0.8  # the sample detector is trained: F1 is meaningful
    check = quality["artifacts"]["openvino"]["metric_check"]
    assert check["reference"] == original["value"] and check["threshold"] == 0.02 and check["passed"]
    assert math.isclose(check["drop"], check["reference"] - check["value"])
    assert quality["artifacts"]["openvino"]["check"].startswith("f1 ")  # the metric decides, not cosine
    assert set(quality["artifacts"]["openvino"]["outputs"]) == {"boxes", "scores"}  # fidelity still reported


def test_the_step_report_shows_the_metric(detector_int8):
    """The step report measures what the gate decides on: F1 after every step, beside top-1 and cosine."""
    result, _, report = detector_int8
    steps = report["steps"]
    assert steps["metric"]["name"] == F1 and steps["metric"]["primary"] == "f1"
    rows = {row["step"]: row for row in steps["rows"]}
    assert list(rows) == ["original", "int8"]
    quality = report["quality"]
    # the same evaluation set: the FP32 IR's F1 is the original's, the INT8 step's is the artifact's
    assert rows["original"]["metric"] == pytest.approx(quality["original"]["metric"]["value"], abs=1e-3)
    assert rows["int8"]["metric"] == pytest.approx(quality["artifacts"]["openvino"]["metric"]["value"], abs=1e-3)
    header = next(line for line in result.output.splitlines() if "p50 ms" in line)
    assert "f1" in header.split() and "cosine" in header.split()
    assert f"f1: task metric {F1}" in " ".join(result.output.split())


def test_the_metric_gate_fails_with_exit_3_when_the_artifact_is_worse(detector_int8, cli, tmp_path):
    """mean IoU of the matched boxes moves under INT8; declared so that the INT8 value is the worse one and no
    drop is allowed, the same compress exits 3 naming the metric."""
    _, _, report = detector_int8
    reference = report["quality"]["original"]["metric"]["values"]["mean_iou"]
    value = report["quality"]["artifacts"]["openvino"]["metric"]["values"]["mean_iou"]
    assert value != reference
    hook = tmp_path / "iou.py"
    hook.write_text(f"import sys\nsys.path.insert(0, {str(DETECTOR)!r})\nfrom edgeopt import metric\n"
                    "from metrics import f1\n"
                    f"@metric(primary='mean_iou', higher_is_better={value < reference}, max_drop=0)\n"
                    "def iou(outputs, targets):\n    return f1(outputs, targets)\n")
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", f"{hook}:iou", "--format",
                 "openvino", "--out", tmp_path / "out")
    assert result.exit_code == 3, result.output
    assert "quality gate failed: openvino: mean_iou" in result.stderr and f"metric {hook}:iou" in result.stderr
    check = json.loads((tmp_path / "out" / "report.json").read_text())["quality"]["artifacts"]["openvino"]
    assert check["metric_check"]["passed"] is False and check["metric_check"]["drop"] > 0


@pytest.mark.parametrize("body, message", [
    ("    raise ValueError('no boxes here')\n", "failed (ValueError: no boxes here)"),
    ("    return float('nan')\n", "returned nan"),
    ("    return 'ok'\n", "returned a str"),
])
def test_a_bad_metric_hook_exits_2_naming_it(cli, tmp_path, body, message):
    hook = tmp_path / "bad.py"
    hook.write_text("def score(outputs, targets):\n" + body)
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", f"{hook}:score",
                 "--format", "openvino", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert f"metric {hook}:score" in result.stderr and message in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_metric_options_are_checked_before_any_work(cli, tmp_path):
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", f"{tmp_path}/none.py:f",
                 "--out", tmp_path / "out")
    assert result.exit_code == 2 and "no such metric file" in result.stderr
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--max-rel-drop", "0.1", "--out", tmp_path / "o")
    assert result.exit_code == 2 and "--max-rel-drop needs --metric" in result.stderr
    result = cli("compress", MODEL, "--calib", CALIB, "--metric", F1, "--out", tmp_path / "out")
    assert result.exit_code == 2 and "needs evaluation data (--eval)" in result.stderr


def test_int8_ac_uses_the_metric_as_nncf_validation_fn(cli, tmp_path):
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", F1, "--max-rel-drop", "0.01",
                 "--recipe", "int8_ac", "--format", "openvino", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any(f"int8_ac: metric f1 ({F1})" in note and "(relative)" in note for note in report["notes"])
    check = report["quality"]["artifacts"]["openvino"]["metric_check"]
    assert check["passed"] and check["max_rel_drop"] == 0.01 and check["max_drop"] is None


def test_repair_judges_its_rungs_by_the_metric(cli, tmp_path):
    """The repair ladder asks the same gate: with --metric every rung's verdict is the metric's."""
    result = cli("compress", MODEL, "--calib", CALIB, "--eval", EVAL, "--metric", F1, "--max-rel-drop", "0.01",
                 "--repair", "--format", "openvino", "--out", tmp_path / "out")
    assert result.exit_code in (0, 3), result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    repair = report["decisions"]["int8_repair"]
    assert repair["rungs"] and all(f"metric {F1}" in rung["check"] for rung in repair["rungs"]), repair["rungs"]
    check = report["quality"]["artifacts"]["openvino"]["metric_check"]
    assert (result.exit_code == 0) == check["passed"] == (repair["passed_rung"] is not None)


@pytest.mark.slow
def test_optimize_judges_candidates_by_the_metric(cli, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('[[stage]]\nname = "cheap"\n[[stage.candidate]]\nlabel = "int8"\nprecision = "int8"\n'
                    'steps = [{ name = "int8" }]\n')
    result = cli("optimize", MODEL, "--target", "generic-x86-avx2-2core", "--calib", CALIB, "--eval", EVAL,
                 "--metric", F1, "--out", tmp_path / "out", "--cache", tmp_path / "cache", "--plan", plan,
                 "--runs", "20", "--warmup", "2", "--min-seconds", "0")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["gate"]["metric"]["name"] == F1
    candidate = report["candidates"][0]
    assert candidate["quality"]["metric"]["primary"] == "f1" and candidate["quality"]["gate_passed"], result.output
    assert candidate["quality"]["gate_check"].startswith("f1 ")


def test_a_recipe_names_the_metric_for_the_api(tmp_path):
    import edgeopt

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'metric = "{DETECTOR / "metrics.py"}:f1"\n[[step]]\nname = "int8"\n')
    result = edgeopt.compress(MODEL, CALIB, out=tmp_path / "out", recipe=str(recipe), eval_data=EVAL,
                              formats=("openvino",))
    assert result.gate.metric.primary == "f1" and result.quality_passed
    assert result.qualities["openvino"].metric.values.keys() == {"f1", "precision", "recall", "mean_iou"}
    assert result.describe()["quality"]["artifacts"]["openvino"]["metric_check"]["threshold"] == 0.02


def test_int8_ac_validation_fn_negates_a_lower_is_better_metric(tmp_path):
    """NNCF assumes higher is better: the validation_fn hands it minus an error metric, computed on every
    output of the compiled model by name and the picked items' targets."""
    import openvino as ov

    from edgeopt.data import load_samples
    from edgeopt.evaluate import QualityGate
    from edgeopt.passes.accuracy_control import _metric_validation
    from edgeopt.source import load_model
    from edgeopt.user_metric import load_metric

    (tmp_path / "err.py").write_text(
        "import numpy as np\nfrom edgeopt import metric\n@metric(higher_is_better=False, max_rel_drop=0.1)\n"
        "def err(outputs, targets):\n"
        "    return float(np.mean([abs(o['scores'].max() - min(len(t), 1)) for o, t in zip(outputs, targets)]))\n")
    spec = load_metric(f"{tmp_path / 'err.py'}:err")
    source = load_model(MODEL, {}, {})
    evaluation = load_samples(EVAL, source.inputs).take(20)
    validate, label, allowed, relative = _metric_validation(QualityGate(metric=spec), evaluation, source.output_names)
    assert relative and allowed == 0.1 and label == f"metric value ({spec.name})"
    compiled = ov.Core().compile_model(source.openvino_model(), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    items = [(feeds, i) for i, feeds in enumerate(evaluation.samples)][5:15]
    scores = [np.asarray(compiled(feeds)[compiled.outputs[1]]).max() for feeds, _ in items]
    expected = np.mean([abs(s - min(len(evaluation.targets[i]), 1)) for s, (_, i) in zip(scores, items)])
    assert math.isclose(validate(compiled, items), -expected, rel_tol=1e-6)


def test_sensitivity_ranks_operations_by_the_metric():
    """With a task metric in the gate, the per-operation sensitivity scores each operation by minus the metric's
    drop (the repair's figure), on the evaluation samples INT8 gets most wrong."""
    from edgeopt.data import load_samples
    from edgeopt.evaluate import QualityGate
    from edgeopt.formats import FORMATS
    from edgeopt.judge import Judge
    from edgeopt.passes.quantize import Int8Config, quantize_openvino
    from edgeopt.sensitivity import analyse
    from edgeopt.source import load_model
    from edgeopt.user_metric import load_metric

    source = load_model(MODEL, {})
    fp32 = FORMATS["openvino"].from_torch(source.torch_module, source.example_input, source.input_names,
                                          source.output_names)
    int8 = quantize_openvino(fp32, None, load_samples(CALIB, source.inputs), Int8Config(),
                             compress_weights=False).model
    gate = QualityGate(metric=load_metric(F1))
    evaluation = load_samples(EVAL, source.inputs)
    judge = Judge(fp32, evaluation, gate, source.output_names)
    ranking = judge.worst_samples(judge(int8), 48)
    result = analyse(fp32, int8, ranking, gate, source.output_names)
    assert result.measure == "minus the drop of the task metric's f1" and result.samples == 48
    on_ranking = Judge(fp32, ranking, gate, source.output_names)
    assert result.int8_score == pytest.approx(on_ranking.score(on_ranking(int8)))
    assert result.int8_score < 0  # INT8 loses F1 on the samples it gets most wrong
    first = result.ranked[0]
    assert first.gain == pytest.approx(first.score - result.int8_score) and first.gain > 0
    assert all(a.gain >= b.gain for a, b in zip(result.ranked, result.ranked[1:]))
