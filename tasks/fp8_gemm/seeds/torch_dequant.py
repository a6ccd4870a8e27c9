"""Honest PyTorch seed: dequantise A and B block by block in fp32, one matmul, one bf16 rounding.

Tunable knobs (rewritten by the offline scientist): ``k_group`` is how many 128-wide K blocks are
dequantised and multiplied per step (1 = a matmul per block; 0 = all blocks in one matmul),
``m_chunk`` how many rows of A are processed per step (0 = all rows).
"""

import torch

TUNABLES = {"k_group": 1, "m_chunk": 0}
TUNABLE_SPACE = {"k_group": [0, 1, 2, 4, 8, 16], "m_chunk": [0, 16, 32, 64, 128, 256, 512]}

BLOCK = 128


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    m, k = a.shape
    n = b.shape[0]
    kb = a_scale.shape[1]
    group = TUNABLES["k_group"] or kb
    rows = TUNABLES["m_chunk"] or m
    b_scale_cols = b_scale.repeat_interleave(BLOCK, dim=0)[:n]  # [n, kb]
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        acc = torch.zeros((r1 - r0, n), dtype=torch.float32, device=a.device)
        for g0 in range(0, kb, group):
            g1 = min(kb, g0 + group)
            k0, k1 = g0 * BLOCK, min(k, g1 * BLOCK)
            width = k1 - k0
            sa = a_scale[r0:r1, g0:g1].repeat_interleave(BLOCK, dim=1)[:, :width]
            sb = b_scale_cols[:, g0:g1].repeat_interleave(BLOCK, dim=1)[:, :width]
            a_deq = a[r0:r1, k0:k1].float() * sa
            b_deq = b[:, k0:k1].float() * sb
            acc += a_deq @ b_deq.T
        c[r0:r1] = acc.to(torch.bfloat16)
    return c
