"""Element-wise comparison of a candidate's output with the reference (pytest process only)."""

from __future__ import annotations

from typing import Any


def compare(out: Any, ref: Any, atol: float, rtol: float, show: int = 5) -> str | None:
    """None when every element satisfies |out-ref| <= atol + rtol*|ref| and NaN/Inf positions
    match; otherwise a description with the mismatch count and the first mismatches."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        return f"output dtype {out.dtype}, expected {ref.dtype}"
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
        f"{tuple(i)}: got {o[tuple(i)].item():.6g}, expected {r[tuple(i)].item():.6g}" for i in where
    )
    message = f"{count} of {o.numel()} elements outside |out-ref| <= {atol:g} + {rtol:g}*|ref|"
    unwritten = int((torch.isnan(o) & ~torch.isnan(r)).sum())
    if unwritten:
        message += f" ({unwritten} are NaN where the reference is not: unwritten output?)"
    return f"{message}; first: {firsts}"
