"""Weight-only compression (the ``weights`` pass) on a tiny LLaMA-style transformer built here in a second."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeopt.data import load_samples
from edgeopt.errors import BadInputError
from edgeopt.evaluate import language_model_ids, next_token_fidelity
from edgeopt.passes.base import PassContext, WorkingModel
from edgeopt.passes.weights import WeightsConfig, default_weight_compression, weights
from edgeopt.source import load_model
from edgeopt.formats import artifact_weight_bytes
from edgeopt.weight_bytes import onnx_weight_bytes, openvino_weight_bytes

ROOT = Path(__file__).resolve().parents[1]
VOCAB, LENGTH, WIDTH = 64, 16, 64
INT4, INT8 = {"i4", "u4"}, {"i8", "u8"}


def _sequences(count: int, seed: int) -> np.ndarray:
    """Token sequences that follow a fixed rule (next = 5 * token + 3 mod VOCAB) from random first tokens."""
    ids = np.empty((count, LENGTH), np.int64)
    ids[:, 0] = np.random.default_rng(seed).integers(0, VOCAB, count)
    for t in range(1, LENGTH):
        ids[:, t] = (5 * ids[:, t - 1] + 3) % VOCAB
    return ids


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> str:
    """A ``file.py:build`` spec: 2 causal blocks (width 64, SwiGLU), trained here for a few seconds on
    ``_sequences`` so that its next-token predictions are confident (as a real LM's are)."""
    import importlib.util

    import torch

    folder = tmp_path_factory.mktemp("tiny_lm")
    (folder / "lm.py").write_text(
        "import sys, torch\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(ROOT / 'samples')!r})\n"
        "from tiny_transformer import Block\n"
        "class LM(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.tokens = torch.nn.Embedding({VOCAB}, {WIDTH})\n"
        f"        self.blocks = torch.nn.Sequential(*(Block({WIDTH}, 4, {2 * WIDTH}, True, True) for _ in range(2)))\n"
        f"        self.head = torch.nn.Linear({WIDTH}, {VOCAB})\n"
        "    def forward(self, ids):\n"
        "        return self.head(self.blocks(self.tokens(ids)))\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    model = LM()\n"
        "    model.load_state_dict(torch.load(Path(__file__).with_name('lm.pt'), weights_only=True))\n"
        f"    return model.eval(), torch.zeros(1, {LENGTH}, dtype=torch.int64)\n"
    )
    spec = importlib.util.spec_from_file_location("weights_test_lm", folder / "lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.LM()
    data = torch.from_numpy(_sequences(256, seed=1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(60):
        batch = data[(step * 32) % 256:][:32]
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), folder / "lm.pt")
    return f"{folder / 'lm.py'}:build"


@pytest.fixture(scope="module")
def token_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "ids.npz"
    np.savez(path, input=_sequences(16, seed=2))
    return path


@pytest.fixture(scope="module")
def source(tiny_lm):
    return load_model(tiny_lm)


def _compress(source, token_data, onnx: bool = False, **params) -> WorkingModel:
    from edgeopt.source import to_onnx

    graphs = {"openvino": source.openvino_model()}
    if onnx:
        graphs["onnx"] = to_onnx(source.torch_module, source.example_input, source.input_names)
    model = WorkingModel(source, graphs=graphs)
    weights(model, PassContext(calibration=load_samples(token_data, source.inputs)), WeightsConfig(**params))
    return model


def _int4_group_sizes(ov_model) -> set[int]:
    return {op.get_output_shape(0)[-1] for op in ov_model.get_ops()
            if op.get_type_name() == "Constant" and op.get_element_type().get_type_name() in INT4}


def test_int8_and_int4_shrink_weight_bytes(source, token_data):
    fp32 = openvino_weight_bytes(source.openvino_model())
    assert set(fp32.by_type) == {"f32"}
    sizes = {}
    for mode in ("int8_sym", "int8_asym", "int4_sym", "int4_asym"):
        compressed = _compress(source, token_data, mode=mode, group_size=32 if mode.startswith("int4") else None,
                               ratio=1.0 if mode.startswith("int4") else None, all_layers=mode.startswith("int4"))
        sizes[mode] = openvino_weight_bytes(compressed.ov_model)
        kinds = INT4 if mode.startswith("int4") else INT8
        assert kinds & set(sizes[mode].by_type), (mode, sizes[mode].by_type)
        assert compressed.notes[0].startswith(f"weights: {mode}")
    # int8: 1 byte per weight + per-channel scales; int4 group 32: half a byte + a 2-byte scale per 32 weights
    assert fp32.total / sizes["int8_sym"].total >= 3.5
    assert fp32.total / sizes["int4_sym"].total >= 5
    assert sizes["int4_asym"].total < sizes["int8_asym"].total


def test_group_size_is_respected(source, token_data):
    for group in (16, 32):
        compressed = _compress(source, token_data, mode="int4_sym", group_size=group, ratio=1.0, all_layers=True)
        assert _int4_group_sizes(compressed.ov_model) == {group}


def test_ratio_mixes_int4_with_backup_precision(source, token_data):
    mixed = openvino_weight_bytes(_compress(source, token_data, mode="int4_sym", group_size=32, ratio=0.5).ov_model)
    assert INT4 & set(mixed.by_type) and INT8 & set(mixed.by_type)
    # without --all-layers the embedding and the head stay out of INT4; backup none leaves them in float
    unbacked = _compress(source, token_data, mode="int4_sym", group_size=32, ratio=1.0, backup_mode="none")
    by_type = openvino_weight_bytes(unbacked.ov_model).by_type
    assert not INT8 & set(by_type) and by_type.get("f32", 0) >= 2 * VOCAB * WIDTH * 4
    assert unbacked.precision == "int4/float weights"


def test_data_aware_options_run_on_both_backends(source, token_data):
    model = _compress(source, token_data, onnx=True, mode="int4_sym", group_size=32, ratio=0.8, awq=True,
                      scale_estimation=True, subset_size=8)
    assert "data-aware awq+scale_estimation on 8 calibration samples" in model.notes[0]
    # SwiGLU (MatMul·Multiply→MatMul) is an AWQ pattern for the OpenVINO backend; skips are reported, not hidden
    assert not any(note.startswith("weights (OpenVINO): NNCF:") for note in model.notes)
    graph = model.graphs["onnx"].graph
    assert {"MatMulNBits", "DequantizeLinear"} <= {node.op_type for node in graph.node}
    readers = {i: n.op_type for n in graph.node for i in n.input}
    for node in (n for n in graph.node if n.op_type == "DequantizeLinear"):  # the int8 rest: fused by ONNX Runtime
        assert readers[node.output[0]] == "MatMul" and [a.i for a in node.attribute if a.name == "axis"] == [1]
    assert onnx_weight_bytes(model.graphs["onnx"]).total < openvino_weight_bytes(source.openvino_model()).total / 3
    gptq = _compress(source, token_data, mode="int4_sym", group_size=32, ratio=1.0, gptq=True, subset_size=4)
    assert "data-aware gptq on 4 calibration samples" in gptq.notes[0]
    assert INT4 & set(openvino_weight_bytes(gptq.ov_model).by_type)


def test_next_token_fidelity_on_known_logits():
    ids = np.array([[0, 1, 2, 3]])
    uniform = np.zeros((1, 4, 8))
    same = next_token_fidelity(uniform, uniform, ids)
    assert same.top1_agreement == 1.0 and same.perplexity == pytest.approx(8.0) and same.perplexity_ratio == 1.0
    confident = uniform.copy()
    confident[0, np.arange(3), ids[0, 1:]] = np.log(7.0)  # p(next) = 7 / (7 + 7) = 0.5 at every scored position
    result = next_token_fidelity(confident, uniform, ids)
    assert result.perplexity == pytest.approx(2.0) and result.top1_agreement == 0.25
    assert result.check(min_agreement=0.2, max_perplexity_ratio=1.0)[0]
    assert not result.check(min_agreement=0.5, max_perplexity_ratio=1.0)[0]


def test_cli_int4_reports_weight_bytes_and_fidelity(cli, tiny_lm, token_data, tmp_path):
    out = tmp_path / "int4"
    result = cli("compress", tiny_lm, "--calib", str(token_data), "--eval", str(token_data),
                 "--weights", "int4_sym", "--group-size", "32", "--ratio", "0.8", "--out", str(out),
                               "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    sizes = report["weight_bytes"]
    assert sizes["openvino"]["bytes"] == artifact_weight_bytes(out / "model.xml").total
    assert sizes["openvino"]["bytes"] < sizes["fp32_openvino"]["bytes"] / 4
    assert report["quality"]["passed"] and report["quality"]["artifacts"]["onnx"]["fidelity"]["cosine"] > 0.99
    assert "weight bytes (openvino)" in result.output
    for artifact in ("openvino", "onnx"):  # a language model is also gated on next-token fidelity
        quality = report["quality"]["artifacts"][artifact]
        tokens = quality["tokens"]
        assert 0.8 <= tokens["top1_agreement"] <= 1 and tokens["reference_perplexity"] > 1
        assert tokens["perplexity"] / tokens["reference_perplexity"] <= 1.1 and quality["passed"]
        assert "next-token agreement" in quality["check"]


def test_language_models_are_recognised_by_shapes():
    ids = {"input": np.zeros((1, 4), np.int64)}
    samples = type("Samples", (), {"samples": [ids, ids]})()
    assert next(iter(language_model_ids(lambda f: [np.zeros((1, 4, 8))], samples))).shape == (4,)
    assert language_model_ids(lambda f: [np.zeros((1, 32))], samples) is None  # an embedding
    floats = type("Samples", (), {"samples": [{"input": np.zeros((1, 4), np.float32)}]})()
    assert language_model_ids(lambda f: [np.zeros((1, 4, 8))], floats) is None


def test_auto_picks_int4_for_memory_tight_targets(source, tiny_onnx):
    from edgeopt.targets import load_target

    transformer = source.openvino_model()
    tight = default_weight_compression(load_target("raspberry-pi-4"), transformer)
    assert tight.params == {"mode": "int4_sym", "group_size": 128, "ratio": 0.8}
    assert "memory-tight" in tight.reason and "4096 MB RAM" in tight.reason
    roomy = default_weight_compression(load_target("intel-core-i7-1165g7"), transformer)
    assert roomy.params == {"mode": "int8_asym"} and "with room" in roomy.reason
    conv = load_model(tiny_onnx).openvino_model()
    assert default_weight_compression(load_target("raspberry-pi-4"), conv).params == {"mode": "int8_asym"}


def test_auto_with_target_records_choice_and_validates(cli, tiny_lm, token_data, tmp_path):
    out = tmp_path / "auto"
    result = cli("compress", tiny_lm, "--calib", str(token_data), "--weights", "auto", "--target",
                               "raspberry-pi-4", "--group-size", "32", "--format", "openvino", "--out", str(out),
                               "--validate-runs", "20", "--validate-seconds", "0")
    # budgets are checked on this shared host (exit 4 when e.g. latency jitter exceeds the profile's): either way
    # the artifact was written, validated and reported
    assert result.exit_code in (0, 4), result.output
    report = json.loads((out / "report.json").read_text())
    assert any("auto: transformer on memory-tight target raspberry-pi-4" in note for note in report["notes"])
    assert report["recipe"] == "weights(group_size=32, mode=auto)"  # the target reaches the pass in its context
    assert report["validation"]["target"] == "raspberry-pi-4"


@pytest.mark.parametrize("args, message", [
    (["--weights", "int8_sym", "--group-size", "32"], "group_size applies to INT4 modes only"),
    (["--weights", "int4_sym", "--ratio", "1.5"], "ratio must be in (0, 1]"),
    (["--weights", "int4_sym", "--group-size", "48", "--ratio", "1", "--all-layers"], "weights (OpenVINO)"),
    (["--weights", "int4_asym"], "int4_asym cannot be saved as ONNX"),
    (["--weights", "int4_sym", "--gptq"], "NNCF's ONNX backend has no GPTQ"),
    (["--weights", "int8_asym", "--awq"], "awq apply to INT4 modes only"),
    (["--group-size", "32"], "--group-size: need --weights MODE"),
    (["--weights", "auto", "--ratio", "0.5"], "(mode=auto chose int8_asym: transformer, no target profile"),
    (["--weights", "int8_sym", "--precision", "int8"], "give either --precision or --weights"),
])
def test_bad_weight_options_exit_2(cli, tiny_lm, token_data, tmp_path, args, message):
    out = tmp_path / "bad"
    result = cli("compress", tiny_lm, "--calib", str(token_data), "--out", str(out), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_bad_recipe_parameters_are_bad_input(source, token_data, tmp_path):
    with pytest.raises(BadInputError, match="sensitivity_metric must be one of"):
        _compress(source, token_data, mode="int4_sym", sensitivity_metric="loudness")
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[step]]\nname = "weights"\nmode = "int4_sym"\ngroup = 64\n')
    from edgeopt.recipe import parse_recipe

    with pytest.raises(BadInputError, match="unknown parameter"):
        parse_recipe(str(recipe))


def test_int8_weights_of_an_old_opset_onnx_file_with_constant_weights(cli, tiny_torch, tmp_path):
    """Keras2onnx and Paddle2ONNX files sit at opset 11-12 with their weights in Constant nodes: NNCF's ONNX weight
    compression refused per-channel scales below opset 13 (exit 2 with both formats) and left Constant weights
    float. The step normalises the file first, as int8 does, and says so."""
    import onnx
    import torch
    from onnx import helper

    module, example = tiny_torch
    path = tmp_path / "old.onnx"
    torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=12, input_names=["input"])
    model = onnx.load(str(path))
    constants = [helper.make_node("Constant", [], [init.name], value=init) for init in model.graph.initializer]
    del model.graph.initializer[:]
    nodes = constants + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path))
    before = onnx_weight_bytes(onnx.load(str(path)))
    data = tmp_path / "d.npz"
    np.savez(data, input=np.random.default_rng(0).random((8, *example.shape), dtype=np.float32))
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", data, "--weights", "int8_asym", "--out", out)
    assert result.exit_code == 0, result.output
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert "weights (ONNX): opset 12 -> 13 (onnx.version_converter)" in notes
    assert any(note.startswith("weights (ONNX):") and "Constant node(s) moved to initializers" in note for note in notes)
    assert (out / "model.onnx").stat().st_size < 0.5 * path.stat().st_size, before  # int8 weights, not float


@pytest.mark.parametrize("mode", ["int8_asym", "int8_sym"])
def test_int8_weights_of_a_one_channel_conv_load_in_onnx_runtime(cli, tmp_path, mode):
    """basic-pitch's last Conv has one output channel: NNCF stored its scale as ``[1, 1, 1]``, which ONNX Runtime
    refuses ("scale must be 1D tensor with size 1") and edgeopt took for a per-tensor scale (exit 1)."""
    import onnxruntime as ort
    import torch
    from torch import nn

    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 1, 3)).eval()
    path = tmp_path / "one.onnx"
    torch.onnx.export(module, (torch.zeros(1, 3, 16, 16),), str(path), dynamo=False, opset_version=15,
                      input_names=["x"])
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).random((8, 3, 16, 16), dtype=np.float32))
    out = tmp_path / "out"
    result = cli("compress", path, "--calib", tmp_path / "d.npz", "--weights", mode, "--format", "onnx",
                 "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got, = session.run(None, {"x": np.ones((1, 3, 16, 16), np.float32)})
    want = module(torch.ones(1, 3, 16, 16)).detach().numpy()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
