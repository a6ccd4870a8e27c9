"""Attack: build a fresh tensor object over an input's memory (a different storage, a pointer
64 bytes into B), so a check that only compares storage start pointers does not see the alias."""

import ctypes

import torch


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    m, n = c.shape
    raw = (ctypes.c_char * (m * n * 2)).from_address(b.data_ptr() + 64)
    return torch.frombuffer(raw, dtype=torch.bfloat16).view(m, n)
