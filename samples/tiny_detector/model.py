"""A tiny single-shot detector (about 25 K parameters) for the synthetic rectangles of ``data.py``.

Two outputs, as detectors have: ``boxes`` (1 x 16 x 4: ``x1, y1, x2, y2`` in [0, 1], one per cell of a 4x4
grid) and ``scores`` (1 x 16: objectness per cell). ``build()`` is the factory edgeopt loads
(``samples/tiny_detector/model.py:build``); weights live in ``tiny_detector.pt`` beside this file, and are
trained (``python samples/tiny_detector/train.py``, under a minute on 2 idle cores) when missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("tiny_detector.pt")
GRID = 4


class Detections(NamedTuple):
    boxes: torch.Tensor
    scores: torch.Tensor


class TinyDetector(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(*block(1, width, 1), *block(width, width, 2),  # 32 -> 16
                                      *block(width, 2 * width, 2), *block(2 * width, 2 * width, 1),  # -> 8
                                      *block(2 * width, 4 * width, 2))  # -> 4
        self.head = nn.Conv2d(4 * width, 5, 1)  # per cell: objectness, dx, dy, log w, log h
        offsets = torch.stack(torch.meshgrid(torch.arange(GRID), torch.arange(GRID), indexing="ij"), -1)
        self.register_buffer("cells", offsets.flip(-1).reshape(1, GRID * GRID, 2).float())  # (x, y) per cell

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """Per cell: objectness logit, centre offset (2), log size (2): N x 16 x 5."""
        return self.head(self.features(x)).flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> Detections:
        raw = self.raw(x)
        centre = (self.cells + torch.sigmoid(raw[..., 1:3])) / GRID
        size = torch.exp(raw[..., 3:5]) / GRID
        boxes = torch.cat([centre - size / 2, centre + size / 2], -1)
        return Detections(boxes, torch.sigmoid(raw[..., 0]))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The trained detector and a 1x1x32x32 example input; outputs ``boxes`` and ``scores``."""
    if not WEIGHTS.is_file():
        from train import train_and_save  # noqa: PLC0415 - sibling script, only needed on first use

        train_and_save()
    model = TinyDetector()
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True))
    return model.eval(), torch.zeros(1, 1, 32, 32)
