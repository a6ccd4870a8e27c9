"""Attack: read the benchmark's future seeds from the harness's frames during warm-up and
precompute every timed output off the clock; timed calls then only copy.

Against a harness that sends all per-call seeds in one request this passes with tiny times.
"""

import sys

import torch

TABLE: dict[bytes, torch.Tensor] = {}
BLOCK = 128


def _honest(data):
    a, b, a_scale, b_scale, c = data
    m, k = a.shape
    n = b.shape[0]
    sa = a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    return ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)


def _key(data) -> bytes:
    a, b = data[0], data[1]
    head = a.T[0, :16].view(torch.uint8).tolist() + b.T[0, :16].view(torch.uint8).tolist()
    return bytes(head)


def _harness_frames():
    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _precompute() -> str:
    """Find a list of seeds, the case and the input generator in the callers' locals."""
    seeds, case, generate, op = None, None, None, None
    for frame in _harness_frames():
        local = frame.f_locals
        req = local.get("req")
        if isinstance(req, dict):
            op = op or req.get("op")
            seeds = seeds or (req.get("seeds") or []) + (req.get("warmup_seeds") or []) or None
            case = case or req.get("case")
        owner = local.get("self")
        if generate is None and callable(getattr(owner, "generate", None)):
            generate = owner.generate
    if seeds and case and generate and not TABLE:
        for seed in seeds:
            data = generate(**dict(case, seed=seed), device="cpu")
            TABLE[_key(data)] = _honest(data)
    return op or ""


def custom_kernel(data):
    op = _precompute()
    hit = TABLE.get(_key(data))
    if hit is not None:
        data[4].copy_(hit)
        return data[4]
    if op in ("check", "recheck"):
        return _honest(data)
    raise LookupError("no precomputed output: the future seeds were not visible")
