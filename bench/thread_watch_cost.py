"""What the runner's look for threads (``threads.ThreadWatch.after``) costs a timed call.

    python bench/thread_watch_cost.py

Per call, best of 5 repeats: with no other thread (the usual case), beside 3 and 6 idle threads
(their stacks unchanged since the last look: the fast path), and with every stack walked again.
The look runs inside the timed span; the first figure is part of the overhead the timer
subtracts (it is calibrated with no other thread).
"""

from __future__ import annotations

import threading
import time

from pytest_kscientist.api import ThreadWatch


def per_call(watch: ThreadWatch, calls: int, walk: bool = False) -> float:
    """Microseconds a look takes, best of 5 runs of ``calls`` looks."""
    watch.after()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            if walk:
                watch._still = {}  # forget the last look: every stack is walked
            watch.after()
        best = min(best, (time.perf_counter_ns() - start) / calls / 1000)
    return best


def main() -> None:
    watch = ThreadWatch()
    watch.watch("/not/a/candidate.py", {}, "custom_kernel")
    print(f"no other thread: {per_call(watch, 100_000):.3f} us")
    release = []
    for count in (3, 6):
        while len(release) < count:
            done = threading.Event()
            release.append(done)
            threading.Thread(target=done.wait, daemon=True).start()
        print(f"{count} idle threads: {per_call(watch, 20_000):.3f} us, every stack walked: "
              f"{per_call(watch, 20_000, walk=True):.3f} us (found: {watch.found})")
    for done in release:
        done.set()


if __name__ == "__main__":
    main()
