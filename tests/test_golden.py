"""Golden sets: created once from the tiny detector, they catch a deliberately broken artifact (weights
perturbed) in compress, in validate on the host, and inside a bundle run by the lean device validator."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from bundle_support import LOOSE_TAIL, LOOSE_TARGET, lean_edgeopt, runtime_venv
from click.testing import CliRunner

from conftest import ROOT
from edgeopt.device.golden import load_golden

DETECTOR = ROOT / "samples" / "tiny_detector"
MODEL = f"{DETECTOR / 'model.py'}:build"
CALIB = f"{DETECTOR / 'data.py'}:calib"
EVAL = f"{DETECTOR / 'data.py'}:eval"
F1 = f"{DETECTOR / 'metrics.py'}:f1"
FAST = ("--runs", "20", "--warmup", "2", "--min-seconds", "0")
BROKEN = f"""\
import sys
sys.path.insert(0, {str(DETECTOR)!r})
import torch
from model import build as original

def build():
    module, example = original()
    torch.manual_seed(0)
    with torch.no_grad():  # the kind of damage a bad conversion or a corrupt weight file does
        weight = module.features[3].weight
        weight.add_(torch.randn_like(weight) * weight.std())
    return module, example
"""


def run(*args):
    from edgeopt.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A golden set (16 samples, F1 shipped), the INT8 detector, the broken detector (compressed against
    itself, so its own gate passes), and a loose profile without input shapes."""
    root = tmp_path_factory.mktemp("golden")
    golden = root / "golden"
    created = run("golden", "create", MODEL, "--data", EVAL, "--metric", F1, "--samples", "16", "--min-cosine",
                  "0.98", "--out", golden)
    assert created.exit_code == 0, created.output
    (root / "broken.py").write_text(BROKEN)
    for name, model in (("good", MODEL), ("broken", f"{root / 'broken.py'}:build")):
        result = run("compress", model, "--calib", CALIB, "--format", "openvino", "--out", root / name)
        assert result.exit_code == 0, result.output
    target = root / "loose.toml"
    target.write_text(LOOSE_TARGET.format(runtime="openvino") + LOOSE_TAIL.split("[model]")[0])  # no 8x8 shape
    return root, golden, target


def test_golden_create_stores_inputs_outputs_targets_and_the_metric(setup):
    _, golden, _ = setup
    loaded = load_golden(golden)
    assert len(loaded.feeds) == 16 and set(loaded.outputs) == {"boxes", "scores"}
    assert loaded.outputs["boxes"].shape == (16, 1, 16, 4)
    assert len(loaded.targets) == 16 and loaded.targets[0].shape[1] == 4  # ragged boxes, dtype kept
    assert loaded.metric["reference"]["primary"] == "f1" and loaded.metric_file.name == "metric.py"
    assert loaded.tolerance("scores").min_cosine == 0.98


def test_host_validate_passes_the_good_artifact_and_names_the_worst_samples_of_the_broken(setup, tmp_path):
    root, golden, target = setup
    good = run("validate", root / "good", "--target", target, "--golden", golden, *FAST, "--json", tmp_path / "g.json")
    assert good.exit_code == 0, good.output
    report = json.loads((tmp_path / "g.json").read_text())["golden"]
    assert report["passed"] and report["metric"]["primary"] == "f1" and report["metric"]["passed"]
    broken = run("validate", root / "broken", "--target", target, "--golden", golden, *FAST,
                 "--json", tmp_path / "b.json")
    assert broken.exit_code == 3, broken.output
    assert "quality regression: golden set" in broken.stderr and "worst samples: #" in broken.stderr
    report = json.loads((tmp_path / "b.json").read_text())["golden"]
    assert not report["passed"] and len(report["worst_samples"]) == 3
    worst = report["worst_samples"][0]
    assert set(worst["outputs"]) == {"boxes", "scores"}
    assert min(e["cosine"] for e in worst["outputs"].values()) == min(o["worst_cosine"] for o in report["outputs"])


def test_compress_with_golden_fails_the_broken_model_with_exit_3(setup, tmp_path):
    root, golden, _ = setup
    result = run("compress", f"{root / 'broken.py'}:build", "--calib", CALIB, "--format", "openvino",
                 "--golden", golden, "--out", tmp_path / "out")
    assert result.exit_code == 3, result.output
    assert "golden set" in result.stderr and "worst samples" in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["quality"]["golden"]["openvino"]["passed"] is False and report["quality"]["passed"] is False


def test_a_bad_golden_folder_is_exit_2(setup, tmp_path):
    root, _, target = setup
    result = run("validate", root / "good", "--target", target, "--golden", tmp_path, *FAST)
    assert result.exit_code == 2 and "not a golden set" in result.stderr


def test_package_checks_the_artifact_against_the_golden_set_before_bundling(setup, tmp_path):
    """package --golden refuses the broken artifact with exit 3 (before measuring anything, nothing written) and
    reports the good one's check in its JSON."""
    root, golden, target = setup
    broken = run("package", root / "broken", "--target", target, "--golden", golden, *FAST,
                 "--out", tmp_path / "broken.tar.gz")
    assert broken.exit_code == 3, broken.output
    assert broken.stderr.startswith("edgeopt: model.xml: quality regression: golden set")
    assert "worst samples: #" in broken.stderr and "not packaged" in broken.stderr
    assert list(tmp_path.iterdir()) == []
    good = run("package", root / "good", "--target", target, "--golden", golden, *FAST,
               "--out", tmp_path / "good.tar.gz", "--json", tmp_path / "good.json")
    assert good.exit_code == 0, good.output
    checked = json.loads((tmp_path / "good.json").read_text())["golden"]
    assert list(checked) == ["model.xml"] and checked["model.xml"]["passed"]
    assert checked["model.xml"]["metric"]["primary"] == "f1" and checked["model.xml"]["metric"]["passed"]


@pytest.mark.slow
def test_the_device_validator_checks_the_bundled_golden_set(setup, tmp_path, monkeypatch):
    """Bundles of the good and the broken artifact carry the golden set (signed with the rest); the lean
    validator in a numpy + OpenVINO venv passes the first, evaluating the shipped F1 with --run-metric, and
    exits 3 on the second naming the worst samples. (package's own golden check would refuse the broken one;
    it is skipped here, as if the regression appeared on the device only — a runtime or ISA the host lacks.)"""
    import edgeopt.packaging

    root, golden, target = setup
    monkeypatch.setattr(edgeopt.packaging, "_check_golden", lambda *args: None)
    for name in ("good", "broken"):
        result = run("package", root / name, "--target", target, "--golden", golden, *FAST,
                     "--out", tmp_path / f"{name}.tar.gz")
        assert result.exit_code == 0, result.output
    manifest = json.loads(run("verify", tmp_path / "good.tar.gz", "--json", "-").output)["manifest"]
    assert manifest["golden"] == {"path": "golden", "samples": 16, "metric": "f1", "metric_file": True}
    assert {"golden/golden.json", "golden/golden.npz", "golden/metric.py", "golden/targets.json"} <= set(
        manifest["files"])
    python = str(runtime_venv("openvino") / "bin" / "python")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(lean_edgeopt(tmp_path / "lean")),
           "HOME": str(tmp_path)}

    def device(*args):
        return subprocess.run([python, "-m", "edgeopt.device", "validate", *map(str, args), *FAST], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    good = device(tmp_path / "good.tar.gz", "--run-metric", "--json", tmp_path / "good.json")
    assert good.returncode in (0, 4), good.stderr  # 4: a latency budget on a busy host; quality is what counts
    result = json.loads((tmp_path / "good.json").read_text())["golden"]
    assert result["passed"] and result["metric"]["passed"] and result["metric_values"]["primary"] == "f1"
    plain = device(tmp_path / "good.tar.gz", "--json", tmp_path / "plain.json")
    notes = json.loads((tmp_path / "plain.json").read_text())["golden"]["notes"]
    assert plain.returncode in (0, 4) and any("--run-metric" in note for note in notes)
    broken = device(tmp_path / "broken.tar.gz", "--json", tmp_path / "broken.json")
    assert broken.returncode == 3, broken.stderr
    assert "quality regression: golden set broken.tar.gz:golden" in broken.stderr and "worst samples: #" in broken.stderr
    assert json.loads((tmp_path / "broken.json").read_text())["golden"]["passed"] is False
    imported = run("validate", tmp_path / "broken.tar.gz", "--import", tmp_path / "broken.json")
    assert imported.exit_code == 3 and "worst samples" in imported.stderr


def test_targets_survive_the_golden_encoding():
    from edgeopt.device.golden import decode, encode

    targets = [{"boxes": np.ones((2, 4), np.float32), "text": "ab", "ids": (1, 2)}, np.int64(3), None]
    back = decode(json.loads(json.dumps(encode(targets))))
    assert back[0]["boxes"].dtype == np.float32 and back[0]["boxes"].shape == (2, 4)
    assert back[0]["text"] == "ab" and back[0]["ids"] == [1, 2] and back[1] == 3 and back[2] is None


def test_a_metric_with_heavy_imports_is_not_shipped_and_only_own_folders_are_replaced(tmp_path):
    (tmp_path / "m.py").write_text(f"import sys\nsys.path.insert(0, {str(DETECTOR)!r})\nimport scipy\n"
                                   "from metrics import f1 as score\n")
    out = tmp_path / "golden"
    args = ("golden", "create", MODEL, "--data", EVAL, "--metric", f"{tmp_path / 'm.py'}:score", "--samples", "4")
    first = run(*args, "--out", out)
    assert first.exit_code == 0, first.output
    assert "not shipped in the golden set (it imports metrics, scipy" in first.stderr
    assert load_golden(out).metric["file"] is None and not (out / "metric.py").exists()
    assert run(*args, "--out", out).exit_code == 0  # its own folder: replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = run(*args, "--out", tmp_path / "mine")
    assert refused.exit_code == 2 and (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_golden_set_keyed_input_checks_a_factory_model_whose_input_took_forwards_name(cli, tiny_factory,
                                                                                         tiny_calib, tmp_path):
    """A golden set made when every factory's single input was named ``input`` still checks the artifact of the
    same factory whose input is now ``forward()``'s ``x`` (it was exit 1, "Port for tensor name input")."""

    out, gold = tmp_path / "out", tmp_path / "gold"
    assert cli("compress", tiny_factory, "--calib", tiny_calib, "--format", "onnx", "--out", out,
               "--quiet").exit_code == 0
    result = cli("golden", "create", out / "model.onnx", "--data", tiny_calib, "--out", gold, "--samples", 4)
    assert result.exit_code == 0, result.output
    manifest = json.loads((gold / "golden.json").read_text())
    (name,) = [spec["name"] for spec in manifest["inputs"]]
    assert name == "x"
    with np.load(gold / "golden.npz") as archive:
        arrays = {("input:input" if key == f"input:{name}" else key): archive[key] for key in archive.files}
    np.savez(gold / "golden.npz", **arrays)
    manifest["inputs"][0]["name"] = "input"
    (gold / "golden.json").write_text(json.dumps(manifest))
    result = cli("validate", out / "model.onnx", "--target", "generic-x86-avx2-2core", "--golden", gold,
                 "--runs", 5, "--warmup", 1, "--min-seconds", 0)
    assert result.exit_code in (0, 4), result.output  # 4: the generic profile's budgets on a busy host
    assert "golden set" in result.output and "PASS" in result.output, result.output


def test_golden_errors_agree_with_the_gate_on_non_finite_values():
    """The device's golden check reads inf and NaN as the host's gate does (edgeopt.device.agreement): the
    reference's own -inf is left out; an output inf where the reference is finite is no agreement."""
    from edgeopt.device.golden import _errors

    reference = np.array([[-np.inf, 1.0, 2.0]], np.float32)
    assert _errors(np.array([[-np.inf, 1.0, 2.0]], np.float32), reference) == (pytest.approx(1.0), 0.0)
    assert _errors(np.array([[0.0, 1.0, 2.0]], np.float32), reference) == (pytest.approx(1.0), 0.0)
    assert _errors(np.array([[-np.inf, -np.inf, 2.0]], np.float32), reference) == (0.0, float("inf"))


def test_a_golden_output_inf_where_the_reference_is_finite_is_named_after_a_json_round_trip():
    """The device writes an inf error as null (edgeopt.jsonio); the message read back from that JSON names the
    inf or NaN rather than showing a passing cosine, and does not crash on the null."""
    import json

    from edgeopt import jsonio
    from edgeopt.device.golden import golden_message

    result = {"golden": "g", "outputs": [{"name": "y", "cosine": 0.995, "worst_cosine": 0.0, "max_abs_error": np.inf,
                                          "tolerance": {"min_cosine": 0.99, "max_abs_error": None}, "passed": False}],
              "worst_samples": [{"index": 3, "outputs": {"y": {"cosine": 0.0, "max_abs_error": np.inf}}}],
              "metric": None}
    message = golden_message(json.loads(jsonio.dumps(result)))
    assert "output 'y' inf or NaN where the golden output is finite, cosine 0.99500" in message, message
    assert "#3 (y: cosine 0.0000, max abs inf/NaN)" in message
