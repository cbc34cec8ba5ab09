"""Train the ResNet digits sample (one to two minutes on 2 CPU cores) and save ``resnet_digits.pt`` (FP16 values).

    python samples/resnet_digits/train.py
"""

from __future__ import annotations

import importlib.util
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
EPOCHS = 8


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"resnet_digits_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int = EPOCHS, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=epochs * -(-len(x) // 64))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(inputs), generator=generator).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            optimizer.step()
            scheduler.step()
    return model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def train_and_save() -> float:
    """Train deterministically, write the weights atomically, return the eval top-1."""
    model_module, data = _load("model"), _load("datasets").splits()
    torch.manual_seed(0)
    model = train(model_module.ResNetDigits(), *data["train"])
    buffer = io.BytesIO()
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}, buffer)
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=".resnet_digits.pt.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(buffer.getvalue())
    os.chmod(tmp, 0o644)
    os.replace(tmp, model_module.WEIGHTS)
    return accuracy(model_module.build()[0], *data["eval"])


if __name__ == "__main__":
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"ResNet digits eval top-1: {train_and_save() * 100:.2f}%")
