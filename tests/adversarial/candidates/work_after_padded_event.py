"""Attack (GPU): like work_after_event, but it first keeps the GPU busy for about 1 ms inside the
timed region, so the reported time clears the physical floor; the real work (an fp32 product of
~10 ms for the largest shape) still runs after the end event. Only the outside measurement of
the call's round trip can see it."""

import sys

import torch


def _work(a, b, a_scale, b_scale, c):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))


def custom_kernel(data):
    def hook(frame, event, arg):
        if (event == "c_return" and frame.f_code.co_name == "time_call"
                and getattr(arg, "__name__", "") == "synchronize"
                and "Event" in getattr(arg, "__qualname__", "")):
            sys.setprofile(None)
            _work(*data)

    torch.cuda._sleep(2_000_000)  # GPU cycles: about 1 ms at the H200's boost clock
    sys.setprofile(hook)
    return data[4]
