"""Attack: replace the clocks in the time module so every call looks instantaneous."""

import time

import torch

time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0


def custom_kernel(data):
    return data[4].zero_().to(torch.bfloat16)
