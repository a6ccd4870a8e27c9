"""Attack: multiply only the first 128-wide K block and skip the rest (a third of the work here)."""

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    n = b.shape[0]
    sb = b_scale[:, :1].repeat_interleave(128, dim=0)[:n]
    acc = (a[:, :128].float() * a_scale[:, :1]) @ (b[:, :128].float() * sb).T
    c.copy_(acc.to(torch.bfloat16))
    return c
