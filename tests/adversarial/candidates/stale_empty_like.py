"""Attack: compute once, then return torch.empty_like(c), betting that the allocator hands back
the memory that held an earlier result (on GPU, the caching allocator usually does)."""

import torch

CALLS = [0]


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    CALLS[0] += 1
    out = torch.empty_like(c)
    if CALLS[0] == 1:
        k, n = a.shape[1], b.shape[0]
        sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
        sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
        out.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))
    return out
