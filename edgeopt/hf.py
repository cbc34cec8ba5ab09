"""Local Hugging Face model folders (``config.json`` + weights, plus a tokenizer) as MODEL, and text data for them.

Loaded through ``transformers`` (the optional extra ``edgeopt[hf]``) with ``local_files_only``: nothing is
fetched from a hub. ``--task`` picks the head (default: from ``config.json``'s architecture). The inputs are
the tokenizer's (``input_ids``, ``attention_mask``, ``token_type_ids`` where forward() takes them), at batch 1
and a fixed length: ``--input-shape input_ids=1,128`` or ``DEFAULT_LENGTH`` (capped by the model's maximum).
A folder that holds an ONNX export instead of PyTorch weights (``ONNX_FILES``: Optimum's ``model.onnx``,
Transformers.js's ``onnx/model.onnx``) is that ONNX file, with the folder's tokenizer for text data and its
``config.json`` and tokenizer beside the artifacts; its head is the export's, so ``--task`` does not apply.
Text (``.txt``, one text a line; ``.jsonl`` with a ``text`` field and an optional integer ``label``) is
tokenized to that length, padded and truncated.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from edgeopt.device.runtime import TensorSpec
from edgeopt.errors import BadInputError, first_line

DEFAULT_LENGTH = 128
TASKS = {  # task -> transformers auto class
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
    "text-generation": "AutoModelForCausalLM",
}
TORCH_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
ONNX_FILES = ("model.onnx", "onnx/model.onnx")  # an export in place of the weights, as Optimum and Transformers.js
_SUFFIX_TASKS = (("ForSequenceClassification", "text-classification"), ("ForTokenClassification", "token-classification"),
                 ("ForMaskedLM", "fill-mask"), ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"))


def load_hf_folder(path: Path, task: str | None, input_shapes: dict, make_source, load_onnx):
    """A ``SourceModel`` for the model in ``path``, with its tokenizer; ``input_shapes`` may set the length.
    ``make_source(path, module, example, shapes, ...)`` makes it from the PyTorch model, ``load_onnx(file,
    shapes)`` from the folder's ONNX export where it holds no PyTorch weights."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise BadInputError(f"{path}: unknown model format (a folder is read as a Hugging Face model folder, which "
                            f"needs config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    try:
        import transformers
    except ImportError:
        raise BadInputError(f"{path}: loading a Hugging Face model folder needs transformers "
                            f"(pip install 'edgeopt[hf]')") from None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{config_file}: not valid JSON ({first_line(exc)})") from exc
    exported = _onnx_export(path)
    if exported is not None and task is not None:
        raise BadInputError(f"--task applies to a folder of PyTorch weights; {path} holds an ONNX export "
                            f"({exported.relative_to(path)}), whose head is fixed")
    task = task or _task_from(config)
    if task not in TASKS:
        raise BadInputError(f"--task {task}: expected one of {', '.join(TASKS)}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a folder without a tokenizer
        raise BadInputError(f"{path}: no usable tokenizer in the folder ({first_line(exc)})") from exc
    if exported is not None:
        return _onnx_source(path, exported, config, tokenizer, input_shapes, load_onnx)
    try:
        model = getattr(transformers, TASKS[task]).from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise BadInputError(f"{path}: transformers cannot load the model for task {task} ({first_line(exc)})") from exc
    model.eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # a key-value cache is a nested output edgeopt does not carry
    length = _length(path, tokenizer, model, input_shapes)
    example = _example(tokenizer, model, length)
    shapes = {name: shape for name, shape in input_shapes.items() if name not in example}
    source = make_source(path, model, example, shapes, tokenizer=tokenizer, model_type="transformer")
    source.declared_inputs = [TensorSpec(spec.name, (None, None), spec.dtype, spec.batch_axis)  # batch, length
                              if spec.name in example and len(spec.shape) == 2 else spec for spec in source.inputs]
    source.folder = path
    return source


def _onnx_export(path: Path) -> Path | None:
    """The ONNX export ``path`` holds in place of PyTorch weights, if it does."""
    if any((path / name).is_file() for name in TORCH_WEIGHTS):
        return None
    return next((path / name for name in ONNX_FILES if (path / name).is_file()), None)


def _onnx_source(path: Path, exported: Path, config: dict, tokenizer, input_shapes: dict, load_onnx):
    """The folder's ONNX export as the source: its token inputs at batch 1 and the folder's length (as for
    PyTorch weights) unless ``input_shapes`` gives them."""
    import onnx

    try:
        graph = onnx.load(str(exported), load_external_data=False).graph
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BadInputError(f"{exported}: not a valid ONNX model ({first_line(exc)})") from exc
    weights = {init.name for init in graph.initializer}
    dims = {value.name: [d.dim_value if d.dim_value > 0 else None for d in value.type.tensor_type.shape.dim]
            for value in graph.input if value.name not in weights}
    given = next((input_shapes[name] for name in tokenizer.model_input_names if name in input_shapes), None)
    length = given[1] if given is not None and len(given) == 2 else min(
        DEFAULT_LENGTH, config.get("max_position_embeddings") or DEFAULT_LENGTH)
    shapes = {name: (dims[name][0] or 1, dims[name][1] or length) for name in tokenizer.model_input_names
              if len(dims.get(name, ())) == 2 and None in dims[name]}  # only the dimensions the export leaves open
    source = load_onnx(exported, {**shapes, **input_shapes})
    source.tokenizer, source.model_type, source.folder = tokenizer, "transformer", path
    return source


def save_companions(folder: Path, out: Path) -> list[str]:
    """What a Hugging Face model folder's artifacts need beside them, written into ``out`` so that it loads as
    the folder does (``AutoTokenizer.from_pretrained(out)``): ``config.json`` and the tokenizer's files, each copied
    byte for byte from the folder (the loaded tokenizer carries the calibration's padding and truncation: it is
    not what is saved), a file the folder lacks as a freshly loaded tokenizer saves it. The names written, sorted."""
    import tempfile

    import transformers

    with tempfile.TemporaryDirectory(prefix="edgeopt-tokenizer-") as tmp:
        fresh = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        fresh.save_pretrained(tmp)
        names = sorted({"config.json", *os.listdir(tmp)})
        for name in names:
            shutil.copyfile(folder / name if (folder / name).is_file() else Path(tmp) / name, out / name)
    return names


def _task_from(config: dict) -> str:
    for architecture in config.get("architectures") or []:
        for suffix, task in _SUFFIX_TASKS:
            if architecture.endswith(suffix):
                return task
    return "feature-extraction"


def _length(path: Path, tokenizer, model, input_shapes: dict) -> int:
    for name in tokenizer.model_input_names:
        if name in input_shapes:
            shape = input_shapes[name]
            if len(shape) != 2 or shape[0] != 1:
                raise BadInputError(f"{path}: --input-shape {name} must be 1,LENGTH (batch 1), got {shape}")
            return shape[1]
    limit = getattr(model.config, "max_position_embeddings", None) or DEFAULT_LENGTH
    return min(DEFAULT_LENGTH, limit)


def _example(tokenizer, model, length: int) -> dict:
    """Tokenizer inputs that forward() takes, for one padded text of ``length`` tokens."""
    import inspect

    import torch

    accepted = inspect.signature(model.forward).parameters
    encoded = _encode(tokenizer, ["edgeopt"], length)
    return {name: torch.from_numpy(encoded[name]) for name in tokenizer.model_input_names
            if name in accepted and name in encoded}


def _encode(tokenizer, texts: list[str], length: int) -> dict[str, np.ndarray]:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=length, return_tensors="np")
    return {name: np.asarray(value, dtype=np.int64) for name, value in encoded.items()}


def read_texts(path: Path) -> tuple[list[str], list[int] | None]:
    """Texts (and labels, when every ``.jsonl`` record has one) from ``path``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{path}: not UTF-8 text ({first_line(exc)})") from exc
    if path.suffix.lower() == ".txt":
        return [line for line in lines if line.strip()], None
    texts, labels = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{path}:{number}: not valid JSON ({first_line(exc)})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise BadInputError(f"{path}:{number}: each line must be an object with a \"text\" string")
        texts.append(record["text"])
        label = record.get("label")
        labels.append(label if isinstance(label, int) and not isinstance(label, bool) else None)
    has_labels = bool(labels) and all(label is not None for label in labels)
    return texts, (labels if has_labels else None)


def text_samples(path: Path, tokenizer, inputs: list[TensorSpec]):
    """Samples (dicts by input name) and labels for the texts in ``path``, tokenized to the inputs' length."""
    texts, labels = read_texts(path)
    if not texts:
        return [], None
    length = inputs[0].shape[-1]
    encoded = _encode(tokenizer, texts, length)
    missing = [spec.name for spec in inputs if spec.name not in encoded]
    if missing:
        raise BadInputError(f"{path}: the tokenizer gives no {', '.join(missing)} for this model's inputs")
    return [{spec.name: encoded[spec.name][i:i + 1] for spec in inputs} for i in range(len(texts))], labels
