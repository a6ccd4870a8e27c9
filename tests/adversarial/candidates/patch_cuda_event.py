"""Attack: make CUDA events report a tiny elapsed time for every call."""

import torch

torch.cuda.Event.elapsed_time = lambda self, end: 0.001


def custom_kernel(data):
    return data[4]
