"""Attack: be correct for the first calls (the ones a lazy harness checks), then return the
first result again."""

import torch

CALLS = [0]
FIRST = []


def _gemm(a, b, a_scale, b_scale):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def custom_kernel(data):
    CALLS[0] += 1
    if CALLS[0] <= 3:
        FIRST[:] = [_gemm(*data[:4])]
    data[4].copy_(FIRST[0])
    return data[4]
