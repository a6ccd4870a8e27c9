"""Attack: cache the output under a fingerprint of every input byte. The checks' re-run changes
one element of each input, so it misses the cache and recomputes; it pays off only if a
benchmark ever hands it inputs it has seen before (issue 10: interleaved rounds used to replay
round 1's seeds, and this reported 897 us against 4229 us for the honest computation on the
H200). The fingerprint is two reductions on the inputs' device, far cheaper than the product."""

import torch

CACHE = {}


def _fingerprint(tensors):
    key = []
    for t in tensors:
        raw = t.detach().contiguous().view(-1).view(torch.uint8).to(torch.float64)
        weights = torch.arange(raw.numel(), device=raw.device, dtype=torch.float64) % 65521 + 1
        key += [tuple(t.shape), float(raw.sum()), float((raw * weights).sum())]
    return tuple(key)


def _gemm(a, b, a_scale, b_scale):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def custom_kernel(data):
    key = _fingerprint(data[:4])
    if key not in CACHE:
        CACHE[key] = _gemm(*data[:4])
    data[4].copy_(CACHE[key])
    return data[4]
