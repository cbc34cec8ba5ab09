"""Inputs as users hold them: rank-0 and int64 inputs, per-input batch axes, dict/keyword example inputs, local
Hugging Face model folders with text calibration — each compressed end to end with real NNCF, OpenVINO, ONNX
Runtime and torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_support import FAST, LOOSE_TAIL, LOOSE_TARGET, members
from torch import nn

from edgeopt.batch_axes import model_batch_axis, parse_batch_axes
from edgeopt.data import load_samples
from edgeopt.device.bundle_reader import open_bundle
from edgeopt.device.runtime import TensorSpec
from edgeopt.errors import BadInputError
from edgeopt.source import load_model

HERE = Path(__file__).resolve().parent


class TinyVAD(nn.Module):
    """A recurrent voice-activity model shaped like Silero VAD's ONNX export: audio [B, 512], a two-layer
    recurrent state [2, B, 32] batched on axis 1, and a rank-0 int64 sample rate; returns the speech probability
    [B, 1] and the new state."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 16, 16, stride=8)
        self.cell0, self.cell1 = nn.GRUCell(16, 32), nn.GRUCell(32, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, input, state, sr):
        audio = input * (sr.to(torch.float32) / 16000.0)
        features = torch.relu(self.conv(audio.unsqueeze(1))).mean(dim=2)
        h0 = self.cell0(features, state[0])
        h1 = self.cell1(h0, state[1])
        return torch.sigmoid(self.head(h1)), torch.stack([h0, h1])


def _vad() -> TinyVAD:
    torch.manual_seed(0)
    return TinyVAD().eval()


@pytest.fixture(scope="module")
def vad_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vad") / "vad.onnx"
    example = (torch.zeros(1, 512), torch.zeros(2, 1, 32), torch.tensor(16000))
    torch.onnx.export(_vad(), example, str(path), dynamo=False, opset_version=17,
                      input_names=["input", "state", "sr"], output_names=["output", "stateN"],
                      dynamic_axes={"input": {0: "batch"}, "state": {1: "batch"}, "stateN": {1: "batch"}})
    return path


def _audio(rng, count: int) -> np.ndarray:
    t = np.arange(512) / 16000.0
    tones = np.sin(2 * np.pi * rng.uniform(100, 900, (count, 1)) * t) * rng.uniform(0, 1, (count, 1))
    return (tones + 0.05 * rng.standard_normal((count, 512))).astype(np.float32)


@pytest.fixture(scope="module")
def vad_data(tmp_path_factory) -> dict[str, Path]:
    """The same kind of data as .npz (state concatenated on its batch axis, sr shared) and as a hook."""
    folder = tmp_path_factory.mktemp("vad-data")
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", input=_audio(rng, 48),
             state=(0.1 * rng.standard_normal((2, 48, 32))).astype(np.float32), sr=np.array(16000))
    (folder / "hook.py").write_text(
        "import numpy as np\n"
        "def samples():\n"
        "    rng = np.random.default_rng(1)\n"
        "    t = np.arange(512) / 16000.0\n"
        "    for _ in range(24):\n"
        "        audio = np.sin(2 * np.pi * rng.uniform(100, 900) * t) * rng.uniform(0, 1)\n"
        "        state = 0.1 * rng.standard_normal((2, 32))  # one sample, without its batch axis\n"
        "        yield {'input': audio.astype('float32')[None], 'state': state.astype('float32'), 'sr': 16000}\n")
    return {"npz": folder / "calib.npz", "hook": f"{folder / 'hook.py'}:samples"}


def test_batch_axis_is_read_off_the_model(vad_onnx):
    source = load_model(vad_onnx, {})
    by_name = {spec.name: spec for spec in source.inputs}
    assert by_name["input"].shape == (1, 512) and by_name["input"].batch_dim == 0
    assert by_name["state"].shape == (2, 1, 32) and by_name["state"].batch_dim == 1  # dynamic batch defaults to 1
    assert by_name["sr"].shape == () and by_name["sr"].dtype == "int64" and by_name["sr"].batch_dim is None
    assert source.output_names == ["output", "stateN"]


def test_batch_axis_rules_and_overrides(vad_onnx):
    assert model_batch_axis([(2, None), (None, None), (128, None)]) == 1
    assert model_batch_axis([(2, None), (1, None), (128, None)]) == 1
    assert model_batch_axis([(1, None), (None, "sequence")]) == 0
    assert model_batch_axis([(None, "seq"), (4, None), (None, "batch_size")]) == 2
    assert model_batch_axis([]) is None
    assert parse_batch_axes(["state=1", "sr=none"]) == {"state": 1, "sr": None}
    with pytest.raises(BadInputError, match="NAME=AXIS"):
        parse_batch_axes(["state"])
    overridden = load_model(vad_onnx, {"state": (2, 1, 32)}, {"state": 2})
    assert {s.name: s.batch_dim for s in overridden.inputs}["state"] == 2
    with pytest.raises(BadInputError, match="unknown input"):
        load_model(vad_onnx, {}, {"nope": 1})
    with pytest.raises(BadInputError, match="outside"):
        load_model(vad_onnx, {}, {"state": 5})


def test_samples_stacked_concatenated_shared_or_given_without_batch_axis(tmp_path):
    specs = [TensorSpec("input", (1, 4), "float32"), TensorSpec("state", (2, 1, 3), "float32", 1),
             TensorSpec("sr", (), "int64", None)]
    np.savez(tmp_path / "a.npz", input=np.zeros((5, 4)), state=np.arange(2 * 5 * 3.0).reshape(2, 5, 3), sr=np.int64(8000))
    samples = load_samples(tmp_path / "a.npz", specs)
    assert len(samples) == 5
    assert samples.samples[2]["state"].shape == (2, 1, 3) and samples.samples[2]["state"][1, 0, 0] == 2 * 5 * 3 // 2 + 6
    assert samples.samples[4]["sr"].shape == () and samples.samples[4]["sr"] == 8000
    np.savez(tmp_path / "b.npz", input=np.zeros((3, 1, 4)), state=np.zeros((3, 2, 1, 3)), sr=np.full(3, 16000))
    assert len(load_samples(tmp_path / "b.npz", specs)) == 3
    np.savez(tmp_path / "c.npz", input=np.zeros((3, 4)), state=np.zeros((2, 3, 4)), sr=np.int64(1))
    with pytest.raises(BadInputError, match="state.*expects \\[2,1,3\\].*batch axis 1$"):
        load_samples(tmp_path / "c.npz", specs)
    # an LSTM's (h, c) [layers, B, hidden] read as batched on axis 0 (its layers): the message names the flag
    np.savez(tmp_path / "d.npz", h=np.zeros((1, 6, 3)))
    with pytest.raises(BadInputError, match="batch axis 0; if its batch is on axis 1, say so with --batch-axis h=1"):
        load_samples(tmp_path / "d.npz", [TensorSpec("h", (1, 1, 3), "float32", 0)])


@pytest.mark.parametrize("data", ["npz", "hook"])
def test_stateful_model_with_scalar_input_compresses(tmp_path, vad_onnx, vad_data, data, cli):
    out = tmp_path / "out"
    result = cli(*["compress", str(vad_onnx), "--calib", str(vad_data[data]), "--eval", str(vad_data["hook"]),
                        "--out", str(out), "--min-cosine", "0.9"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    for fmt in ("openvino", "onnx"):
        outputs = report["quality"]["artifacts"][fmt]["outputs"]
        assert set(outputs) == {"output", "stateN"}
        assert all(o["cosine"] > 0.9 for o in outputs.values())
    assert report["artifacts"][0]["precision"] == "int8"


def test_factory_with_scalar_example_names_inputs_after_forward(tmp_path, vad_data, cli):
    (tmp_path / "vad.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import torch\nfrom test_inputs import _vad\n"
        "def build():\n    return _vad(), (torch.zeros(1, 512), torch.zeros(2, 1, 32), 16000)\n")
    source = load_model(f"{tmp_path / 'vad.py'}:build")
    assert source.input_names == ["input", "state", "sr"]
    assert [s.dtype for s in source.inputs] == ["float32", "float32", "int64"] and source.inputs[2].shape == ()
    out = tmp_path / "out"
    result = cli(*["compress", f"{tmp_path / 'vad.py'}:build", "--calib", str(vad_data["hook"]),
                        "--out", str(out), "--format", "openvino", "--batch-axis", "state=1"])
    assert result.exit_code == 0, result.output
    # one batch-1 sample with the state batched on axis 1: that batch is declared dynamic, checked, and kept
    opened = json.loads((out / "report.json").read_text())["decisions"]["dynamic_axes"]["openvino"]["opened"]
    assert opened == ["input[0]", "state[1]"]


class DictEncoder(nn.Module):
    """Keyword inputs and a dict output, as Hugging Face-style modules have them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        hidden = self.proj(self.embed(input_ids)) * attention_mask.unsqueeze(-1)
        return {"last_hidden_state": hidden, "pooled": hidden.mean(dim=1)}


def test_dict_example_input_names_inputs_and_outputs(tmp_path, cli):
    (tmp_path / "enc.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import torch\nfrom test_inputs import DictEncoder\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    ids = torch.zeros(1, 8, dtype=torch.int64)\n"
        "    return DictEncoder().eval(), {'input_ids': ids, 'attention_mask': torch.ones_like(ids)}\n")
    spec = f"{tmp_path / 'enc.py'}:build"
    source = load_model(spec)
    assert source.input_names == ["input_ids", "attention_mask"]
    assert source.output_names == ["last_hidden_state", "pooled"]
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ids.npz", input_ids=rng.integers(0, 50, (16, 8)), attention_mask=np.ones((16, 8), np.int64))
    out = tmp_path / "out"
    result = cli(*["compress", spec, "--calib", str(tmp_path / "ids.npz"), "--eval", str(tmp_path / "ids.npz"),
                        "--out", str(out), "--min-cosine", "0.95"])
    assert result.exit_code == 0, result.output
    import onnx
    import openvino as ov

    onnx_model = onnx.load(str(out / "model.onnx"))
    assert [i.name for i in onnx_model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in onnx_model.graph.output] == ["last_hidden_state", "pooled"]
    ir = ov.Core().read_model(str(out / "model.xml"))
    assert [p.get_any_name() for p in ir.inputs] == ["input_ids", "attention_mask"]
    assert [p.get_any_name() for p in ir.outputs] == ["last_hidden_state", "pooled"]


def test_dict_example_with_an_unknown_parameter_is_bad_input(tmp_path):
    (tmp_path / "enc.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import torch\nfrom test_inputs import DictEncoder\n"
        "def build():\n    return DictEncoder(), {'ids': torch.zeros(1, 8, dtype=torch.int64)}\n")
    with pytest.raises(BadInputError, match="no parameter.*ids"):
        load_model(f"{tmp_path / 'enc.py'}:build")


WORDS = "the a cat dog sat on mat ran fast slow red blue big small house tree river sky".split()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny BERT (random init) saved as a Hugging Face folder with its WordPiece tokenizer."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf") / "tiny-bert"
    folder.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    transformers.BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _texts(path: Path, seed: int, count: int, jsonl: bool = False) -> Path:
    """Random sentences; as ``.jsonl`` with a label each (a labelled set a feature extractor cannot score)."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, rng.integers(3, 14))) for _ in range(count)]
    lines = [json.dumps({"text": t, "label": i % 2}) for i, t in enumerate(texts)] if jsonl else texts
    path.write_text("\n".join(lines) + "\n")
    return path


def test_hugging_face_folder_compresses_with_text_calibration(tmp_path, hf_folder, cli):
    calib, held_out = _texts(tmp_path / "calib.txt", 0, 48), _texts(tmp_path / "eval.jsonl", 1, 24, jsonl=True)
    source = load_model(hf_folder, {"input_ids": (1, 24)}, task="feature-extraction")
    assert source.input_names == ["input_ids", "token_type_ids", "attention_mask"]
    assert source.output_names == ["last_hidden_state", "pooler_output"] and source.model_type == "transformer"
    samples = load_samples(calib, source.inputs, source.tokenizer)
    assert len(samples) == 48 and samples.samples[0]["input_ids"].shape == (1, 24)
    assert samples.samples[0]["attention_mask"].sum() < 24  # padded, not filled
    out = tmp_path / "out"
    result = cli(*["compress", str(hf_folder), "--task", "feature-extraction", "--calib", str(calib),
                        "--eval", str(held_out), "--input-shape", "input_ids=1,24", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert any("model_type=transformer" in note for note in report["notes"])
    for fmt in ("openvino", "onnx"):
        quality = report["quality"]["artifacts"][fmt]
        assert set(quality["outputs"]) == {"last_hidden_state", "pooler_output"}
        assert quality["outputs"]["last_hidden_state"]["cosine"] > 0.99
        assert quality["outputs"]["last_hidden_state"]["top1_agreement"] is None  # not a classifier
        assert quality["top1"] is None  # the labels: pooler_output is features, not class scores
    assert any("not scored: no output gives one score per class" in note for note in report["notes"])
    # the folder's config and tokenizer beside the artifacts, so out/ loads as the folder does
    assert (out / "config.json").read_bytes() == (hf_folder / "config.json").read_bytes()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    assert any(note.startswith(f"beside the artifacts, from {hf_folder}: config.json, ") for note in report["notes"])
    assert "tokenizer.json" in report["companions"]
    for name in report["companions"]:  # the folder's own files, not the tokenizer as calibration padded it
        if (hf_folder / name).is_file():
            assert (out / name).read_bytes() == (hf_folder / name).read_bytes(), name
    bundle = tmp_path / "bert.tar.gz"  # the bundle carries them, checksummed and in the provenance statement
    target = tmp_path / "loose.toml"
    target.write_text(LOOSE_TARGET.format(runtime="openvino") + LOOSE_TAIL.split("[model]")[0])
    packaged = cli("package", out, "--target", target, "--out", bundle, *FAST)
    assert packaged.exit_code == 0, packaged.output
    checked = open_bundle(bundle)
    assert set(report["companions"]) <= set(checked.manifest["files"])
    statement = json.loads(dict((i.name, d) for i, d in members(bundle))["provenance.intoto.json"])
    assert {"config.json", "tokenizer.json"} <= {subject["name"] for subject in statement["subject"]}
    _onnx_takes_any_batch_and_length(out / "model.onnx", hf_folder, report["decisions"]["dynamic_axes"]["onnx"])
    assert report["decisions"]["dynamic_axes"]["openvino"]["fixed"] == []


def _onnx_takes_any_batch_and_length(path: Path, folder: Path, decided: dict) -> None:
    """The ONNX artifact of a Hugging Face folder declares batch and length dynamic, as the folder's model takes
    them, and computes the model's result at a batch and length it was not calibrated at."""
    import onnxruntime as ort
    import transformers

    assert decided["fixed"] == [] and "input_ids[1]" in decided["opened"] and "attention_mask[1]" in decided["opened"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert all(isinstance(d, str) for i in session.get_inputs() for d in i.shape)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent))  # the one written beside it
    feeds = {name: np.asarray(value, np.int64) for name, value in tokenizer(
        ["the cat sat on the mat", "a big red house by the river under the blue sky ran fast"], padding=True,
        return_tensors="np").items()}
    assert feeds["input_ids"].shape == (2, 15)  # neither the calibrated batch 1 nor the length 24
    got = session.run(["last_hidden_state"], feeds)[0]
    with torch.no_grad():
        expected = transformers.AutoModel.from_pretrained(str(folder)).eval()(
            **{name: torch.from_numpy(value) for name, value in feeds.items()}).last_hidden_state.numpy()
    assert got.shape == expected.shape
    mask = feeds["attention_mask"].astype(bool)  # padded positions are not compared
    a, b = got[mask].ravel(), expected[mask].ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99


def test_text_data_needs_a_tokenizer(tmp_path, tiny_onnx):
    source = load_model(tiny_onnx)
    with pytest.raises(BadInputError, match="tokenizer"):
        load_samples(_texts(tmp_path / "t.txt", 0, 3), source.inputs, source.tokenizer)


def test_task_needs_a_folder_and_a_known_task(hf_folder, tiny_onnx):
    with pytest.raises(BadInputError, match="folder"):
        load_model(tiny_onnx, task="feature-extraction")
    with pytest.raises(BadInputError, match="--task"):
        load_model(hf_folder, task="translation")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_an_ir_of_a_folder_whose_onnx_export_fails_is_written_with_its_sizes_fixed(tmp_path, hf_folder, cli,
                                                                                    monkeypatch):
    """The FP32 ONNX export is what the dynamic-dimension check runs as the source; an IR-only run where torch
    cannot export it still writes the IR, at the calibrated sizes, and says why."""
    import edgeopt.pipeline

    def refuse(*args, **kwargs):
        raise BadInputError("torch cannot export the model to ONNX (planted)")

    monkeypatch.setattr(edgeopt.pipeline, "to_onnx", refuse)
    out = tmp_path / "out"
    result = cli("compress", hf_folder, "--task", "feature-extraction", "--calib", _texts(tmp_path / "c.txt", 0, 8),
                 "--input-shape", "input_ids=1,16", "--format", "openvino", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    notes = " ".join(json.loads((out / "report.json").read_text())["notes"])
    assert ("fixed in the artifacts, which run at these sizes only: input_ids[0] = 1, input_ids[1] = 16" in notes
            and "no FP32 ONNX export of the model to check other sizes against: torch cannot export" in notes)



def test_a_length_the_model_cannot_double_stays_fixed(tmp_path, hf_folder, cli):
    """The tiny BERT takes at most 64 positions: calibrated at 40, twice the length is refused by the model
    itself, so the length stays fixed, with why, though the model runs one shorter (the batch still opens)."""
    out = tmp_path / "out"
    result = cli("compress", hf_folder, "--task", "feature-extraction", "--calib", _texts(tmp_path / "c.txt", 0, 8),
                 "--input-shape", "input_ids=1,40", "--format", "onnx", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    decided = json.loads((out / "report.json").read_text())["decisions"]["dynamic_axes"]["onnx"]
    assert decided["opened"] == ["input_ids[0]", "token_type_ids[0]", "attention_mask[0]"]
    assert "input_ids[1] = 40" in decided["fixed"] and "the source does not run at input_ids=2,80" in decided["reason"]


def test_a_factory_imports_its_neighbours_and_input_shapes_name_its_inputs(tmp_path, cli):
    """As ``python factory.py`` would, a factory imports modules beside it; ``--input-shape`` must name the
    example's inputs (a typo is refused, not taken as a new name) and give sizes of at least 1."""
    (tmp_path / "net.py").write_text("import torch\nclass Net(torch.nn.Module):\n"
                                     "    def __init__(self):\n        super().__init__()\n"
                                     "        self.fc = torch.nn.Linear(16, 4)\n"
                                     "    def forward(self, x):\n        return self.fc(x)\n")
    (tmp_path / "factory.py").write_text("import torch\nfrom net import Net\n"
                                         "def build():\n    return Net(), torch.zeros(1, 16)\n")
    factory = f"{tmp_path / 'factory.py'}:build"
    assert load_model(factory).input_names == ["x"]  # forward()'s parameter
    assert load_model(factory, {"x": (8, 16)}).inputs[0].shape == (8, 16)
    assert load_model(factory, {"input": (8, 16)}).inputs[0].shape == (8, 16)  # the name edgeopt gave it before
    with pytest.raises(BadInputError, match="--input-shape names unknown input.*foo.*inputs are x"):
        load_model(factory, {"foo": (8, 16)})
    result = cli("compress", factory, "--calib", tmp_path / "c.npz", "--input-shape", "input=-1,16",
                 "--out", tmp_path / "o")
    assert result.exit_code == 2 and "every dimension must be a size of at least 1" in result.output, result.output

    rows = np.random.default_rng(0).random((32, 16), dtype=np.float32)
    np.savez(tmp_path / "c.npz", input=rows)
    np.savez(tmp_path / "e.npz", input=rows, labels=np.arange(32) % 4)
    out = tmp_path / "out"
    result = cli("compress", factory, "--calib", tmp_path / "c.npz", "--out", out, "--format", "openvino")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    # the example is one batch-1 sample: the batch is declared dynamic, and kept where the model itself runs there
    assert report["decisions"]["dynamic_axes"]["openvino"]["opened"] == ["x[0]"]
    assert report["quality"]["passed"] is None  # no --eval: nothing gated, and the report says so
    assert any(note.startswith("quality not gated: no evaluation data") for note in report["notes"])
    assert report["quality"]["in_sample_cosine"]["openvino"] > 0.99  # measured all the same, on calibration data
    result = cli("compress", factory, "--calib", tmp_path / "c.npz", "--eval", tmp_path / "e.npz",
                 "--input-shape", "input=8,16", "--out", tmp_path / "o8")
    assert result.exit_code == 2, result.output
    assert "32 labels for 4 samples (the model takes 8 rows at a time" in result.output


def test_a_factory_whose_model_holds_its_batch_keeps_it_fixed_and_says_why(tmp_path, cli):
    """``x.view(1, -1)`` traces into a Reshape to batch 1 that the export (and so the artifacts) would run at any
    batch, wrongly: the check runs the PyTorch model itself at batch 2, which refuses, so the batch stays fixed.
    A model without a batch-1 example keeps every size, and the note says so."""
    (tmp_path / "held.py").write_text(
        "import torch\nclass Held(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(32, 4)\n"
        "    def forward(self, x):\n        return self.fc(x.view(1, -1))\n"
        "def build():\n    torch.manual_seed(0)\n    return Held().eval(), torch.zeros(1, 2, 16)\n"
        "def unbatched():\n    return Held().eval(), torch.zeros(2, 16)\n")
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).random((16, 1, 2, 16), dtype=np.float32))
    out = tmp_path / "out"
    result = cli("compress", f"{tmp_path / 'held.py'}:build", "--calib", tmp_path / "c.npz", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    for fmt in ("onnx", "openvino"):
        decided = report["decisions"]["dynamic_axes"][fmt]
        assert decided["opened"] == [] and decided["fixed"] == ["x[0] = 1"], decided
        assert decided["reason"].startswith("the source does not run at x=2,2,16 (") and \
            decided["reason"].count("does not run") == 1, decided  # said once
    # an example of several samples: no input holds a batch of 1 first, so no size-1 axis is taken for one
    (tmp_path / "several.py").write_text(
        "import torch\ndef conv():\n    return torch.nn.Conv2d(1, 2, 3).eval(), torch.zeros(4, 1, 8, 8)\n"
        "def sequence():\n    return torch.nn.Linear(16, 8).eval(), torch.zeros(8, 1, 16)\n")
    for name in ("conv", "sequence"):
        assert load_model(f"{tmp_path / 'several.py'}:{name}").declared_inputs == []
    np.savez(tmp_path / "u.npz", input=np.random.default_rng(0).random((16, 2, 16), dtype=np.float32))
    result = cli("compress", f"{tmp_path / 'held.py'}:unbatched", "--calib", tmp_path / "u.npz", "--out",
                 tmp_path / "u", "--quiet", "--format", "openvino")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "u" / "report.json").read_text())
    assert "dynamic_axes" not in report["decisions"]
    assert "the artifacts run at the PyTorch example's input sizes only (x [2, 16])" in " ".join(report["notes"])


def test_a_hugging_face_folder_holding_an_onnx_export_compresses_with_its_tokenizer(tmp_path, hf_folder, cli):
    """Optimum's layout (config.json, tokenizer, model.onnx; no PyTorch weights): the ONNX file is the source, the
    folder's tokenizer turns text into its inputs at the folder's length, and its config and tokenizer go beside
    the artifacts. ``--task`` does not apply (the export's head is fixed)."""
    import shutil

    import transformers

    folder = tmp_path / "optimum-export"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (hf_folder / name).is_file():
            shutil.copyfile(hf_folder / name, folder / name)
    bert = transformers.AutoModel.from_pretrained(str(hf_folder)).eval()

    class Exported(nn.Module):  # what Optimum's export computes: the model on keyword inputs, outputs as a tuple
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    ids = torch.ones(1, 12, dtype=torch.int64)
    axes = {0: "batch_size", 1: "sequence_length"}
    torch.onnx.export(Exported().eval(), (ids, torch.ones_like(ids)), str(folder / "model.onnx"), dynamo=False,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
                      opset_version=17)
    source = load_model(folder, {"input_ids": (1, 20)})
    assert source.kind == "onnx" and source.model_type == "transformer" and source.folder == folder
    assert [(s.name, s.shape) for s in source.inputs] == [("input_ids", (1, 20)), ("attention_mask", (1, 20))]
    assert [s.shape for s in load_model(folder).inputs] == [(1, 64), (1, 64)]  # the model's maximum length
    with pytest.raises(BadInputError, match="holds an ONNX export \\(model.onnx\\), whose head is fixed"):
        load_model(folder, task="feature-extraction")
    fixed = tmp_path / "fixed-length"  # an export at a fixed length keeps it; only open dimensions are filled
    shutil.copytree(folder, fixed)
    torch.onnx.export(Exported().eval(), (ids, torch.ones_like(ids)), str(fixed / "model.onnx"), dynamo=False,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler"],
                      dynamic_axes={"input_ids": {0: "b"}, "attention_mask": {0: "b"}}, opset_version=17)
    assert [s.shape for s in load_model(fixed).inputs] == [(1, 12), (1, 12)]
    (fixed / "model.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(BadInputError, match="model.onnx: not a valid ONNX model"):
        load_model(fixed)
    out = tmp_path / "out"
    result = cli("compress", folder, "--calib", _texts(tmp_path / "c.txt", 0, 32), "--eval",
                 _texts(tmp_path / "e.txt", 1, 16), "--input-shape", "input_ids=1,20", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["quality"]["passed"] and report["quality"]["artifacts"]["onnx"]["outputs"]["pooler"]["cosine"] > 0.99
    assert {"config.json", "tokenizer.json"} <= set(report["companions"])
    assert (out / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert "model.onnx" in report["inputs"]["model"]["files"]  # the folder's files, the export among them


def test_forward_names_the_input_unless_an_output_has_that_name_and_input_answers_beside_the_real_name(
        cli, tmp_path, profiles):
    """``forward(self, output)`` returning one tensor (named ``output``): the input keeps ``input`` (the export
    would rename one of the two; it was exit 1). A profile's ``input = [...]`` (written when every factory's input
    was ``input``) merged with ``--input-shape x=...`` for the same input: the real name wins, no error."""
    (tmp_path / "f.py").write_text(
        "import torch\nclass Out(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(16, 4)\n    def forward(self, output):\n        return self.fc(output)\n"
        "class X(Out):\n    def forward(self, x):\n        return self.fc(x)\n"
        "def out():\n    return Out().eval(), torch.zeros(1, 16)\n"
        "def x():\n    return X().eval(), torch.zeros(1, 16)\n")
    assert load_model(f"{tmp_path / 'f.py'}:out").input_names == ["input"]
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(0).random((16, 16), dtype=np.float32))
    result = cli("compress", f"{tmp_path / 'f.py'}:out", "--calib", tmp_path / "c.npz", "--out", tmp_path / "o1",
                 "--format", "onnx", "--quiet")
    assert result.exit_code == 0, result.output
    profiles("old", 'extends = "generic-x86-avx2-2core"\ndescription = "a profile from before"\n\n[model]\n'
                    "input_shapes = { input = [1, 16] }\n")
    result = cli("compress", f"{tmp_path / 'f.py'}:x", "--calib", tmp_path / "c.npz", "--out", tmp_path / "o2",
                 "--format", "openvino", "--target", "old", "--input-shape", "x=1,16", "--quiet",
                 "--validate-runs", 5, "--validate-seconds", 0)
    assert result.exit_code in (0, 4), result.output  # 4: the generic profile's budgets on a busy host
    assert "unknown input" not in result.output
