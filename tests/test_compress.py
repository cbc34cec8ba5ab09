"""End-to-end `edgeopt compress` on real small models through real NNCF, OpenVINO and ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import DIGITS_CALIB, DIGITS_EVAL, DIGITS_MODEL
from edgeopt.device.runtime import RuntimeSettings, open_session, random_feeds


def run_artifacts(out):
    """Load every artifact in ``out`` in its runtime, run it once, return {file: output}."""
    outputs = {}
    for path in sorted(out.iterdir()):
        if path.suffix in (".xml", ".onnx"):
            session = open_session(path)
            outputs[path.name] = session.infer(random_feeds(session.static_inputs))[0]
    return outputs


@pytest.fixture(scope="module")
def digits_int8(tmp_path_factory):
    from click.testing import CliRunner

    from edgeopt.cli import main

    out = tmp_path_factory.mktemp("digits") / "int8"
    result = CliRunner().invoke(main, ["compress", DIGITS_MODEL, "--calib", str(DIGITS_CALIB), "--eval",
                                       str(DIGITS_EVAL), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "report.json").read_text())


def test_digits_int8_keeps_accuracy_and_shrinks_the_ir(digits_int8):
    out, report = digits_int8
    quality = report["quality"]
    original = quality["original"]["top1"]
    assert original > 0.9  # the sample model is actually trained
    for fmt in ("openvino", "onnx"):
        assert original - quality["artifacts"][fmt]["top1"] <= 0.01
        assert quality["artifacts"][fmt]["passed"]
    ir = next(a for a in report["artifacts"] if a["format"] == "openvino")
    assert ir["precision"] == "int8"
    assert report["fp32_ir_bytes"] / ir["bytes"] >= 3.0
    # the report's byte count is what is on disk
    assert ir["bytes"] == (out / "model.xml").stat().st_size + (out / "model.bin").stat().st_size


def test_digits_int8_artifacts_run_in_both_runtimes_and_agree(digits_int8):
    out, _ = digits_int8
    outputs = run_artifacts(out)
    assert set(outputs) == {"model.xml", "model.onnx"}
    x = np.load(DIGITS_EVAL)["input"][:1]
    ov_logits = open_session(out / "model.xml", RuntimeSettings(inference_precision="f32")).infer({"x": x})[0]
    ort_logits = open_session(out / "model.onnx").infer({"x": x})[0]
    assert ov_logits.shape == ort_logits.shape == (1, 10)
    assert ov_logits.argmax() == ort_logits.argmax()


def test_report_states_how_quality_was_measured(digits_int8):
    _, report = digits_int8
    assert report["quality"]["evaluated_with"]["openvino"]["inference_precision"] == "f32"
    assert report["quality"]["evaluated_with"]["onnx"]["runtime"] == "onnxruntime"
    assert report["host"]["cpu_model"]
    assert report["versions"]["openvino"] and report["versions"]["nncf"]


@pytest.mark.parametrize("kind", ["factory", "onnx", "ir", "torchscript", "export"])
def test_each_input_kind_compresses_to_int8(kind, cli, tmp_path, tiny_factory, tiny_onnx, tiny_ir, tiny_torch,
                                            tiny_calib):
    module, example = tiny_torch
    if kind == "torchscript":
        model = tmp_path / "tiny.pt"
        torch.jit.trace(module, example).save(str(model))
        extra = ["--input-shape", "input=1,1,8,8"]
    elif kind == "export":
        model = tmp_path / "tiny.pt2"
        torch.export.save(torch.export.export(module, (example,)), str(model))
        extra = []
    else:
        model, extra = {"factory": tiny_factory, "onnx": tiny_onnx, "ir": tiny_ir}[kind], []
    out = tmp_path / "out"
    result = cli("compress", model, "--calib", tiny_calib, "--out", out, "--quiet", *extra)
    assert result.exit_code == 0, result.output
    outputs = run_artifacts(out)
    expected = {"model.xml"} if kind == "ir" else {"model.xml", "model.onnx"}
    assert set(outputs) == expected
    assert all(o.shape == (1, 10) for o in outputs.values())
    report = json.loads((out / "report.json").read_text())
    assert {a["precision"] for a in report["artifacts"]} == {"int8"}
    # Provenance: the source's files by sha256 (IR: .xml and .bin), and for PyTorch the weights as loaded.
    source = report["inputs"]["model"]
    assert len(source["files"]) == (2 if kind == "ir" else 1) and all(len(v) == 64 for v in source["files"].values())
    assert (source["weights_sha256"] is not None) == (kind in ("factory", "torchscript", "export"))
    assert report["inputs"]["calibration"]["samples"] == 64 and report["inputs"]["evaluation"] is None
    assert not any("ExportedProgram" in note for note in report["notes"])  # a program runs as the module it holds
    if kind == "export":
        evaluated = cli("compress", model, "--calib", tiny_calib, "--eval", tiny_calib, "--out", tmp_path / "e",
                        "--quiet", "--format", "openvino")
        assert evaluated.exit_code == 0, evaluated.output


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_float_precisions(precision, cli, tmp_path, tiny_onnx, tiny_calib):
    out = tmp_path / precision
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--eval", tiny_calib, "--out", out,
                 "--precision", precision, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert {a["precision"] for a in report["artifacts"]} == {precision}
    for quality in report["quality"]["artifacts"].values():
        assert quality["fidelity"]["cosine"] > 0.999
    fp_bytes = (out / "model.bin").stat().st_size
    assert fp_bytes < report["fp32_ir_bytes"] if precision == "fp16" else fp_bytes <= report["fp32_ir_bytes"]


def test_quality_gate_failure_exits_3_and_keeps_the_report(cli, tmp_path, tiny_onnx, tiny_calib):
    # Without labels the gate checks cosine similarity to the original; INT8 cannot reach 0.9999999.
    out = tmp_path / "out"
    npy = tmp_path / "eval.npy"
    np.save(npy, np.load(tiny_calib)["input"])
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--eval", npy, "--out", out,
                 "--min-cosine", "0.9999999")
    assert result.exit_code == 3
    assert "quality gate failed" in result.output
    assert "--repair tries cheaper fixes" in result.output  # the IR's INT8 missed it: the ladder may pass it
    assert "--weights int8_asym stores int8 weights and computes in float" in result.output  # or float compute
    assert json.loads((out / "report.json").read_text())["quality"]["passed"] is False
    # without --eval nothing gates, but the artifacts are still compared on calibration samples, and one
    # below the gate's cosine is said: a figure in the report and a warning, exit 0
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--out", tmp_path / "ungated",
                 "--min-cosine", "0.9999999")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "ungated" / "report.json").read_text())
    assert report["quality"]["passed"] is None
    assert set(report["quality"]["in_sample_cosine"]) == {"openvino", "onnx"}
    for fmt, cosine in report["quality"]["in_sample_cosine"].items():
        assert 0.9 < cosine < 0.9999999
        assert f"edgeopt: warning: the {fmt} artifact's worst output reads cosine {cosine:.4f}" in result.stderr


def test_json_to_stdout_is_pure_json(cli, tmp_path, tiny_onnx, tiny_calib):
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--out", tmp_path / "o", "--json", "-")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["recipe"] == "int8"


def test_same_inputs_give_byte_identical_artifacts(cli, tmp_path, tiny_factory, tiny_calib):
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert cli("compress", tiny_factory, "--calib", tiny_calib, "--out", out, "--quiet").exit_code == 0
        digests.append({p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".xml", ".bin", ".onnx")})
    assert digests[0] == digests[1] and len(digests[0]) == 3


def test_counter_numbers_inside_names_are_renumbered(tiny_ir, tmp_path):
    """OpenVINO's process-wide counters also appear inside derived names (NNCF's ``Multiply_47514/fq_weights_1``);
    two copies that differ only in those numbers must save byte-identical."""
    import openvino as ov

    from edgeopt.formats import FORMATS

    saved = []
    for counter in (7, 987654):
        model = ov.Core().read_model(tiny_ir)
        ops = model.get_ordered_ops()
        ops[1].set_friendly_name(f"Multiply_{counter}")
        ops[2].set_friendly_name(f"Multiply_{counter}/fq_weights_1")
        FORMATS["openvino"].canonicalize(model)
        assert ops[2].get_friendly_name() == ops[1].get_friendly_name() + "/fq_weights_1"
        ov.save_model(model, tmp_path / f"{counter}.xml", compress_to_fp16=False)
        saved.append((tmp_path / f"{counter}.xml").read_bytes())
    assert saved[0] == saved[1]


def test_python_api(tmp_path, tiny_onnx, tiny_calib):
    import edgeopt

    result = edgeopt.compress(tiny_onnx, tiny_calib, out=tmp_path / "api", recipe="fp16", formats=("openvino",),
                              eval_data=tiny_calib)
    assert [a.format for a in result.artifacts] == ["openvino"]
    assert result.artifacts[0].path == tmp_path / "api" / "model.xml" and result.artifacts[0].path.is_file()
    assert result.quality_passed and result.qualities["openvino"].fidelity.cosine > 0.999


def test_int8_recipe_file_sets_preset_subset_and_ignored_scope(cli, tmp_path, tiny_onnx, tiny_calib):
    import openvino as ov

    names = [op.get_friendly_name() for op in ov.Core().read_model(str(tiny_onnx)).get_ops()
             if op.get_type_name() == "MatMul"]
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[[step]]\nname = "int8"\npreset = "mixed"\nsubset_size = 16\nignored_scope = ["{names[0]}"]\n')
    out = tmp_path / "out"
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--recipe", recipe, "--format", "openvino", "--out",
                 out, "--json", tmp_path / "r.json", "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["recipe_steps"] == [{"name": "int8", "params": {"preset": "mixed", "subset_size": 16,
                                                                  "ignored_scope": [names[0]]}}]
    assert "preset=mixed (set by the recipe), subset=16" in report["notes"][0]
    model = ov.Core().read_model(str(out / "model.xml"))
    quantized_inputs = {op.input_value(1).get_node().get_type_name() for op in model.get_ops()
                        if op.get_friendly_name() == names[0]}
    assert "FakeQuantize" not in quantized_inputs  # the ignored layer keeps float weights
    assert any(op.get_type_name() == "FakeQuantize" for op in model.get_ops())  # the rest is quantized
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nname = "int8"\nturbo = true\n')
    result = cli("compress", tiny_onnx, "--calib", tiny_calib, "--recipe", bad, "--out", tmp_path / "o2")
    assert result.exit_code == 2 and "unknown parameter(s) turbo" in result.stderr


def _convs(path, count: int):
    """An ONNX file (opset 13, input ``input`` 1x1x8x8) of ``count`` 3x3 Convs with a ReLU between each two,
    named ``/0/Conv``, ``/2/Conv``, ... as torch exports them."""
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(1 if i == 0 else 8, 4 if i == count - 1 else 8, 3) for i in range(count)]
    torch.onnx.export(torch.nn.Sequential(*[m for conv in layers for m in (conv, torch.nn.ReLU())][:-1]).eval(),
                      (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False, opset_version=13, input_names=["input"])
    return path


def _with_int8_step(cli, tmp_path, model, calib, step: str, out: str, *options):
    """``compress model`` with a recipe of one int8 step holding the TOML line(s) ``step``, into ``tmp_path/out``."""
    recipe = tmp_path / f"{out}.toml"
    recipe.write_text(f'[[step]]\nname = "int8"\n{step}\n')
    return cli("compress", model, "--calib", calib, "--recipe", recipe, "--out", tmp_path / out, *options)


def _ir_conv_weights(xml) -> dict[str, str]:
    """Each Convolution of an IR -> the op its weights come from: ``Constant`` (float), ``Multiply`` (INT8)."""
    import openvino as ov

    return {op.get_friendly_name(): op.input_value(1).get_node().get_type_name()
            for op in ov.Core().read_model(str(xml)).get_ops() if op.get_type_name() == "Convolution"}


def test_ignored_scope_takes_onnx_node_names_and_refuses_unknown_ones(cli, tmp_path, tiny_calib):
    """An ONNX Conv named in ignored_scope keeps float weights in the IR too (OpenVINO names its Convolution
    ``NAME/WithoutBiases`` and gives ``NAME`` to the bias Add, so the name alone left the Conv quantized); a name
    neither graph has is refused instead of silently ignored."""
    model = _convs(tmp_path / "convs.onnx", 2)
    result = _with_int8_step(cli, tmp_path, model, tiny_calib, 'ignored_scope = ["/0/Conv"]', "out", "--quiet")
    assert result.exit_code == 0, result.output
    weights = _ir_conv_weights(tmp_path / "out" / "model.xml")
    assert weights == {"/0/Conv/WithoutBiases": "Constant", "/2/Conv/WithoutBiases": "Multiply"}  # float; INT8
    result = _with_int8_step(cli, tmp_path, model, tiny_calib, 'ignored_scope = ["no_such_node"]', "o2")
    assert result.exit_code == 2 and "ignored_scope names no operation of the model: no_such_node" in result.output


def test_an_artifact_larger_than_the_source_file_is_said_and_names_in_brackets_print_as_text(cli, tmp_path):
    """A small ONNX file can become a larger IR (basic-pitch: 225 KiB ONNX, 335 KiB INT8 IR shown as "1.04x
    smaller" than the FP32 IR): the note says so. Each artifact's size column compares it with the FP32 model in
    its own format, and text such as a folder named ``out[v2]`` prints as written, not as rich markup."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "small",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    model = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32))
    out = tmp_path / "out[v2]"
    result = cli("compress", model, "--calib", tmp_path / "c.npz", "--out", out)
    assert result.exit_code == 0, result.output
    notes = json.loads((out / "report.json").read_text())["notes"]
    said = [n for n in notes if n.startswith("the openvino artifact (") and "the size of the source file small.onnx"
            in n]
    assert said, notes
    assert "out[v2]" in result.output and "vs FP32" in result.output and "(onnx)" in result.output, result.output


def test_ignored_patterns_keep_every_matching_operation_float_in_both_files(cli, tmp_path, tiny_calib):
    """basic-pitch's front end is 200 tf2onnx nodes under one prefix: ``ignored_patterns`` names them at once, in
    the IR (its operations' names) and the ONNX file (its node names); a pattern that matches nothing, or is no
    regular expression, is refused in one line."""
    import onnx

    model, out = _convs(tmp_path / "convs.onnx", 3), tmp_path / "out"
    result = _with_int8_step(cli, tmp_path, model, tiny_calib, 'ignored_patterns = ["/[02]/"]\nonnx_backend = "ort"',
                             "out", "--quiet")
    assert result.exit_code == 0, result.output
    weights = _ir_conv_weights(out / "model.xml")
    assert weights == {"/0/Conv/WithoutBiases": "Constant", "/2/Conv/WithoutBiases": "Constant",
                       "/4/Conv/WithoutBiases": "Multiply"}  # float, float; INT8
    graph = onnx.load(str(out / "model.onnx")).graph
    producers = {output: node.op_type for node in graph.node for output in node.output}
    fed = {node.name: producers.get(node.input[1], "initializer") for node in graph.node if node.op_type == "Conv"}
    assert fed == {"/0/Conv": "initializer", "/2/Conv": "initializer", "/4/Conv": "DequantizeLinear"}, fed
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert any(n.startswith("int8: ignored_patterns /[02]/ keep ") for n in notes), notes
    for pattern, says in (("/9/", "ignored_patterns match no operation of the model: /9/"),
                          ("[", "ignored_patterns: '[' is not a regular expression")):
        result = _with_int8_step(cli, tmp_path, model, tiny_calib, f'ignored_patterns = ["{pattern}"]', "o2")
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output


def _one_input_factory(tmp_path, forward: str) -> tuple[str, Path]:
    """A factory file whose module's ``forward(self, x)`` returns ``forward`` (x: 1 x 16), and data for it."""
    factory = tmp_path / "made.py"
    factory.write_text("import torch\nclass Made(torch.nn.Module):\n    def forward(self, x):\n"
                       f"        return {forward}\n"
                       "def build():\n    return Made().eval(), torch.zeros(1, 16)\n")
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(0).random((4, 1, 16), dtype=np.float32))
    return f"{factory}:build", data


def test_json_to_stdout_stays_json_when_native_code_prints(tmp_path):
    """torch's ONNX exporter prints its IR graph from C++ to file descriptor 1 when an export fails (PESTO's
    complex-valued CQT: 160 lines before the report), past sys.stdout: ``--json -`` must still be JSON alone, and
    stderr carries edgeopt's lines only."""
    import subprocess
    import sys

    factory, data = _one_input_factory(  # a complex square: TorchScript's exporter fails, the dynamo one does not
        tmp_path, "(lambda z: torch.view_as_real(z * z).sum(-1))(torch.view_as_complex(torch.stack([x, x.flip(-1)], "
                  "-1)))")
    command = [sys.executable, "-c", "from edgeopt.cli import main; main(prog_name='edgeopt')", "compress",
               factory, "--calib", str(data), "--out", str(tmp_path / "o"), "--json", "-"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr  # the TorchScript export fails, the dynamo export does it
    assert json.loads(run.stdout)["schema_version"]
    assert "torchvision" not in run.stderr  # the exporter's registry chatter, not for a CLI user


def test_a_model_only_onnx_cannot_export_gets_the_format_that_converts(cli, tmp_path):
    """PESTO's whole pipeline (a complex-valued CQT) converts to an IR but not to ONNX: the refusal says which
    --format writes what did convert."""
    factory, data = _one_input_factory(tmp_path, "torch.searchsorted(torch.linspace(0, 1, 8), x).float() + x")
    result = cli("compress", factory, "--calib", data, "--out", tmp_path / "o")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().endswith("; --format openvino writes the OpenVINO IR without it"), result.stderr


def test_torchscript_files_as_silero_ships_them_get_one_clear_line(cli, tmp_path, tiny_calib):
    """Silero's stress models: a torch.package archive (called "possibly corrupted"), a scripted model taking
    List[str] (asked for shapes), one taking int64 ids (fed float zeros: "the TorchScript interpreter failed").
    Each is one line naming what to do; a torch.save checkpoint is no package, and shapes are asked for by name."""
    from typing import List

    class Words(torch.nn.Module):
        def forward(self, ids: torch.Tensor, words: List[str]) -> torch.Tensor:
            return ids * len(words)

    scripted = tmp_path / "words.pt"
    torch.jit.script(Words()).save(str(scripted))
    embed = tmp_path / "embed.pt"
    torch.jit.trace(torch.nn.Embedding(10, 4), torch.zeros(1, 5, dtype=torch.int64)).save(str(embed))
    package = tmp_path / "package.pt"
    with torch.package.PackageExporter(str(package)) as exporter:
        exporter.intern("**")
        exporter.save_pickle("model", "model.pkl", torch.nn.Linear(2, 2))
    checkpoint = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), str(checkpoint))
    cases = [(package, [], "a torch.package archive, not a TorchScript file: load its model in a factory"),
             (checkpoint, [], "not a TorchScript or torch.export archive"),
             (scripted, [], "input 'words' is List[str], not a tensor: edgeopt feeds tensors"),
             (embed, [], "give the input shapes with --input-shape input=D1,D2,..."),
             (embed, ["--input-shape", "input=1,5"], "Expected tensor for argument #1 'indices' to have one of the "
                                                     "following scalar types: Long, Int")]
    for model, extra, says in cases:
        result = cli("compress", model, "--calib", tiny_calib, "--out", tmp_path / "o", *extra)
        assert result.exit_code == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "it wants integer inputs, and a TorchScript file records no input types" in result.stderr
