"""Attack: make torch.cuda.synchronize a no-op so asynchronous work is not waited for (on a GPU,
the timer would stop before the kernel finished)."""

import torch

torch.cuda.synchronize = lambda device=None: None


def custom_kernel(data):
    return data[4]
