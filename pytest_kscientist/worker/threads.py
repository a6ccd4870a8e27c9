"""Worker side: a call must not return while a Python thread still runs the candidate's code.

A kernel that returns at once and lets a thread write its output afterwards (adversarial
``background_thread``) is not done when it returns: whether the runner's copy of the output sees
the thread's writes is a race, and the thread's work is outside the clock. ``ThreadWatch.after``
runs inside the timed span, right after the call returns (``timing.Timer.after_call``), and
fails the call if a thread is then running candidate code (a frame of the candidate's module on
its stack), is about to (its target, a timer's function, or a call queued in a
``concurrent.futures`` pool, is the candidate's), or is running a builtin handed to it as its
target or submitted call. The verdict does not depend on the thread's speed: from the
candidate's return to the look the runner's main thread keeps the GIL, which a thread needs to
run Python or to exit (only an audit hook of the candidate's could hand it over, and whatever a
thread does then is inside the timed span).

Not flagged: threads that ended, pool workers waiting for work, threads running only library
code, such as the ones torch.compile leaves idle after its first call (torch 2.13: a
``ThreadPoolExecutor`` worker, and where Inductor's compile pool starts, its ``InductorSubproc``
reader and ``subproc_worker_timer``). Not seen: library code handed the output
(``Thread(target=torch.functional.tensordot, kwargs={"out": c})``), calls queued in other pools
(``multiprocessing.pool.ThreadPool``), a thread started through ``_thread`` that has not run yet
(it cannot start before the runner releases the GIL, which it first does while copying the
output, so its writes land on or after the copy) or that runs a builtin, native threads.
"""

from __future__ import annotations

import _thread
import gc
import os
import sys
import threading
from concurrent.futures import thread as futures_thread
from inspect import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR
from types import FrameType, FunctionType, MethodType
from typing import Any

# A frame of one of these as a thread's innermost one: it is calling a callable that has no
# Python frame of its own (a builtin given as the target or the submitted call).
_THREAD_RUN = threading.Thread.run.__code__
_TIMER_RUN = threading.Timer.run.__code__
_WORK_ITEM_RUN = futures_thread._WorkItem.run.__code__
_WORKER = futures_thread._worker.__code__
_WorkItem = futures_thread._WorkItem
_Timer = threading.Timer
_RESUMABLE = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR

# Attributes of a ThreadWatch that hold captured functions; replacing one is tampering.
CAPTURED = ("_count", "_frames", "_referents", "_main", "_threading")


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class ThreadWatch:
    """Call ``after()`` right after each call returns; ``found`` then says why the call left a
    thread running the candidate's code, or is None."""

    def __init__(self) -> None:
        self._count = _thread._count
        self._frames = sys._current_frames
        self._referents = gc.get_referents
        self._main = _thread.get_ident()
        self._threading = threading
        self.path: str | None = None
        self.globals: dict[str, Any] | None = None
        self.entry = "custom_kernel"
        self.found: str | None = None
        # The threads' innermost frames at the last look that found nothing, and the queues of
        # the pools they work for.
        self._still: dict[int, FrameType] = {}
        self._queues: list[Any] = []

    def watch(self, path: str, module_globals: dict[str, Any], entry: str) -> None:
        """From now on, code from ``path`` (or with these globals) is the candidate's."""
        self.path, self.globals, self.entry = path, module_globals, entry

    def after(self) -> None:
        """Look at the process's Python threads (cheap when the main thread is the only one)."""
        if self._count() == 0 or self.path is None:
            self.found = None
            return
        self.found = self._look()

    def _look(self) -> str | None:
        frames = self._frames()
        frames.pop(self._main, None)
        if frames == self._still:
            # Every thread is where it was at the last look, when none ran candidate code: a
            # function's frame that is still a thread's innermost one has the same callers, and
            # only a pool's queue can have changed (walking every stack each time costs ~1.2 us
            # a thread inside the timed span: bench/thread_watch_cost.py).
            for work_queue in self._queues:
                if work_queue.qsize():
                    break
            else:
                return None
        active = getattr(self._threading, "_active", None) or {}
        self._still, self._queues = {}, []
        for ident, frame in frames.items():
            thread = active.get(ident)
            where, work_queue = self._running(thread, frame)
            if where is not None:
                name = (repr(thread.name) if thread is not None
                        else f"thread {ident}, started through _thread")
                return (f"{self.entry} returned while a Python thread it started ({name}, "
                        f"{where}) was still running; the output must be complete when "
                        f"{self.entry} returns: join the thread before returning")
            # A generator's frame can be resumed from other callers and a timer's function
            # replaced while it waits: those are looked at afresh each time.
            if not frame.f_code.co_flags & _RESUMABLE and not isinstance(thread, _Timer):
                self._still[ident] = frame
                if work_queue is not None:
                    self._queues.append(work_queue)
        return None

    def _running(self, thread: Any, frame: FrameType) -> tuple[str | None, Any]:
        """Where ``thread`` runs (or is about to run) candidate code, None if it does not; and
        the queue of the ``concurrent.futures`` pool it works for, if it does."""
        path, module_globals = self.path, self.globals
        work_queue = None
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            if code.co_filename == path or f.f_globals is module_globals:
                return (f"in {code.co_name} at {os.path.basename(code.co_filename)}:"
                        f"{f.f_lineno}"), None
            if code is _WORKER:
                work_queue = f.f_locals.get("work_queue")
                queued = self._queued(work_queue)
                if queued is not None:
                    return f"with the submitted call {queued} waiting to run", None
            f = f.f_back
        timer = isinstance(thread, _Timer)
        target = thread.function if timer else getattr(thread, "_target", None)
        # A timer's function not written in Python (a builtin such as c.copy_) is flagged too:
        # it would run later with no frame of its own to be seen by.
        if self._owned(target) or (timer and type(target) not in (FunctionType, MethodType)):
            return f"about to run {_name(target)}", None
        innermost = frame.f_code
        if (innermost is _THREAD_RUN or innermost is _TIMER_RUN) and target is not None:
            return f"running {_name(target)}", None
        if innermost is _WORK_ITEM_RUN:
            item = frame.f_locals.get("self")
            future = getattr(item, "future", None)
            if future is not None and not future.done():
                return f"running the submitted call {_name(getattr(item, 'fn', None))}", None
        return None, work_queue

    def _queued(self, work_queue: Any) -> str | None:
        """The first call waiting in a ``concurrent.futures`` pool's queue that is the
        candidate's or a builtin: a worker about to take it looks idle."""
        if work_queue is None or not work_queue.qsize():
            return None
        for held in self._referents(work_queue):
            for item in held if type(held) is list else ():
                if type(item) is _WorkItem and not item.future.done() and (
                        self._owned(item.fn) or type(item.fn) not in (FunctionType, MethodType)):
                    return _name(item.fn)
        return None

    def _owned(self, fn: Any) -> bool:
        """Whether ``fn`` is a function (or bound method) from the candidate's code."""
        if type(fn) is MethodType:
            fn = fn.__func__
        return type(fn) is FunctionType and (
            fn.__globals__ is self.globals or fn.__code__.co_filename == self.path)
