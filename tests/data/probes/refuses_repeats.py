"""Probe of the harness (not an attack): raises the moment it is given inputs it has seen before
in this worker, so it passes only if every call of every round gets fresh inputs."""

import hashlib

import torch

SEEN = set()


def custom_kernel(data):
    h = hashlib.sha256()
    for t in data[:4]:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    key = h.hexdigest()
    if key in SEEN:
        raise RuntimeError("inputs repeated: this call's inputs were given to an earlier call")
    SEEN.add(key)
    a, b, a_scale, b_scale, c = data
    k, n = a.shape[1], b.shape[0]
    sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    c.copy_(((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16))
    return c
