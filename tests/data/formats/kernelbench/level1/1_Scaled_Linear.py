import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A linear layer followed by a scale: y = 0.5 * (x @ W^T + b).
    """
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.linear(x)


batch_size = 16
in_features = 64
out_features = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
