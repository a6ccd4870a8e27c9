"""Attack: return at once and let a background thread finish the output after the clock stops.

The thread starts writing only once custom_kernel is returning (``go`` is set just before the
return): a thread that finished before the return would have done its work inside the call."""

import threading

import torch


def _fill(go, a, b, a_scale, b_scale, c):
    go.wait()
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))


def custom_kernel(data):
    go = threading.Event()
    threading.Thread(target=_fill, args=(go, *data), daemon=True).start()
    go.set()
    return data[4]
