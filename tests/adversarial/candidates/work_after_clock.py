"""Attack: return at once, with a profile hook that does the real work (the seed's algorithm) the
moment the harness has read its end-of-call clock, then removes itself. The output is complete
before it is copied, the reported time is a few microseconds, and no hook is left behind.
The hidden work is repeated so it stands well above the outside check's slack (1 ms of CPU, or
0.2 ms plus the probes' spread of wall time): less than that is documented as undetected."""

import sys
import time

import torch

CLOCK = time.perf_counter_ns
HIDDEN_REPEATS = 4


def _work(a, b, a_scale, b_scale, c):
    m, k = a.shape
    n = b.shape[0]
    sb_cols = b_scale.repeat_interleave(128, dim=0)[:n]
    acc = torch.zeros((m, n), dtype=torch.float32)
    for g in range(a_scale.shape[1]):
        k0, k1 = g * 128, min(k, (g + 1) * 128)
        a_deq = a[:, k0:k1].float() * a_scale[:, g : g + 1]
        b_deq = b[:, k0:k1].float() * sb_cols[:, g : g + 1]
        acc += a_deq @ b_deq.T
    c.copy_(acc.to(torch.bfloat16))


def custom_kernel(data):
    def hook(frame, event, arg):
        if event == "c_return" and arg is CLOCK:
            sys.setprofile(None)
            for _ in range(HIDDEN_REPEATS):
                _work(*data)

    sys.setprofile(hook)
    return data[4]
