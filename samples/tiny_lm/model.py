"""A tiny LLaMA-style character-level causal LM (2 pre-norm blocks, width 256, SwiGLU MLP), trained locally.

``build()`` is the factory edgeopt loads (``samples/tiny_lm/model.py:build``): it returns the LM, which maps
64 int64 character ids (ASCII) to next-character logits (1 x 64 x 128), and an example input. The text is the
source of Python's own ``textwrap`` module (ships with every Python; no downloads): the first 90 % trains,
the last 10 % is held out. Weights (~7 MB) are trained on first use (fixed seeds) into ``tiny_lm.pt``
beside this file. ``python model.py`` also writes ``calibration/tiny_lm/{calib,eval}.npz`` (windows of the
training and the held-out text).
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_transformer import Block, cached_weights, fit  # noqa: E402

WEIGHTS = Path(__file__).with_name("tiny_lm.pt")
VOCAB, LENGTH, WIDTH = 128, 64, 256


class TinyLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, length: int = LENGTH, width: int = WIDTH, layers: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.zeros(1, length, width))
        self.blocks = nn.Sequential(*(Block(width, heads=4, ffn=2 * width, causal=True, swiglu=True)
                                      for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions)))


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """(training ids, held-out ids) of the ``textwrap`` source, one int64 id per ASCII character."""
    text = inspect.getsource(textwrap)
    ids = torch.tensor([min(ord(c), VOCAB - 1) for c in text], dtype=torch.int64)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:]


def windows(ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Windows of LENGTH + 1 ids (input and the next-character targets) at ``starts``."""
    return torch.stack([ids[s:s + LENGTH + 1] for s in starts.tolist()])


def _train(lm: TinyLM) -> None:
    train_ids, _ = corpus()

    def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = windows(train_ids, torch.randint(0, len(train_ids) - LENGTH - 1, (16,), generator=generator))
        return chunk[:, :-1], chunk[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    fit(lm, batch, loss, steps=120, lr=3e-3)


def build() -> tuple[nn.Module, torch.Tensor]:
    """The trained LM and a 1x64 int64 example input."""
    return cached_weights(TinyLM(), WEIGHTS, _train), torch.zeros(1, LENGTH, dtype=torch.int64)


def write_calibration(folder: Path) -> None:
    """64 calibration windows from the training text, 64 windows of the held-out text."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    train_ids, held_out = corpus()
    starts = torch.randint(0, len(train_ids) - LENGTH, (64,), generator=torch.Generator().manual_seed(1))
    calib = windows(train_ids, starts)
    held = windows(held_out, torch.arange(0, len(held_out) - LENGTH - 1, (len(held_out) - LENGTH - 1) // 64)[:64])
    np.savez(folder / "calib.npz", input=calib[:, :LENGTH].numpy())
    np.savez(folder / "eval.npz", input=held[:, :LENGTH].numpy())


if __name__ == "__main__":
    build()
    write_calibration(Path(__file__).resolve().parents[2] / "calibration" / "tiny_lm")
