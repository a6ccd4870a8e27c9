"""The only module that times: runs inside the candidate worker, before the candidate is imported.

``make_timer`` captures the clock, the event and synchronisation functions when it is called
(the runner calls it before importing the candidate), so later monkeypatching of ``time``,
``torch.cuda.Event`` or ``torch.cuda.synchronize`` by candidate code does not reach it.

GPU protocol: flush L2, synchronise the device, record a start event, call, synchronise the
whole device (so work left on side streams or queued by other threads is counted), record an
end event. The constant cost of that protocol (sync and event latency) is measured on an empty
call and subtracted by the pytest process. CPU protocol: a monotonic nanosecond clock around
the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

L2_FLUSH_BYTES = 256 * 1024 * 1024


class Timer:
    """Times one call of ``fn(arg)``; returns (result, raw_us).

    ``raw_us`` still contains the protocol's own cost; the pytest process subtracts
    ``overhead_us`` (measured here before any candidate code runs), so candidate code that
    rewrites the attribute changes nothing.
    """

    overhead_us = 0.0

    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
        raise NotImplementedError

    def calibrate(self, runs: int = 25) -> None:
        """Measure the protocol's own cost on an empty call (median) and subtract it later."""
        samples = sorted(self.time_call(_empty, None)[1] for _ in range(runs))
        self.overhead_us = samples[len(samples) // 2]


def _empty(_: Any) -> None:
    return None


class CpuTimer(Timer):
    def __init__(self) -> None:
        self._now = time.perf_counter_ns

    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
        now = self._now
        t0 = now()
        out = fn(arg)
        t1 = now()
        return out, (t1 - t0) / 1000.0


class CudaTimer(Timer):
    def __init__(self, device: Any) -> None:
        import torch

        base = torch._C._CudaEventBase
        self._event = base
        self._record = base.record
        self._elapsed = base.elapsed_time
        self._ev_sync = base.synchronize
        self._device_sync = torch._C._cuda_synchronize
        self._zero = torch.Tensor.zero_
        self._current_stream = torch.cuda.current_stream
        self._scratch = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)

    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
        start = self._event(enable_timing=True)
        end = self._event(enable_timing=True)
        self._zero(self._scratch)
        self._device_sync()
        stream = self._current_stream()
        self._record(start, stream)
        out = fn(arg)
        self._device_sync()
        self._record(end, stream)
        self._ev_sync(end)
        return out, self._elapsed(start, end) * 1000.0


def make_timer(device: str) -> Timer:
    """The timer for ``device`` ("cpu" or "cuda[:i]"), with its functions captured now."""
    if device.startswith("cuda"):
        timer: Timer = CudaTimer(device)
    else:
        timer = CpuTimer()
    timer.calibrate()
    return timer
