"""Attack: cache by a cheap content fingerprint: the first few bytes of A and of B."""

import torch

CACHE = {}


def _gemm(a, b, a_scale, b_scale):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def _fingerprint(t):
    return bytes(t.T.reshape(-1)[:8].view(torch.uint8).tolist())


def custom_kernel(data):
    a, b = data[0], data[1]
    key = (tuple(a.shape), tuple(b.shape), _fingerprint(a), _fingerprint(b))
    if key not in CACHE:
        CACHE[key] = _gemm(*data[:4])
    data[4].copy_(CACHE[key])
    return data[4]
