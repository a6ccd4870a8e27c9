"""The rule against kernels that return while a thread of theirs still writes the output
(``threads.ThreadWatch``, the adversarial ``background_thread``), in this process: each
candidate is a small module written to a file and timed by the CPU timer, as the worker does.

Each attack thread that writes the output waits for ``go``, which the kernel sets just before it
returns, so none of its writing happens inside the call, and the same verdict must come 20
times in a row, whether the thread writes at once or sleeps first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_kscientist.worker.threads import ThreadWatch
from pytest_kscientist.worker.timing import CpuTimer

HEADER = """
import _thread
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

left = []  # (what to release, what to wait for) for the test's clean-up


def _write(go, c, result, pause=0.0):
    go.wait()
    if pause:
        time.sleep(pause)
    c.copy_(result)
"""

# name -> (custom_kernel's source, what the verdict says (or one of them: a pool's new worker
# takes the call at once, an idle one after the return), whether the thread writes c later)
ATTACKS = {
    "thread writes at once": ("""
def custom_kernel(data):
    x, c = data
    go = threading.Event()
    t = threading.Thread(target=_write, args=(go, c, x * 2), daemon=True)
    t.start()
    left.append((go, t))
    go.set()
    return c
""", "(_write)', in _write at kernel.py:", True),
    "thread sleeps, then writes": ("""
def custom_kernel(data):
    x, c = data
    go = threading.Event()
    t = threading.Thread(target=_write, args=(go, c, x * 2, 0.02), daemon=True)
    t.start()
    left.append((go, t))
    go.set()
    return c
""", "(_write)', in _write at kernel.py:", True),
    "pool runs the write": ("""
POOL = ThreadPoolExecutor(1)


def custom_kernel(data):
    x, c = data
    go = threading.Event()
    left.append((go, POOL.submit(_write, go, c, x * 2)))
    go.set()
    return c
""", ("', in _write at kernel.py:", "', with the submitted call _write waiting to run)"), True),
    "worker started at import": ("""
JOBS = queue.Queue()


def _serve():
    while (job := JOBS.get()) is not None:
        job()


threading.Thread(target=_serve, daemon=True).start()


def custom_kernel(data):
    x, c = data
    go, done = threading.Event(), threading.Event()
    JOBS.put(lambda: (_write(go, c, x * 2), done.set()))
    left.append((go, done))
    go.set()
    return c


def stop():
    JOBS.put(None)
""", "(_serve)', in _serve at kernel.py:", True),
    "bare _thread": ("""
def custom_kernel(data):
    x, c = data
    go, running, done = threading.Event(), threading.Event(), threading.Event()

    def run():
        running.set()
        _write(go, c, x * 2)
        done.set()

    _thread.start_new_thread(run, ())
    running.wait()
    left.append((go, done))
    go.set()
    return c
""", ", started through _thread, in ", True),
    "thread runs a builtin": ("""
def custom_kernel(data):
    x, c = data
    c.copy_(x * 2)
    lock = threading.Lock()
    lock.acquire()
    t = threading.Thread(target=lock.acquire, daemon=True)  # waits for the clean-up
    t.start()
    left.append((lock, t))
    return c
""", "', running lock.acquire)", False),
    "pool runs a builtin": ("""
POOL = ThreadPoolExecutor(1)


def custom_kernel(data):
    x, c = data
    c.copy_(x * 2)
    lock = threading.Lock()
    lock.acquire()
    left.append((lock, POOL.submit(lock.acquire)))  # waits for the clean-up
    return c
""", ("', running the submitted call lock.acquire)",
        "', with the submitted call lock.acquire waiting to run)"), False),
    "timer": ("""
def custom_kernel(data):
    x, c = data
    t = threading.Timer(60, _write, args=(threading.Event(), c, x * 2))
    t.start()
    left.append((t, t))
    return c
""", "', about to run _write)", False),
    "timer with a builtin": ("""
def custom_kernel(data):
    x, c = data
    t = threading.Timer(60, c.copy_, args=(x * 2,))
    t.start()
    left.append((t, t))
    return c
""", "', about to run Tensor.copy_)", False),
}

HONEST = {
    "threads joined": """
def custom_kernel(data):
    x, c = data
    go = threading.Event()
    go.set()
    half = c.shape[0] // 2
    ts = [threading.Thread(target=_write, args=(go, c[s], x[s] * 2))
          for s in (slice(0, half), slice(half, None))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return c
""",
    # A pool left alive and idle once its futures are done (torch.compile's first call leaves
    # one: threads.py).
    "pool waited for": """
POOL = ThreadPoolExecutor(2)


def custom_kernel(data):
    x, c = data
    go = threading.Event()
    go.set()
    half = c.shape[0] // 2
    futures = [POOL.submit(_write, go, c[s], x[s] * 2)
               for s in (slice(0, half), slice(half, None))]
    for f in futures:
        f.result()
    return c
""",
    # A thread started by the call that runs only library code and waits (Inductor's
    # compile-pool reader and timer are such threads).
    "library thread left waiting": """
IDLE = queue.Queue()


def custom_kernel(data):
    x, c = data
    c.copy_(x * 2)
    if not left:
        t = threading.Thread(target=IDLE.get, daemon=True)
        t.start()
        left.append((IDLE, t))
    return c
""",
}


def _load(path: Path, source: str) -> tuple[Any, ThreadWatch, CpuTimer]:
    path.write_text(HEADER + source)
    spec = importlib.util.spec_from_file_location(f"_ks_thread_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    watch = ThreadWatch()
    watch.watch(str(path), vars(module), "custom_kernel")
    return module, watch, CpuTimer(watch.after)


def _release(module: Any) -> None:
    """Let every thread a candidate left behind go on, and wait until it is done."""
    for handle, done in module.left:
        if isinstance(handle, threading.Timer):
            handle.cancel()
        elif isinstance(handle, threading.Event):
            handle.set()
        elif isinstance(handle, queue.Queue):
            handle.put(None)
        else:
            handle.release()
        if isinstance(done, threading.Thread):
            done.join()
        elif isinstance(done, threading.Event):
            done.wait()
        else:
            done.result()
    module.left.clear()


@pytest.fixture
def candidate(tmp_path: Path) -> Iterator[Callable[[str], tuple[Any, ThreadWatch, CpuTimer]]]:
    loaded: list[Any] = []

    def load(source: str) -> tuple[Any, ThreadWatch, CpuTimer]:
        found = _load(tmp_path / "kernel.py", source)
        loaded.append(found[0])
        return found

    yield load
    for module in loaded:
        _release(module)
        if hasattr(module, "stop"):
            module.stop()
        if hasattr(module, "POOL"):
            module.POOL.shutdown(wait=True)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(64.0), torch.full((64,), float("nan"))


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_kernel_that_returns_while_its_thread_works_fails(candidate, name: str) -> None:
    source, where, writes_later = ATTACKS[name]
    module, watch, timer = candidate(source)
    for _ in range(20):  # the same verdict every time
        x, c = data = _data()
        timer.time_call(module.custom_kernel, data)
        found = watch.found or ""
        assert found.startswith("custom_kernel returned while a Python thread it started ("), found
        assert found.endswith(") was still running; the output must be complete when "
                              "custom_kernel returns: join the thread before returning"), found
        assert any(w in found for w in ((where,) if isinstance(where, str) else where)), found
        _release(module)
        if writes_later:
            assert torch.equal(c, x * 2)  # the thread did write the output, after the return


@pytest.mark.parametrize("name", sorted(HONEST))
def test_threads_that_are_done_or_wait_in_library_code_pass(candidate, name: str) -> None:
    module, watch, timer = candidate(HONEST[name])
    for _ in range(20):
        x, c = data = _data()
        timer.time_call(module.custom_kernel, data)
        assert watch.found is None, watch.found
        assert torch.equal(c, x * 2)
    if name != "threads joined":
        assert threading.active_count() > 1  # the look did run beside a live thread


def test_the_look_is_inside_the_timed_span() -> None:
    """Whatever happens before the look is timed: a thread that finishes before it did its
    work inside the call."""
    def slow_look() -> None:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    _, raw_us, _ = CpuTimer(slow_look).time_call(lambda _: None, None)
    assert raw_us >= 2000.0


COMPILED = """
import torch
from torch._inductor.async_compile import maybe_warm_pool


@torch.compile
def _f(x):
    return (x * 2 + 1).relu()


def custom_kernel(x):
    maybe_warm_pool()  # Inductor's compile pool and its threads, as a GPU compile starts them
    return _f(x)
"""

COMPILED_RUNNER = """
import importlib.util, json, sys, threading
import torch
from pytest_kscientist.worker.threads import ThreadWatch
from pytest_kscientist.worker.timing import CpuTimer

path = sys.argv[1]
spec = importlib.util.spec_from_file_location("_ks_candidate", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
watch = ThreadWatch()
watch.watch(path, vars(module), "custom_kernel")
timer = CpuTimer(watch.after)
found = []
for _ in range(3):
    x = torch.randn(64, 64)
    out, _, _ = timer.time_call(module.custom_kernel, x)
    found.append(watch.found)
    assert torch.allclose(out, (x * 2 + 1).relu())
print(json.dumps({"found": found, "threads": sorted(t.name for t in threading.enumerate())}))
"""


def test_the_threads_torch_compile_leaves_are_not_flagged(tmp_path: Path) -> None:
    """torch.compile's first call leaves a ThreadPoolExecutor worker and (with Inductor's
    compile pool, which a GPU compile starts) a reader and a timer thread, all idle."""
    kernel = tmp_path / "compiled.py"
    kernel.write_text(COMPILED)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               TORCHINDUCTOR_COMPILE_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", COMPILED_RUNNER, str(kernel)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["found"] == [None, None, None]
    # (torch 2.13 also leaves its timer, "subproc_worker_timer"; torch 2.11 on an H100 did not)
    assert "InductorSubproc" in seen["threads"], seen
    assert any(name.startswith("ThreadPoolExecutor") for name in seen["threads"])
