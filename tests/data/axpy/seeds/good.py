import torch


def custom_kernel(data):
    x, y, out = data
    torch.add(y, x, alpha=2, out=out)
    return out
