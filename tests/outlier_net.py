"""A small CNN with a planted outlier channel, so plain INT8 loses accuracy and one layer is to blame.

``conv1`` writes one channel 300x larger than the others; ``conv2`` reads it with that channel's weights scaled
down by the same factor, so in float the channel weighs no more than the others. INT8's per-tensor activation
quantizer on ``conv2``'s input must cover the outlier's range, which rounds every other channel to a few steps:
keeping ``conv2`` in float recovers the output, keeping any other operation in float does not.
"""

import torch
from torch import nn

OUTLIER = 300.0


class OutlierNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 10)
        with torch.no_grad():
            self.conv1.weight[0] *= OUTLIER
            self.conv1.bias[0] = OUTLIER
            self.conv2.weight[:, 0] /= OUTLIER

    def forward(self, x):
        x = self.conv1(x)  # no ReLU: the outlier channel and the others share one signed range
        x = torch.relu(self.conv2(x))
        x = torch.max_pool2d(torch.relu(self.conv3(x)), 2)
        return self.head(x.flatten(1))


def build():
    return OutlierNet().eval(), torch.zeros(1, 3, 8, 8)
