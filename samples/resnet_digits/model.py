"""A small ResNet-style CNN for scikit-learn's digits upscaled to 32x32: wide enough to be compute-bound on a CPU.

``build()`` is the factory edgeopt loads (``samples/resnet_digits/model.py:build``). Weights live in
``resnet_digits.pt`` beside this file, stored as FP16 to keep the repository small (the network runs in FP32 on
those values); when missing they are trained (``python samples/resnet_digits/train.py``, one to two minutes on
2 CPU cores). Data: ``samples/resnet_digits/datasets.py:calib`` / ``:eval`` / ``:train``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("resnet_digits.pt")
SIZE = 32


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNetDigits(nn.Module):
    """Stem, three stages (32x32 -> 16x16 -> 8x8, width w -> 2w -> 4w), global average pool, linear head."""

    def __init__(self, width: int = 56, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The trained network and a 1x1x32x32 example input."""
    if not WEIGHTS.is_file():
        _sibling("train").train_and_save()
    model = ResNetDigits()
    state = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval(), torch.zeros(1, 1, SIZE, SIZE)


def _sibling(name: str):
    """Import a module beside this file under a unique name (``train``/``data`` clash with other samples)."""
    spec = importlib.util.spec_from_file_location(f"resnet_digits_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
