"""Attack: return a view of an input's memory reinterpreted as the output, writing nothing."""

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    m, n = c.shape
    return b.T.view(torch.bfloat16).reshape(-1)[: m * n].view(m, n)
