"""A small BERT-like text encoder (2 pre-norm blocks, width 256), trained in seconds on a synthetic task.

``build()`` is the factory edgeopt loads (``samples/text_encoder/model.py:build``): it returns the encoder,
which maps 32 int64 token ids to a 256-d sentence embedding (layer-normed mean pool), and an example input.
Task: each of 8 topics owns 32 of the 512 tokens; a sentence mixes 40 % topic tokens with uniform noise, and
a linear head (used only in training) names the topic from the embedding. Weights (~7 MB) are trained on
first use (fixed seeds) into ``text_encoder.pt`` beside this file. ``python model.py`` also writes
``calibration/text_encoder/{calib,eval}.npz`` (token ids, no labels: quality is embedding fidelity).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_transformer import Block, cached_weights, fit  # noqa: E402

WEIGHTS = Path(__file__).with_name("text_encoder.pt")
VOCAB, LENGTH, WIDTH, TOPICS = 512, 32, 256, 8


class TextEncoder(nn.Module):
    def __init__(self, vocab: int = VOCAB, length: int = LENGTH, width: int = WIDTH, layers: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.zeros(1, length, width))
        self.blocks = nn.Sequential(*(Block(width, heads=4, ffn=4 * width, causal=False) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.tokens(ids) + self.positions)
        return self.norm(hidden.mean(dim=1))


def sentences(generator: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` synthetic sentences (int64 ids, count x LENGTH) and their topic labels."""
    topics = torch.randint(0, TOPICS, (count,), generator=generator)
    noise = torch.randint(0, VOCAB, (count, LENGTH), generator=generator)
    own = topics[:, None] * (VOCAB // TOPICS // 2) + torch.randint(0, 32, (count, LENGTH), generator=generator)
    pick = torch.rand(count, LENGTH, generator=generator) < 0.4
    return torch.where(pick, own, noise), topics


def _train(encoder: TextEncoder) -> None:
    classifier = nn.Sequential(encoder, nn.Linear(WIDTH, TOPICS))
    fit(classifier, lambda g: sentences(g, 32), nn.functional.cross_entropy, steps=60)


def build() -> tuple[nn.Module, torch.Tensor]:
    """The trained encoder and a 1x32 int64 example input."""
    return cached_weights(TextEncoder(), WEIGHTS, _train), torch.zeros(1, LENGTH, dtype=torch.int64)


def write_calibration(folder: Path) -> None:
    """128 calibration and 128 held-out evaluation sentences (different seeds)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for name, seed in (("calib", 1), ("eval", 2)):
        ids, _ = sentences(torch.Generator().manual_seed(seed), 128)
        np.savez(folder / f"{name}.npz", input=ids.numpy())


if __name__ == "__main__":
    build()
    write_calibration(Path(__file__).resolve().parents[2] / "calibration" / "text_encoder")
