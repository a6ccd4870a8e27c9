"""FP8 block-scaled GEMM (AMD Developer Challenge 2025), the task of the GPU Kernel Scientist paper.

Inputs (a, b, a_scale, b_scale, c):
  a        [m, k]  fp8, column-major (allocated as [k, m] and transposed)
  b        [n, k]  fp8, column-major (allocated as [k, n] and transposed)
  a_scale  [m, ceil(k/128)]            fp32, column-major, one scale per row and 128-wide K block
  b_scale  [ceil(n/128), ceil(k/128)]  fp32, column-major, one scale per 128x128 block of b
  c        [m, n]  bf16, row-major, preallocated output

C[i, j] = sum_kb a_scale[i, kb] * b_scale[j // 128, kb] * sum_{kk in kb} A[i, kk] * B[j, kk],
accumulated in fp32 and rounded once to bf16.
"""

from __future__ import annotations

import torch

BLOCK = 128


def fp8_dtype(device: torch.device | str) -> torch.dtype:
    """The task's fp8 format: e4m3fnuz on ROCm, e4m3fn on CUDA and CPU."""
    if torch.device(device).type == "cuda" and torch.version.hip is not None:
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def _cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def generate_input(m: int, n: int, k: int, seed: int, device: str = "cpu"):
    """Seeded inputs in the task's layouts, drawn on ``device``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    f8 = fp8_dtype(device)
    limit = torch.finfo(f8).max
    a = torch.randn((k, m), dtype=torch.float32, device=device, generator=gen)
    b = torch.randn((k, n), dtype=torch.float32, device=device, generator=gen)
    a = a.clamp_(-limit, limit).to(f8).T
    b = b.clamp_(-limit, limit).to(f8).T
    a_scale = torch.randn((kb, m), dtype=torch.float32, device=device, generator=gen).T
    b_scale = torch.randn((kb, nb), dtype=torch.float32, device=device, generator=gen).T
    c = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    return a, b, a_scale, b_scale, c


def ref_kernel(data) -> torch.Tensor:
    """Dequantise both operands block by block in fp32, multiply, round once to bf16."""
    a, b, a_scale, b_scale, c = data
    m, k = a.shape
    n = b.shape[0]
    a_deq = a.float() * a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    b_full = b_scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    b_deq = b.float() * b_full[:n, :k]
    return (a_deq @ b_deq.T).to(torch.bfloat16)


def work(m: int, n: int, k: int, seed: int) -> dict[str, float]:
    """Fewest flops and bytes any implementation must spend on one case (the physical floor)."""
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    return {
        "flops": 2.0 * m * n * k,
        "bytes": float(m * k + n * k + 4 * (m * kb + nb * kb) + 2 * m * n),
    }
