"""Attack: import the harness's timing module and make its timer report zero."""

import pytest_kscientist.worker.timing as timing

timing.CpuTimer.time_call = lambda self, fn, arg: (fn(arg), 0.0)


def custom_kernel(data):
    return data[4]
