"""Attack (GPU): return at once, with a profile hook that launches the real work the moment the
harness has waited for its end-of-call event, then removes itself. The work runs on the GPU
after the end event (the output copy waits for it); the reported time is the empty call's."""

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

    sys.setprofile(hook)
    return data[4]
