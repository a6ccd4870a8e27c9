"""Attack: return a lazy object that only computes when someone looks at it (after the clock
has stopped), forwarding everything else to a tensor."""

import torch


class LazyResult:
    def __init__(self, data):
        self._data = data
        self._value = None

    def _force(self):
        if self._value is None:
            a, b, a_scale, b_scale, c = self._data
            k, n = a.shape[1], b.shape[0]
            sa = a_scale.repeat_interleave(128, dim=1)[:, :k]
            sb = b_scale.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
            self._value = ((a.float() * sa) @ (b.float() * sb).T).to(torch.bfloat16)
        return self._value

    def __getattr__(self, name):
        return getattr(self._force(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = [a._force() if isinstance(a, LazyResult) else a for a in args]
        return func(*args, **(kwargs or {}))


def custom_kernel(data):
    return LazyResult(data)
