"""Attack: compute the right answer, then zero an input in place (e.g. to leave a cheaper state
behind for the next call, or to spoil a reference computed afterwards from the same tensors)."""

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))
    a.view(torch.uint8).zero_()
    return c
