"""Honest control: a module-level cache of input-independent data (the index maps that expand the
block scales, per shape), reused across calls; the products are computed every time."""

import torch

INDEX = {}


def _index(n, k, device):
    key = (n, k, str(device))
    if key not in INDEX:
        INDEX[key] = (torch.arange(k, device=device) // 128, torch.arange(n, device=device) // 128)
    return INDEX[key]


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    k, n = a.shape[1], b.shape[0]
    kb, nb = _index(n, k, a.device)
    sa = a_scale[:, kb]
    sb = b_scale[nb][:, kb]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))
    return c
