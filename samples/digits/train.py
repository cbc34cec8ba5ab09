"""Train the digits CNN (a few seconds on 2 CPU cores) and write its calibration, eval and training sets.

    python samples/digits/train.py

Writes ``samples/digits/digits_cnn.pt`` and ``calibration/digits/{calib,eval,train}.npz``, deterministically.
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

from data import splits  # noqa: E402
from model import WEIGHTS, DigitsCNN  # noqa: E402

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration" / "digits"


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int = 25, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(inputs), generator=generator).split(64):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
        scheduler.step()
    return model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def _atomic_bytes(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def train_and_save() -> float:
    data = splits()
    torch.manual_seed(0)
    model = train(DigitsCNN(), *data["train"])
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    _atomic_bytes(WEIGHTS, buffer.getvalue())
    for name in ("calib", "eval", "train"):
        x, y = data[name]
        buffer = io.BytesIO()
        np.savez_compressed(buffer, input=x, labels=y)
        _atomic_bytes(CALIBRATION_DIR / f"{name}.npz", buffer.getvalue())
    return accuracy(model, *data["eval"])


if __name__ == "__main__":
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"digits CNN eval top-1: {train_and_save() * 100:.2f}%")
