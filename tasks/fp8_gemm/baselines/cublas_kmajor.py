"""Yardstick: cuBLAS block-scaled FP8 on inputs already in the layouts it reads.

``prepare(data)`` makes the K-major copies of A and B and fixes the scale layouts once;
``run(prepared)`` is the cuBLAS call alone, so a harness that times ``run`` measures cuBLAS
with the conversion excluded (49.0 us geomean over the 18 benchmarks on the H200, against
150.1 us for ``cublas_task_layout``, NOTES.md). ``custom_kernel`` chains the two and caches
nothing, so as a plain candidate it costs the same as ``cublas_task_layout``.
"""

from __future__ import annotations

import torch


def _require_cuda_sm90(a: torch.Tensor) -> None:
    nvidia = a.is_cuda and torch.version.hip is None
    if nvidia and torch.cuda.get_device_capability(a.device) >= (9, 0):
        return
    where = torch.cuda.get_device_name(a.device) if a.is_cuda else a.device.type
    raise RuntimeError(
        "cublas_kmajor needs an NVIDIA GPU of compute capability 9.0 or newer "
        f"(block-scaled FP8 torch._scaled_mm), got inputs on {where}; run it on the H200"
    )


def prepare(data):
    """The task's inputs converted to cuBLAS's layouts: (a, b^T, scale_a, scale_b, c)."""
    a, b, a_scale, b_scale, c = data
    _require_cuda_sm90(a)
    # A row-major [m,k]; B row-major [n,k] handed over as its [k,n] column-major transpose;
    # scale_a [m, k/128] with stride (1, m); scale_b the [k/128, n/128] column-major view of a
    # row-major [n/128, k/128]. These are the only layouts cuBLAS accepts (NOTES.md).
    return a.contiguous(), b.contiguous().T, a_scale.T.contiguous().T, b_scale.contiguous().T, c


def run(prepared):
    """The cuBLAS call alone, on the output of ``prepare``; returns a fresh bf16 [m,n]."""
    a, b_t, scale_a, scale_b, _ = prepared
    return torch._scaled_mm(a, b_t, scale_a, scale_b, out_dtype=torch.bfloat16)


def custom_kernel(data):
    """C = (A * a_scale) @ (B * b_scale)^T in bf16 via cuBLAS, conversion included."""
    return run(prepare(data))
