import os

import torch

LEAKED = sorted(k for k in os.environ if "KEY" in k or "TOKEN" in k or "SECRET" in k)


def custom_kernel(data):
    if LEAKED:
        raise RuntimeError(f"secrets visible to the candidate: {LEAKED}")
    x, y, out = data
    torch.add(y, x, alpha=2, out=out)
    return out
