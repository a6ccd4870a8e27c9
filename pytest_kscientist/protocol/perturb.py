"""New inputs in the same tensors, for the re-run that exposes cached results.

The re-run writes the case drawn again with another seed into the very tensors the kernel has
just seen (``refill``: same objects, addresses and version counters), so a kernel that caches
results by address, ``id()``, ``_version``, shape or a few sampled elements returns its previous
result and fails. A drawn case keeps the task's input domain (cholesky's symmetric positive
definite matrices, sorted boundaries: one changed element made right kernels, and the
reference itself, fail) and changes integer inputs too. Sparse changes instead (a task's
``[check] rerun = "changed"``, and where the draw changes no input): one element of every
floating-point input (never the output) gets the opposite sign and a larger magnitude, within
the dtype's range (``choose``, ``apply``), which also stales a cache keyed by a few sampled
elements. Runs in both processes.
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


def same_layout(data: Any, fresh: Any) -> bool:
    """Whether ``fresh`` has a tensor of the same shape and dtype wherever ``data`` has one, and
    equal values elsewhere (two draws of one case with different seeds, as refill needs)."""
    import torch

    old, new = leaves(data), leaves(fresh)
    if len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
        elif type(a) in (int, float, bool, str, type(None)) and a != b:
            return False
    return True


def changed_input(data: Any, fresh: Any, output_index: int | None) -> int | None:
    """The index of the first input tensor (not the output's) whose values differ between
    ``data`` and ``fresh`` (NaN equal to NaN), None when none does: a draw with another seed that
    changes nothing exposes no cached result, and a reference that changes its inputs shows."""
    import torch

    for i, (a, b) in enumerate(zip(leaves(data), leaves(fresh), strict=False)):
        if i == output_index or not isinstance(a, torch.Tensor) or not isinstance(
                b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            continue
        same = a.eq(b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a.eq(b)
        if not bool(same.all()):
            return i
    return None


def refill(data: Any, fresh: Any) -> None:
    """Copy every tensor of ``fresh`` into the tensor at the same position of ``data``, in place
    (``same_layout`` was checked by the pytest process). Both processes refill their own first
    draw, so a leaf that is not a tensor (an object holding tensors) stays alike on both sides."""
    import torch

    with torch.no_grad():
        for t, new in zip(leaves(data), leaves(fresh), strict=True):
            if isinstance(t, torch.Tensor):
                t.copy_(new.to(t.device))
