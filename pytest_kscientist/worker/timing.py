"""The only module that times: runs inside the candidate worker, before the candidate is imported.

``make_timer`` captures the clock, the event and synchronisation functions when it is called
(the runner calls it before importing the candidate), so later monkeypatching of ``time``,
``torch.cuda.Event`` or ``torch.cuda.synchronize`` by candidate code does not reach it.

GPU protocol (README, "How a call is timed"): a device-wide synchronisation, a short spin kernel
(an idle H200 runs the first kernels after a 2 ms pause 20-100 us slower: ``bench/gap_probe.py``,
notes/timing.md), an event, the L2 flush (256 MB written), the start event, the call, the end
event on the caller's stream right after it returns; then a device-wide synchronisation and an
``after`` event. The kernel time is start -> end, as in GPU MODE's eval and
``triton.testing.do_bench``: the host's launch work overlaps the spin and the flush, so it is not
counted. The spin is ~0.2 ms, longer where the recent calls' launches took longer (up to
``LEAD_CAP_US``), so that launch work shorter than the cap is never counted rather than counted
on a slow host and not on a fast one.
Work the caller's stream did not order between start and end (a side stream that started
during the flush, work left running after the end event) shows as extra device time in the
flush span and the tail (end -> after); the runner reports that ``outside_us`` with every call
and the pytest process compares it with probes of the same path (``evaluate.py``). CPU
protocol: a monotonic nanosecond clock around the call.

``after_call`` runs right after the call returns, inside the timed span (before the CPU clock
stops, before the end event is recorded): the runner's look for threads the call left running
its code (``threads.py``), placed there so that whatever happens before the look is timed. Its
cost when no other thread exists (0.08-0.11 us on the 2-core CPU, bench/thread_watch_cost.py) is
part of the subtracted overhead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

L2_FLUSH_BYTES = 256 * 1024 * 1024
# GPU cycles of the spin before each timed call: about 0.2 ms at the H200's 1.98 GHz, enough to
# bring an idle GPU to the state a back-to-back loop runs in (measured, notes/timing.md).
WARM_CYCLES = 400_000
# The lead: the spin is lengthened to LEAD_MARGIN times the longest launch of the last
# LEAD_WINDOW calls (the host's time from queueing the spin to the call's return), at most
# LEAD_CAP_US. A call whose launch work outlasts the spin and the flush leaves the GPU idle
# after the start event: on the H200 a Triton seed's split-K shapes (~0.16-0.3 ms of launch
# work a call) read 2x apart from round to round and 1.33x from process to process, as the
# host's speed moved that work in and out of the timed span (notes/timing.md).
LEAD_WINDOW = 16
LEAD_MARGIN = 1.25
LEAD_CAP_US = 500.0


class Timer:
    """Times one call of ``fn(arg)``; returns (result, raw_us, outside_us).

    ``raw_us`` still contains the protocol's own cost; the pytest process subtracts
    ``overhead_us`` (measured here before any candidate code runs), so candidate code that
    rewrites the attribute changes nothing. ``outside_us``: device time of the flush span and
    the tail (GPU), 0 on the CPU.
    """

    overhead_us = 0.0

    def __init__(self, after_call: Callable[[], None] | None = None) -> None:
        self.after_call = after_call or _nothing
        self._now = time.perf_counter_ns

    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float, float]:
        raise NotImplementedError

    def busy(self, us: float) -> Callable[[Any], Any]:
        """A trusted stand-in for a kernel that keeps the device busy for about ``us``."""
        return _empty

    def calibrate(self, runs: int = 25) -> None:
        """Measure the protocol's own cost on an empty call (median) and subtract it later."""
        samples = sorted(self.time_call(_empty, None)[1] for _ in range(runs))
        self.overhead_us = samples[len(samples) // 2]


def _empty(_: Any) -> None:
    return None


def _nothing() -> None:
    return None


class CpuTimer(Timer):
    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float, float]:
        now, look = self._now, self.after_call
        t0 = now()
        out = fn(arg)
        look()
        t1 = now()
        return out, (t1 - t0) / 1000.0, 0.0


class CudaTimer(Timer):
    def __init__(self, device: Any, after_call: Callable[[], None] | None = None) -> None:
        import torch

        super().__init__(after_call)
        base = torch._C._CudaEventBase
        self._event = base
        self._record = base.record
        self._elapsed = base.elapsed_time
        self._ev_sync = base.synchronize
        self._device_sync = torch._C._cuda_synchronize
        self._spin = torch.cuda._sleep
        self._zero = torch.Tensor.zero_
        self._current_stream = torch.cuda.current_stream
        self._scratch = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        # Filled in place, never replaced: the worker's tripwire watches this object's
        # attributes. Whatever it holds, the lead stays within the bounds fixed here.
        self._launches: deque[float] = deque(maxlen=LEAD_WINDOW)
        self.cycles_per_us = self._clock_rate()
        self._lead_bounds = lead_bounds(self.cycles_per_us)

    def _clock_rate(self) -> float:
        """GPU spin cycles per microsecond, read from events around a spin (for ``busy``)."""
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        stream = self._current_stream()
        self._spin(WARM_CYCLES)
        self._record(start, stream)
        self._spin(2 * WARM_CYCLES)
        self._record(end, stream)
        self._ev_sync(end)
        return 2 * WARM_CYCLES / max(self._elapsed(start, end) * 1000.0, 1.0)

    def busy(self, us: float) -> Callable[[Any], Any]:
        cycles = max(int(us * self.cycles_per_us), 0)
        spin = self._spin

        def run(_: Any) -> None:
            if cycles:
                spin(cycles)

        return run

    def time_call(self, fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float, float]:
        event, record, stream_of = self._event, self._record, self._current_stream
        look = self.after_call
        flushed, start = event(enable_timing=True), event(enable_timing=True)
        end, after = event(enable_timing=True), event(enable_timing=True)
        self._device_sync()
        stream = stream_of()
        # Spin, flush, start and the call go in one queue with no gap: after 1-2 ms idle, any
        # emptied queue before the flush (a synchronisation, or the host waiting for the spin)
        # made small shapes 20-100 us slower. The host launches the call while the spin and
        # the flush run, so launch work shorter than the lead is not counted, as in
        # triton.testing.do_bench (notes/timing.md, section 2).
        t0 = self._now()
        self._spin(self.lead_cycles())
        record(flushed, stream)
        self._zero(self._scratch)
        record(start, stream)
        out = fn(arg)
        launched = self._now()
        look()
        record(end, stream)
        self._device_sync()
        record(after, stream)
        self._ev_sync(after)
        elapsed = self._elapsed
        outside = elapsed(flushed, start) + elapsed(end, after)
        self._launches.append((launched - t0) / 1000.0)
        return out, elapsed(start, end) * 1000.0, outside * 1000.0

    def lead_cycles(self) -> int:
        """The next call's spin: the warm-up's, or long enough for the recent launches."""
        low, high = self._lead_bounds
        longest = max(self._launches, default=0.0)
        return min(max(low, int(LEAD_MARGIN * longest * self.cycles_per_us)), high)


def lead_bounds(cycles_per_us: float) -> tuple[int, int]:
    """The spin's bounds in cycles: the warm-up spin, and LEAD_CAP_US (never below it)."""
    return WARM_CYCLES, max(WARM_CYCLES, int(LEAD_CAP_US * cycles_per_us))


def make_timer(device: str, after_call: Callable[[], None] | None = None) -> Timer:
    """The timer for ``device`` ("cpu" or "cuda[:i]"), with its functions captured now."""
    if device.startswith("cuda"):
        timer: Timer = CudaTimer(device, after_call)
    else:
        timer = CpuTimer(after_call)
    timer.calibrate()
    return timer
