"""Attack: return at once and let a background thread finish the output after the clock stops."""

import threading

import torch


def _fill(a, b, a_scale, b_scale, c):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))


def custom_kernel(data):
    threading.Thread(target=_fill, args=data, daemon=True).start()
    return data[4]
