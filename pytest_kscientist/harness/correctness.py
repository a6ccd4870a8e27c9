"""Element-wise comparison of a candidate's output with the reference (pytest process only)."""

from __future__ import annotations

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


def judge(out: Any, ref: Any, atol: float, rtol: float, show: int = 5) -> Mismatch | None:
    """None when every element satisfies |out-ref| <= atol + rtol*|ref| and NaN/Inf positions
    match; otherwise what differs, with the mismatch count and the first mismatches."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return Mismatch(f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Mismatch(f"output dtype {out.dtype}, expected {ref.dtype}")
    o, r = out.double(), ref.double()
    same_special = (torch.isnan(o) == torch.isnan(r)) & (torch.isposinf(o) == torch.isposinf(r))
    same_special &= torch.isneginf(o) == torch.isneginf(r)
    finite = torch.isfinite(o) & torch.isfinite(r)
    close = torch.where(finite, (o - r).abs() <= atol + rtol * r.abs(), same_special)
    bad = ~(close & same_special)
    count = int(bad.sum())
    if count == 0:
        return None
    where = bad.nonzero()[:show].tolist()
    firsts = "; ".join(
        f"{tuple(i)}: got {o[tuple(i)].item():.6g}, expected {r[tuple(i)].item():.6g}"
        for i in where
    )
    message = f"{count} of {o.numel()} elements outside |out-ref| <= {atol:g} + {rtol:g}*|ref|"
    unwritten = int((torch.isnan(o) & ~torch.isnan(r)).sum())
    if unwritten:
        message += f" ({unwritten} are NaN where the reference is not: unwritten output?)"
    structural = not bool(same_special.all())
    return Mismatch(f"{message}; first: {firsts}", structural, count, o.numel())


def compare(out: Any, ref: Any, atol: float, rtol: float, show: int = 5) -> str | None:
    """None when ``out`` matches ``ref`` within the tolerance, else a description (``judge``)."""
    found = judge(out, ref, atol, rtol, show)
    return None if found is None else found.message
