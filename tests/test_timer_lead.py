"""The GPU timer's lead (worker/timing.py): the spin queued before the flush and the start event
grows with the host's recent launch work, up to LEAD_CAP_US, so launch work under the cap is
never counted (on a slow host or a fast one), and work beyond it still is."""

from __future__ import annotations

import statistics
import time
from collections import deque

import pytest
import torch

from pytest_kscientist.worker import timing
from pytest_kscientist.worker.integrity import Tripwire


def _timer(cycles_per_us: float = 2000.0) -> timing.CudaTimer:
    """A CudaTimer's lead bookkeeping alone (no device needed)."""
    timer = timing.CudaTimer.__new__(timing.CudaTimer)
    timer.cycles_per_us = cycles_per_us
    timer._launches = deque(maxlen=timing.LEAD_WINDOW)
    timer._lead_bounds = timing.lead_bounds(cycles_per_us)
    return timer


def test_the_lead_covers_the_longest_recent_launch_up_to_the_cap() -> None:
    timer = _timer()
    assert timer.lead_cycles() == timing.WARM_CYCLES
    timer._launches.append(20.0)  # a launch well inside the warm-up spin: the spin stays
    assert timer.lead_cycles() == timing.WARM_CYCLES
    timer._launches.append(300.0)
    assert timer.lead_cycles() == int(timing.LEAD_MARGIN * 300.0 * 2000.0)
    timer._launches.append(50.0)  # the longest of the window still sets it
    assert timer.lead_cycles() == int(timing.LEAD_MARGIN * 300.0 * 2000.0)
    timer._launches.append(10_000.0)  # past the cap: the rest is counted by the timer
    assert timer.lead_cycles() == int(timing.LEAD_CAP_US * 2000.0)
    timer._launches.extend([20.0] * timing.LEAD_WINDOW)
    assert timer.lead_cycles() == timing.WARM_CYCLES  # the window forgot the long launches


class _FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0


def test_a_call_lengthens_the_next_spin_and_the_tripwire_sees_nothing_replaced() -> None:
    """time_call's own bookkeeping, with the device functions replaced by host stand-ins:
    the spin it queues grows after a slow launch, and the worker's tripwire, which watches
    every attribute of the timer, finds none replaced."""
    timer = _timer(cycles_per_us=2000.0)
    spins: list[int] = []
    timer._event = _FakeEvent
    timer._record = lambda event, stream: setattr(event, "at", time.perf_counter())
    timer._elapsed = lambda a, b: (b.at - a.at) * 1000.0
    timer._ev_sync = timer._device_sync = lambda *args: None
    timer._spin = spins.append
    timer._zero = lambda scratch: None
    timer._current_stream = lambda: None
    timer._scratch = None
    # The host's clock, moved by the calls alone: on a loaded 2-core machine an empty call's
    # launch once read over 400 us of the real one, and the spin after it grew to the cap.
    host_ns = [0]
    timer._now = lambda: host_ns[0]
    timer.after_call = lambda: None
    # (the harness's package is loaded in this process; in a worker it is not)
    wire = Tripwire({"timer": (timer, None)}, package="not-loaded-here")

    def launch_taking(us: float):
        def call(_: object) -> None:
            host_ns[0] += int(us * 1000)
        return call

    timer.time_call(launch_taking(0.0), None)
    timer.time_call(launch_taking(300.0), None)
    timer.time_call(launch_taking(0.0), None)
    assert spins[0] == spins[1] == timing.WARM_CYCLES
    assert spins[2] == int(timing.LEAD_MARGIN * 300.0 * 2000.0)
    assert wire.check() is None


def _host_then_kernel(host_us: float, kernel_cycles: int, launch=None):
    def call(_: object) -> None:
        until = time.perf_counter() + host_us / 1e6
        while time.perf_counter() < until:
            pass
        (launch or torch.cuda._sleep)(kernel_cycles)

    return call


def _median(timer: timing.Timer, fn, calls: int = 40) -> float:
    times = [timer.time_call(fn, None)[1] - timer.overhead_us for _ in range(calls)]
    return statistics.median(times[8:])  # after the window has seen the launches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_launch_work_under_the_cap_is_not_counted_and_beyond_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    timer = timing.make_timer("cuda")
    kernel = int(30.0 * timer.cycles_per_us)  # ~30 us of device work
    alone = _median(timer, _host_then_kernel(0.0, kernel))
    slow_host = _host_then_kernel(400.0, kernel)  # past the warm-up spin and the flush
    led = _median(timer, slow_host)
    assert led < 1.3 * alone + 5.0, (led, alone)
    # Far past the cap, the GPU waits for the host inside the timed span: counted.
    far = _median(timer, _host_then_kernel(timing.LEAD_CAP_US + 1000.0, kernel), calls=24)
    assert far > alone + 700.0, (far, alone)
    # With the lead held at the warm-up spin, the same slow host is counted in part: what the
    # lead removes.
    monkeypatch.setattr(timing, "LEAD_CAP_US", 0.0)
    fixed = timing.make_timer("cuda")
    held = _median(fixed, slow_host)
    assert held > led + 50.0, (held, led)
