"""Attack: cache results by the inputs' data_ptr(); a new input at a reused address gets the old
result (the CUDA caching allocator reuses addresses all the time)."""

import torch

CACHE = {}


def _gemm(a, b, a_scale, b_scale):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def custom_kernel(data):
    key = tuple(t.data_ptr() for t in data[:4])
    if key not in CACHE:
        CACHE[key] = _gemm(*data[:4])
    data[4].copy_(CACHE[key])
    return data[4]
