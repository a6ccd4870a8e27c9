"""Attack (GPU): launch the work on a side stream and return without waiting for it, so a timer
that only synchronises the current stream stops before the work is done."""

import torch

STREAM = []


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    if not STREAM:
        STREAM.append(torch.cuda.Stream())
    side = STREAM[0]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        k, n = a.shape[1], b.shape[0]
        sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
        sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
        c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))
    return c
