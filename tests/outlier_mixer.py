"""A small token mixer with a planted outlier channel ahead of a linear layer: plain INT8 misses the gate, and the
repair's ``model_type`` rung (transformer: SmoothQuant moves the outlier into the weights) passes it before any
operation is kept in float.

``fc1`` writes one channel 1000x larger than the others and ``fc2`` reads it with that channel's weights scaled
down by the same factor (as tests/outlier_net.py); the activation-by-activation MatMul that mixes the tokens, with
no Softmax, is not recognised as attention, so the plain ``int8`` step quantizes it as a default model.
"""

import torch
from torch import nn

OUTLIER = 1000.0


class OutlierMixer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 8)
        with torch.no_grad():
            self.fc1.weight[0] *= OUTLIER
            self.fc1.bias[0] = OUTLIER
            self.fc2.weight[:, 0] /= OUTLIER

    def forward(self, x):
        h = torch.relu(self.fc2(self.fc1(x)))
        mixed = h @ h.transpose(1, 2) / h.shape[-1]  # tokens x tokens, activations only
        return self.fc3(mixed @ h)


def build():
    return OutlierMixer().eval(), torch.zeros(1, 8, 16)
