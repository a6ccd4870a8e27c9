"""Attack: compute only the first 128 columns of the output (the first block of B)."""

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    k = a.shape[1]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale[:1].repeat_interleave(128, dim=1)[:, :k]
    c[:, :128] = ((a.float() * sa) @ (b[:128].float() * sb).T).to(torch.bfloat16)
    return c
