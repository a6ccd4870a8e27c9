"""Attack: compute one row and broadcast it (stride 0) over the whole output."""

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    k, n = a.shape[1], b.shape[0]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    row = (a[:1].float() * a_scale[:1].repeat_interleave(128, dim=1)[:, :k]) @ (b.float() * sb).T
    return row.to(torch.bfloat16).expand(c.shape)
