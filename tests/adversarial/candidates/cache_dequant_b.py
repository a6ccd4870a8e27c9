"""Attack: keep dequantised B (b * b_scale, transposed) across calls, keyed by its shape only:
cheap on every later call, and wrong as soon as B or its scales change."""

import torch

B_DEQ = {}


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    k, n = a.shape[1], b.shape[0]
    if (n, k) not in B_DEQ:
        sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
        B_DEQ[(n, k)] = (b.float() * sb).T.contiguous()
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ B_DEQ[(n, k)]).to(torch.bfloat16))
    return c
