"""Sparse, visible changes to a case's inputs, for the re-run that exposes cached results.

The pytest process picks one element of every floating-point input (never the output) and a new
value for it: the opposite sign and a larger magnitude, within the dtype's range. The worker
writes the same changes into the very tensors the kernel has just seen (same objects, addresses
and version counters), so a kernel that caches results by address, ``id()``, ``_version``,
shape or a few sampled elements returns its previous result and fails. Runs in both processes.
"""

from __future__ import annotations

import random
from typing import Any

from pytest_kscientist.formats.forms import leaves

Change = list[Any]  # [leaf index (forms.leaves), element index (list of ints), new value]


def choose(data: Any, output_index: int | None, rng: random.Random) -> list[Change]:
    """One change per floating-point input tensor of ``data``."""
    import torch

    changes: list[Change] = []
    for i, t in enumerate(leaves(data)):
        if i == output_index or not isinstance(t, torch.Tensor):
            continue
        if not t.is_floating_point() or t.numel() == 0:
            continue
        index = [rng.randrange(size) for size in t.shape]
        old = float(t[tuple(index)].float())
        new = 4.0 * abs(old) + 1.0
        new = -new if old >= 0 else new
        limit = float(torch.finfo(t.dtype).max)
        changes.append([i, index, max(-limit, min(limit, new))])
    return changes


def apply(data: Any, changes: list[Change]) -> None:
    """Write ``changes`` into the tensors of ``data`` in place."""
    import torch

    parts = leaves(data)
    with torch.no_grad():
        for i, index, value in changes:
            t = parts[i]
            t[tuple(index)] = torch.tensor(float(value), device=t.device).to(t.dtype)
