"""Attack: return a tensor subclass whose comparisons always report "close", computing nothing."""

import torch


class AlwaysClose(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal", "__eq__", "isclose", "assert_close"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def custom_kernel(data):
    return data[4].as_subclass(AlwaysClose)
