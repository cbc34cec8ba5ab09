"""Data hooks for the ResNet digits sample: the digits splits of ``samples/digits/data.py`` upscaled to 32x32.

    edgeopt compress samples/resnet_digits/model.py:build --calib samples/resnet_digits/datasets.py:calib \
        --eval samples/resnet_digits/datasets.py:eval --train samples/resnet_digits/datasets.py:train ...

Each hook returns ``(image 1x1x32x32, label)`` pairs; nothing is downloaded (scikit-learn ships the digits).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

SIZE = 32
_DIGITS_DATA = Path(__file__).resolve().parents[1] / "digits" / "data.py"


@functools.cache
def splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    spec = importlib.util.spec_from_file_location("resnet_digits_source_data", _DIGITS_DATA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.splits(size=SIZE)


def _pairs(name: str) -> list[tuple[np.ndarray, int]]:
    x, y = splits()[name]
    return [(x[i:i + 1], int(y[i])) for i in range(len(y))]


def calib() -> list[tuple[np.ndarray, int]]:
    """300 samples drawn from the training split."""
    return _pairs("calib")


def eval() -> list[tuple[np.ndarray, int]]:  # noqa: A001 - the name the CLI examples use
    """600 held-out samples."""
    return _pairs("eval")


def train() -> list[tuple[np.ndarray, int]]:
    """The 1,197-sample training split."""
    return _pairs("train")
