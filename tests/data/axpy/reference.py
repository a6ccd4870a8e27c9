import torch


def generate_input(n, seed, device="cpu"):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x = torch.randn(n, device=device, generator=gen)
    y = torch.randn(n, device=device, generator=gen)
    return x, y, torch.empty(n, device=device)


def ref_kernel(data):
    x, y, _ = data
    return 2 * x + y


def work(n, seed):
    return {"flops": 2.0 * n, "bytes": 12.0 * n}
