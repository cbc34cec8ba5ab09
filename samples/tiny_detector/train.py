"""Train the tiny detector on the synthetic rectangles of ``data.py`` and write ``tiny_detector.pt``.

    python samples/tiny_detector/train.py

Each true box is assigned to the grid cell holding its centre: objectness is trained with binary cross-entropy
on every cell, the centre offset and log size with an L1 loss on the assigned cells. Deterministic.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

from data import GRID, train as train_pairs  # noqa: E402
from model import WEIGHTS, TinyDetector  # noqa: E402


def encode(boxes: np.ndarray) -> np.ndarray:
    """Per cell: objectness, centre offset in the cell (2), log size in cells (2) — 16 x 5."""
    target = np.zeros((GRID * GRID, 5), np.float32)
    for x1, y1, x2, y2 in boxes:
        cx, cy, w, h = (x1 + x2) / 2 * GRID, (y1 + y2) / 2 * GRID, (x2 - x1) * GRID, (y2 - y1) * GRID
        col, row = min(int(cx), GRID - 1), min(int(cy), GRID - 1)
        target[row * GRID + col] = [1.0, cx - col, cy - row, np.log(w), np.log(h)]
    return target


def train(epochs: int = 12, seed: int = 0) -> TinyDetector:
    torch.manual_seed(seed)
    pairs = train_pairs()
    images = torch.from_numpy(np.concatenate([image for image, _ in pairs]))
    targets = torch.from_numpy(np.stack([encode(boxes) for _, boxes in pairs]))
    model = TinyDetector()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(images), generator=generator).split(64):
            raw, target = model.raw(images[batch]), targets[batch]
            positive = target[..., 0] > 0
            loss = nn.functional.binary_cross_entropy_with_logits(raw[..., 0], target[..., 0])
            offsets = torch.sigmoid(raw[..., 1:3])
            loss = loss + nn.functional.l1_loss(offsets[positive], target[..., 1:3][positive]) \
                + nn.functional.l1_loss(raw[..., 3:5][positive], target[..., 3:5][positive])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    return model.eval()


def train_and_save() -> None:
    model = train()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    handle, tmp = tempfile.mkstemp(dir=WEIGHTS.parent, prefix=".tiny_detector-")
    with os.fdopen(handle, "wb") as out:
        out.write(buffer.getvalue())
    os.replace(tmp, WEIGHTS)


if __name__ == "__main__":
    train_and_save()
    from data import eval as eval_pairs
    from metrics import f1

    model, _ = __import__("model").build()
    outputs = []
    with torch.no_grad():
        for image, _ in eval_pairs():
            boxes, scores = model(torch.from_numpy(image))
            outputs.append({"boxes": boxes.numpy()[0], "scores": scores.numpy()[0]})
    print(f1(outputs, [boxes for _, boxes in eval_pairs()]))
