"""A small CNN whose INT8 misses the gate in one place that asymmetric activations fix (the ``preset`` rung).

``conv1`` adds a large offset to every channel; ``conv2`` reads it with its bias lowered to cancel it, so in
float the offset changes nothing. Symmetric activation quantization (NNCF's PERFORMANCE preset) must cover
[0, offset + signal] for ``conv2``'s input, which rounds the signal to a few steps; asymmetric (MIXED) covers only
the signal's own range.
"""

import torch
from torch import nn

OFFSET = 1000.0


class OffsetNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3)  # no padding: every output reads the offset in full, so it cancels
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16 * 3 * 3, 10)
        with torch.no_grad():
            self.conv1.bias += OFFSET
            self.conv2.bias -= OFFSET * self.conv2.weight.sum(dim=(1, 2, 3))

    def forward(self, x):
        x = self.conv1(x)
        x = torch.relu(self.conv2(x))
        x = torch.max_pool2d(torch.relu(self.conv3(x)), 2)
        return self.head(x.flatten(1))


def build():
    return OffsetNet().eval(), torch.zeros(1, 3, 8, 8)
