"""Synthetic detection data for the tiny detector: 32x32 grey images with 1-3 bright rectangles on noise.

Each hook returns ``(image 1x1x32x32, boxes)`` pairs, ``boxes`` an ``n x 4`` array of ``x1, y1, x2, y2`` in
[0, 1] (a different count per image: the kind of target only a task metric reads). Deterministic; nothing
is downloaded.

    edgeopt compress samples/tiny_detector/model.py:build --calib samples/tiny_detector/data.py:calib \\
        --eval samples/tiny_detector/data.py:eval --metric samples/tiny_detector/metrics.py:f1 ...
"""

from __future__ import annotations

import numpy as np

SIZE = 32
GRID = 4  # the detector predicts one box per cell of a 4x4 grid
CELL = SIZE // GRID


def make(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` images, each with 1-3 rectangles whose centres fall in different grid cells."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        image = rng.normal(0.0, 0.15, (SIZE, SIZE)).astype(np.float32)
        boxes, cells = [], set()
        for _ in range(int(rng.integers(1, 4))):
            for _attempt in range(20):
                w, h = rng.integers(5, 13, size=2)
                x1, y1 = rng.integers(0, SIZE - w + 1), rng.integers(0, SIZE - h + 1)
                cell = (int((y1 + h / 2) // CELL), int((x1 + w / 2) // CELL))
                if cell not in cells:
                    break
            else:
                continue
            cells.add(cell)
            image[y1:y1 + h, x1:x1 + w] += rng.uniform(0.6, 1.0)
            boxes.append([x1 / SIZE, y1 / SIZE, (x1 + w) / SIZE, (y1 + h) / SIZE])
        pairs.append((image[None, None], np.asarray(boxes, np.float32).reshape(-1, 4)))
    return pairs


def calib() -> list[tuple[np.ndarray, np.ndarray]]:
    """100 images for calibration."""
    return make(100, seed=1)


def eval() -> list[tuple[np.ndarray, np.ndarray]]:  # noqa: A001 - the name the CLI examples use
    """200 held-out images."""
    return make(200, seed=2)


def train() -> list[tuple[np.ndarray, np.ndarray]]:
    """1,500 images for training."""
    return make(1500, seed=0)
