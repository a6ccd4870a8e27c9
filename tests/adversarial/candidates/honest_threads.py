"""Honest control: splits the rows over two threads and joins them before returning."""

import threading

import torch


def _rows(a, b, a_scale, b_scale, c, r0, r1):
    k, n = a.shape[1], b.shape[0]
    sa = a_scale[r0:r1].repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c[r0:r1] = ((a[r0:r1].float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    half = a.shape[0] // 2
    threads = [threading.Thread(target=_rows, args=(*data, r0, r1))
               for r0, r1 in ((0, half), (half, a.shape[0]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return c
