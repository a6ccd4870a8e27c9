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
        o, r = _widened(flat_o[start:start + step]), _widened(flat_r[start:start + step])
        if quick and bool((_distance(o, r) <= atol + rtol * _magnitude(r)).all()) and bool(
                r.isfinite().all()):
            continue  # every element finite and close: what the full test below would find
        found = _chunk(o, r, atol, rtol, show)
        count += found[0]
        unwritten += found[1]
        special &= found[2]
        for i in found[3][:show - len(firsts)]:
            at = _position(start + i, tuple(out.shape))
            firsts.append(f"{at}: got {_shown(o[i].item())}, expected {_shown(r[i].item())}")
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
    few mismatching flat indices) of two vectors of one ``_widened`` type."""
    import torch

    if o.is_complex():  # NaN and Inf part by part; closeness by the complex distance
        same_special = _alike(torch.view_as_real(o), torch.view_as_real(r)).all(dim=-1)
    else:
        same_special = _alike(o, r)
    finite = torch.isfinite(o) & torch.isfinite(r)
    close = torch.where(finite, _distance(o, r) <= atol + rtol * _magnitude(r), same_special)
    bad = ~(close & same_special)
    count = int(bad.sum())
    if count == 0:
        return 0, 0, True, []
    where = bad.nonzero()[:show, 0].tolist()
    unwritten = int((torch.isnan(o) & ~torch.isnan(r)).sum())
    return count, unwritten, bool(same_special.all()), where


def _alike(o: Any, r: Any) -> Any:
    """Where two real vectors agree on NaN, +Inf and -Inf."""
    import torch

    same = (torch.isnan(o) == torch.isnan(r)) & (torch.isposinf(o) == torch.isposinf(r))
    return same & (torch.isneginf(o) == torch.isneginf(r))


def _widened(t: Any) -> Any:
    """A chunk in the type it is judged in: complex128 for complex outputs (both parts count),
    int64 for integers and booleans (exact: as float64, 2**60 and 2**60 + 1 are one value) but
    uint64 (as it is: int64 would wrap its upper half), float64 for the rest."""
    import torch

    if t.is_complex():
        return t.to(torch.complex128)
    if t.is_floating_point():
        return t.double()
    # uint64 on the CPU, where torch 2.13 compares and converts it (its CUDA kernels were
    # not tried here: a reviewer's caution, not a measurement)
    return t.cpu() if t.dtype == torch.uint64 else t.long()


def _distance(o: Any, r: Any) -> Any:
    """|o - r| as float64. Integers: 0 where equal, else their float64 difference and at least
    1 (int64 arithmetic wraps: 3 and 3 - 2**63 are 2**63 apart, which int64 reads as -2**63,
    "close"; as float64, 2**60 and 2**60 + 1 are one value)."""
    if o.is_floating_point() or o.is_complex():
        return (o - r).abs().double()
    return (o.double() - r.double()).abs().clamp_min(1.0).masked_fill(o == r, 0.0)


def _magnitude(r: Any) -> Any:
    """|r| as float64 (of an integer, taken in float64: |-2**63| wraps in int64)."""
    return r.double().abs() if not r.is_complex() else r.abs().double()


def _shown(value: Any) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


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
