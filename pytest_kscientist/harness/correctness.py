"""Element-wise comparison of a candidate's output with the reference (pytest process only)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mismatch:
    """How an output differs from the reference.

    ``structural`` is False only when the shape, the dtype and every NaN/Inf position match and
    some finite elements lie outside the tolerance: ``count`` of ``numel`` of them.
    """

    message: str
    structural: bool = True
    count: int = 0
    numel: int = 0

    @property
    def share(self) -> float:
        return self.count / self.numel if self.numel else 1.0


# Elements judged at a time: float64 copies of a chunk stay in cache on a CPU (25M fp32 elements:
# 3.07 s whole, 0.17 s in chunks of 64Ki, one thread, notes/timing.md) and an output of any size
# needs a bounded extra on a GPU (whole, 1.6G elements took 13 GB per float64 copy).
CPU_CHUNK = 1 << 16
DEVICE_CHUNK = 1 << 24


def judge(out: Any, ref: Any, atol: float, rtol: float, show: int = 5) -> Mismatch | None:
    """None when every element satisfies |out-ref| <= atol + rtol*|ref| and NaN/Inf positions
    match; otherwise what differs, with the mismatch count and the first mismatches."""
    if tuple(out.shape) != tuple(ref.shape):
        return Mismatch(f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Mismatch(f"output dtype {out.dtype}, expected {ref.dtype}")
    flat_o, flat_r = out.reshape(-1), ref.reshape(-1)
    step = CPU_CHUNK if flat_o.device.type == "cpu" else DEVICE_CHUNK
    quick = math.isfinite(atol) and math.isfinite(rtol)
    count = unwritten = 0
    special = True
    firsts: list[str] = []
    for start in range(0, flat_o.numel(), step):
        o, r = flat_o[start:start + step].double(), flat_r[start:start + step].double()
        if quick and bool(((o - r).abs() <= atol + rtol * r.abs()).all()) and bool(
                r.isfinite().all()):
            continue  # every element finite and close: what the full test below would find
        found = _chunk(o, r, atol, rtol, show)
        count += found[0]
        unwritten += found[1]
        special &= found[2]
        for i in found[3][:show - len(firsts)]:
            at = _position(start + i, tuple(out.shape))
            firsts.append(f"{at}: got {o[i].item():.6g}, expected {r[i].item():.6g}")
    if count == 0:
        return None
    numel = flat_o.numel()
    message = f"{count} of {numel} elements outside |out-ref| <= {atol:g} + {rtol:g}*|ref|"
    if unwritten:
        message += f" ({unwritten} are NaN where the reference is not: unwritten output?)"
    return Mismatch(f"{message}; first: {'; '.join(firsts)}", not special, count, numel)


def _chunk(o: Any, r: Any, atol: float, rtol: float,
           show: int) -> tuple[int, int, bool, list[int]]:
    """(mismatches, NaN where the reference is not, NaN/Inf positions all alike, the first
    few mismatching flat indices) of two float64 vectors."""
    import torch

    same_special = (torch.isnan(o) == torch.isnan(r)) & (torch.isposinf(o) == torch.isposinf(r))
    same_special &= torch.isneginf(o) == torch.isneginf(r)
    finite = torch.isfinite(o) & torch.isfinite(r)
    close = torch.where(finite, (o - r).abs() <= atol + rtol * r.abs(), same_special)
    bad = ~(close & same_special)
    count = int(bad.sum())
    if count == 0:
        return 0, 0, True, []
    where = bad.nonzero()[:show, 0].tolist()
    unwritten = int((torch.isnan(o) & ~torch.isnan(r)).sum())
    return count, unwritten, bool(same_special.all()), where


def _position(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index into ``shape`` of the row-major flat index ``flat``."""
    at = []
    for size in reversed(shape):
        flat, i = divmod(flat, size) if size else (flat, 0)
        at.append(i)
    return tuple(reversed(at))


def compare(out: Any, ref: Any, atol: float, rtol: float, show: int = 5) -> str | None:
    """None when ``out`` matches ``ref`` within the tolerance, else a description (``judge``)."""
    found = judge(out, ref, atol, rtol, show)
    return None if found is None else found.message
