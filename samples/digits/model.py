"""A small CNN for scikit-learn's 8x8 digits, trained locally in seconds on the CPU.

``build()`` is the factory edgeopt loads (``samples/digits/model.py:build``): it returns the trained module
and an example input. Weights live in ``digits_cnn.pt`` beside this file; when missing they are trained
(``python samples/digits/train.py`` does the same and also writes the calibration/eval sets).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("digits_cnn.pt")


class DigitsCNN(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(1, width),
            *block(width, 2 * width), nn.MaxPool2d(2),  # 8x8 -> 4x4
            *block(2 * width, 4 * width), nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(4 * width * 4, 256), nn.ReLU(),
                                        nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The trained digits CNN and a 1x1x8x8 example input."""
    if not WEIGHTS.is_file():
        from train import train_and_save  # noqa: PLC0415 - sibling script, only needed on first use

        train_and_save()
    model = DigitsCNN()
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True))
    return model.eval(), torch.zeros(1, 1, 8, 8)
