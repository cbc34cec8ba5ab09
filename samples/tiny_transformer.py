"""Shared pieces of the transformer samples: a pre-norm transformer block and a cached, deterministic trainer.

Plain ``nn.Linear`` projections (Q, K, V, O, FFN) keep the converted graphs to MatMul + Softmax, which
OpenVINO, ONNX export and NNCF weight compression all handle. Weights larger than a few MB are not
committed: ``cached_weights`` trains them on first use with fixed seeds and saves them atomically.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm multi-head self-attention + feed-forward; ``causal`` masks future positions.

    The feed-forward is BERT's GELU MLP, or with ``swiglu`` LLaMA's gated SiLU MLP (down(silu(gate(x)) * up(x))).
    """

    def __init__(self, width: int, heads: int, ffn: int, causal: bool, swiglu: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, ffn), nn.Linear(ffn, width)
        self.gate = nn.Linear(width, ffn) if swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.norm1(x))
        h = self.norm2(x)
        hidden = nn.functional.silu(self.gate(h)) * self.up(h) if self.gate else nn.functional.gelu(self.up(h))
        return x + self.down(hidden)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        head = width // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, length, self.heads, head).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(head)
        if self.causal:
            mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(batch, length, width))


def cached_weights(model: nn.Module, path: Path, train: Callable[[nn.Module], None]) -> nn.Module:
    """Load ``path`` into ``model``; when missing, run ``train(model)`` (seeded) and save atomically."""
    if not path.is_file():
        torch.manual_seed(0)
        train(model)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.chmod(tmp, 0o644)
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def fit(model: nn.Module, batches: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], steps: int, lr: float = 2e-3) -> float:
    """AdamW with a linear warm-up/decay for ``steps`` steps; return the last loss."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        inputs, targets = batches(generator)
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    return float(loss.detach())
