"""Unit tests of the defences the corpus relies on, with scripted workers and in-process checks."""

from __future__ import annotations

import random
import site
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness import evaluate
from pytest_kscientist.harness.correctness import compare
from pytest_kscientist.harness.evaluate import Evaluator
from pytest_kscientist.harness.mounts import protected_paths, sandbox_prefix
from pytest_kscientist.harness.results import CandidateResult
from pytest_kscientist.harness.scan import scan_file, scan_source
from pytest_kscientist.protocol import perturb
from pytest_kscientist.worker.integrity import Tripwire

FP8 = REPO / "tasks" / "fp8_gemm"
CASE = {"m": 64, "n": 64, "k": 128, "seed": 6635}


class ScriptedWorker:
    """Answers like a runner whose kernel is the reference, with the times and costs it is told.

    ``raw_us``: the kernel time it reports; ``cpu_call_us`` / ``cpu_probe_us``: the CPU time a
    call / a probe costs it; ``wall_call_us`` / ``wall_probe_us``: how far the scripted
    round-trip clock moves.
    """

    overhead_us = 0.5
    timeout = 30.0

    def __init__(self, ev: Evaluator, raw_us: float, cpu_call_us: float = 2000.0,
                 cpu_probe_us: float = 1000.0, wall_call_us: float = 2000.0,
                 wall_probe_us: float = 1000.0,
                 outside: dict[bool, list[float]] | None = None) -> None:
        self.ev, self.raw_us = ev, raw_us
        # The device time a GPU's flush span and tail would report, cycled: probes (True) and
        # calls (False).
        self.outside = outside or {True: [0.0], False: [0.0]}
        self.asked = {True: 0, False: 0}
        self.cpu = {True: cpu_probe_us, False: cpu_call_us}
        self.wall = {True: wall_probe_us, False: wall_call_us}
        self.spent_us = 0.0
        self.now_ns = 0
        self.last: Any = None

    def clock(self) -> int:
        return self.now_ns

    def cpu_us(self) -> float:
        return self.spent_us

    def cpus(self) -> int:
        return 2

    def request(self, op: str, timeout: float | None = None,
                **fields: Any) -> tuple[dict[str, Any], bytes]:
        if op == "fetch":
            out = self.last.contiguous()
            payload = out.view(torch.uint8).numpy().tobytes()
            meta = {"shape": list(out.shape), "dtype": str(out.dtype).removeprefix("torch."),
                    "nbytes": len(payload)}
            return {"ok": True, "op": op, "output": meta}, payload
        probe = bool(fields.get("probe"))
        self.spent_us += self.cpu[probe]
        self.now_ns += int(1000 * self.wall[probe])
        if not probe:
            self.last = self.ev.expected(fields["case"], fields["seed"])
        raw = 0.0 if probe else self.raw_us  # a CPU probe runs nothing between the clocks
        spans = self.outside[probe]
        outside = spans[self.asked[probe] % len(spans)]
        self.asked[probe] += 1
        return {"ok": True, "op": op, "raw_us": raw + self.overhead_us,
                "outside_us": outside}, b""


@pytest.fixture
def fp8() -> Evaluator:
    return Evaluator(load_task(FP8), "cpu", salt=1234)


def _bench(ev: Evaluator, worker: ScriptedWorker, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(evaluate, "_clock", worker.clock)
    return ev.bench(worker, CASE, "H200", budget_s=0.05)  # type: ignore[arg-type]


def test_a_time_below_the_physical_floor_is_rejected(fp8: Evaluator, monkeypatch) -> None:
    floor = fp8.floor_us(CASE, "H200")
    assert floor is not None and floor > 0
    worker = ScriptedWorker(fp8, raw_us=floor / 2, wall_call_us=1000.0 + floor / 2)
    with pytest.raises(CandidateFailure, match=r"impossible time: fastest call .* is below the "
                       r"physical floor .* for H200"):
        _bench(fp8, worker, monkeypatch)


def test_a_median_of_no_time_is_an_impossible_time(monkeypatch) -> None:
    """A timer that saw no work (on a GPU: a kernel computing on the host, under the events'
    lead) read 0.0 us; the session then crashed at its end on a geomean of zero, losing every
    result. It is the benchmark's own failure."""
    from pytest_kscientist.harness.collect import load_any

    # A GPU MODE problem: no floor to reject the time first (the fp8 task's does).
    task = load_any(REPO / "tests" / "data" / "formats" / "gpumode" / "cpu" / "scale_py" /
                    "task.yml")
    ev = Evaluator(task, "cpu", salt=1234)
    case = task.profile("cpu").benchmarks[0]
    assert ev.floor_us(case, "x86_64") is None
    worker = ScriptedWorker(ev, raw_us=0.0, wall_call_us=1000.0, cpu_call_us=1000.0)
    monkeypatch.setattr(evaluate, "_clock", worker.clock)
    with pytest.raises(CandidateFailure, match=r"^impossible time: median 0\.000 us over \d+ "
                       r"timed calls$"):
        ev.bench(worker, case, "x86_64", budget_s=0.05)  # type: ignore[arg-type]


# Flush spans and tails (us) of 8 probes on an H100 (2026-12-06, an honest 2 us kernel's round).
H100_PROBES = [92.2, 92.9, 93.0, 93.1, 93.2, 93.5, 96.2, 96.9]


def test_work_outside_the_events_is_counted(fp8: Evaluator, monkeypatch) -> None:
    """A side stream's 30 us a call in the flush span or the tail: timed, not rejected."""
    worker = ScriptedWorker(fp8, raw_us=2.0, wall_call_us=1002.0, cpu_call_us=1002.0, outside={
        True: H100_PROBES, False: [x + 30.0 for x in H100_PROBES]})
    result = _bench(fp8, worker, monkeypatch)
    assert result.outcome == "passed" and result.stats is not None
    assert result.stats.counted_outside_us == pytest.approx(30.0, abs=1.5)
    assert result.stats.median_us == pytest.approx(32.0, abs=1.5)


def test_work_outside_the_events_on_three_calls_in_five_is_counted(fp8, monkeypatch) -> None:
    """A side stream that hides its 30 us on 60% of the calls moves the median span: counted."""
    spans = [x + (30.0 if i % 5 < 3 else 0.0) for i, x in enumerate(H100_PROBES * 5)]
    worker = ScriptedWorker(fp8, raw_us=2.0, wall_call_us=1002.0, cpu_call_us=1002.0,
                            outside={True: H100_PROBES, False: spans})
    result = _bench(fp8, worker, monkeypatch)
    assert result.stats is not None and result.stats.counted_outside_us > 25.0


def test_an_offset_of_the_spans_within_their_noise_is_not_counted(fp8, monkeypatch) -> None:
    """An honest 2 us kernel's spans sat up to 4.1 us above its probes' on an H100 (60 rounds):
    2 us of margin counted that in 4 rounds, and the round read 1.5-2.5x slower."""
    worker = ScriptedWorker(fp8, raw_us=2.0, wall_call_us=1002.0, cpu_call_us=1002.0, outside={
        True: H100_PROBES, False: [x + 4.0 for x in H100_PROBES]})
    result = _bench(fp8, worker, monkeypatch)
    assert result.stats is not None
    assert result.stats.counted_outside_us == 0.0 and result.stats.median_us == 2.0


def test_a_burst_of_long_spans_is_asked_again_before_it_is_counted(fp8, monkeypatch) -> None:
    """12 of a round's first 20 calls met a slow flush: more probes and calls, then the verdict
    on all of them, so a burst that does not last is not added to every call."""
    burst = fp8.task.spec.bench.warmup + 12
    worker = ScriptedWorker(fp8, raw_us=2.0, wall_call_us=1002.0, cpu_call_us=1002.0, outside={
        True: H100_PROBES, False: [103.0] * burst + H100_PROBES * 20})
    monkeypatch.setattr(evaluate, "_clock", worker.clock)
    # A budget no loaded machine spends: the round ends on its precise median, after 20 calls
    # (with _bench's 0.05 s of real time, a suite's load ended it after fewer, all in the burst).
    result = fp8.bench(worker, CASE, "H200", budget_s=600.0)  # type: ignore[arg-type]
    assert result.stats is not None
    assert worker.asked[False] > burst + 8  # the burst alone made the median: asked again
    assert result.stats.counted_outside_us == 0.0 and result.stats.median_us == 2.0


def test_honest_times_pass_the_floor_and_both_cross_checks(fp8: Evaluator, monkeypatch) -> None:
    worker = ScriptedWorker(fp8, raw_us=1000.0)
    result = _bench(fp8, worker, monkeypatch)
    assert result.outcome == "passed" and result.stats is not None
    assert result.stats.median_us == pytest.approx(1000.0)
    assert result.stats.verified_runs == fp8.task.spec.bench.verify_samples


def test_work_hidden_from_the_worker_clock_is_seen_by_the_wall_clock(fp8, monkeypatch) -> None:
    # Reports 10 us; each call's round trip is 5 ms longer than a probe's; its CPU is not.
    worker = ScriptedWorker(fp8, raw_us=10.0, wall_call_us=7000.0, cpu_call_us=1000.0)
    with pytest.raises(CandidateFailure, match=r"timing disagrees with what the pytest process "
                       r"measures from outside: the wall clock saw about 5\d\d\d us per call"):
        _bench(fp8, worker, monkeypatch)


def test_work_hidden_from_the_worker_clock_is_seen_in_its_cpu_time(fp8, monkeypatch) -> None:
    # The round trips look innocent (a loaded machine hides them); the CPU time does not.
    worker = ScriptedWorker(fp8, raw_us=10.0, cpu_call_us=7000.0, wall_call_us=1000.0)
    with pytest.raises(CandidateFailure, match=r"the worker used about 5\d\d\d us of CPU per "
                       r"call more than the reported median of 10.0 us"):
        _bench(fp8, worker, monkeypatch)


def test_multithreaded_honest_kernels_may_use_several_cpus(fp8, monkeypatch) -> None:
    # 2 ms of kernel on 2 CPUs is 4 ms of CPU: allowed.
    worker = ScriptedWorker(fp8, raw_us=2000.0, cpu_call_us=5000.0, wall_call_us=3000.0)
    assert _bench(fp8, worker, monkeypatch).outcome == "passed"


def test_perturbation_changes_one_element_per_input_and_shows_in_the_output() -> None:
    ev = Evaluator(load_task(FP8), "cpu", salt=1)
    case = {"m": 32, "n": 200, "k": 384, "seed": 1236}
    data = ev.inputs(case, 7)
    before = ev.reference.ref_kernel(data)
    changes = perturb.choose(data, 4, random.Random(0))
    assert [c[0] for c in changes] == [0, 1, 2, 3]  # never the output (index 4)
    copy = [t.clone() for t in data]
    perturb.apply(copy, changes)
    for i in range(4):
        differs = (copy[i].float() != data[i].float()).sum().item()
        assert differs == 1
    after = ev.reference.ref_kernel(copy)
    assert compare(before, after, 1e-3, 2e-2) is not None  # a stale result fails the re-run


def test_tripwire_names_what_was_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    class Timer:
        def __init__(self) -> None:
            self._now = time.perf_counter_ns

        def time_call(self) -> int:
            return self._now()

    timer = Timer()
    wire = Tripwire({"timer": (timer, None)}, package="no_such_harness_package")
    assert wire.check() is None
    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter_ns", lambda: 0)
        assert "replaced time.perf_counter_ns" in (wire.check() or "")
    with monkeypatch.context() as m:
        m.setattr(timer, "_now", lambda: 0)
        assert "replaced timer._now" in (wire.check() or "")
    code = Timer.time_call.__code__
    Timer.time_call.__code__ = (lambda self: 0).__code__
    try:
        assert "rewrote the code of Timer.time_call" in (wire.check() or "")
    finally:
        Timer.time_call.__code__ = code
    sys.setprofile(lambda *a: None)
    try:
        assert "left a sys.setprofile hook installed" in (wire.check() or "")
    finally:
        sys.setprofile(None)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert "torch.get_default_dtype() from torch.float32 to torch.float64" in (
            wire.check() or "")
    finally:
        torch.set_default_dtype(old)
    assert wire.check() is None
    assert "imported the harness's own package pytest_kscientist" in (
        Tripwire({}, package="pytest_kscientist").check() or "")


@pytest.mark.parametrize(("source", "expected"), [
    ("import gc\n", "line 1: imports gc"),
    ("def f(t):\n    return t.data_ptr()\n", "line 2: uses .data_ptr"),
    ("C = {}\ndef f(t):\n    return C.get(t.data_ptr())\n", "line 3: uses .data_ptr"),
    ("def f(t, last):\n    return t.data_ptr() + 0 == last\n", "line 2: uses .data_ptr"),
    ("import sys\ndef f():\n    return sys._getframe(1)\n", "line 3: uses ._getframe"),
    ("import ctypes\n", "imports ctypes"),
    ("import threading\n", "imports threading"),
    ("import torch\ns = torch.cuda.Stream()\n", "uses .Stream"),
    ("exec('x = 1')\n", "calls exec()"),
    ("import os\nos._exit(0)\n", "uses ._exit"),
    ("import time\ntime.perf_counter = None\n", "assigns time.perf_counter (monkeypatching"),
    ("C = {}\ndef f(k, v):\n    C[k] = v\n", "line 1: keeps module-level state 'C'"),
    ("import functools\n@functools.lru_cache\ndef f(x):\n    return x\n", "memoises f()"),
])
def test_scan_flags_constructs_cheaters_use(source: str, expected: str) -> None:
    assert any(expected in line for line in scan_source(source)), scan_source(source)


def test_an_address_handed_to_a_launcher_is_not_reported() -> None:
    """A raw-pointer wrapper (the CUDA seed's) passes addresses to its compiled function, with
    offsets added, and tests their alignment: none of that keys a cache."""
    source = ("def f(lib, t, w, cut):\n"
              "    if t.data_ptr() % 16:\n"
              "        t = t.clone()\n"
              "    lib.run(t.data_ptr(), w.data_ptr() + 256 if cut else 0, out=w.data_ptr())\n")
    assert scan_source(source) == []


def test_scan_is_quiet_on_the_seeds_and_on_constant_tables() -> None:
    for seed in sorted((FP8 / "seeds").glob("*.py")):
        assert scan_file(seed) == [], seed
    assert scan_source("TABLE = {'a': 1}\ndef f():\n    return TABLE['a']\n") == []
    assert scan_source("def broken(:\n") == []


def test_a_big_speedup_asks_for_review() -> None:
    fast = CandidateResult(name="c", path="c.py", sha256="0", speedup_over_reference=12.5)
    assert fast.review.startswith("12.5x faster than the reference (over 10x)")
    assert "review" in fast.model_dump()
    slow = CandidateResult(name="c", path="c.py", sha256="0", speedup_over_reference=3.0)
    assert slow.review == ""
    assert CandidateResult(name="r", path="r.py", sha256="0", role="baseline",
                           speedup_over_reference=50.0).review == ""


def test_sandbox_protects_the_project_but_never_home_or_tmp(tmp_path, monkeypatch) -> None:
    project = tmp_path / "proj"
    (project / "tasks" / "t").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    monkeypatch.chdir(project)
    installed = [p for p in protected_paths(project / "tasks" / "t" / "reference.py")
                 if p != project.resolve()]
    assert protected_paths(project / "tasks" / "t" / "reference.py") == [project.resolve(),
                                                                        *installed]
    monkeypatch.setenv("HOME", str(project))
    assert protected_paths(project / "tasks" / "t" / "reference.py") == installed
    # Python and its packages are kept read-only: a .pth file planted there would run in
    # every later Python process, the next session's pytest process included.
    site_packages = Path(site.getsitepackages()[0]).resolve()
    assert any(p == site_packages or p in site_packages.parents for p in installed), installed
    prefix = sandbox_prefix([Path("/a b")])
    assert prefix[:1] == ["unshare"] and "--net" in prefix and "--pid" in prefix
    assert "mount --bind '/a b' '/a b' && mount -o remount,bind,ro '/a b'" in prefix[-2]


def test_a_folder_with_mounts_inside_is_not_bound_whole(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The sandbox's bind mount of a folder would hide the mounts inside it (a GPU container
    binds its driver's libraries one by one into /usr/lib): such a folder of the installed code
    is left out, a deeper one without mounts (site-packages) kept."""
    from pytest_kscientist.harness import mounts

    read_mounts = mounts.mount_points
    prefix = Path(sys.prefix).resolve()
    assert prefix in mounts.installed_code()
    monkeypatch.setattr(mounts, "mount_points", lambda: [prefix / "lib" / "libdriver.so"])
    kept = mounts.installed_code()
    assert prefix not in kept
    site_packages = Path(site.getsitepackages()[0]).resolve()
    assert site_packages in kept  # the mount is beside it, not inside
    monkeypatch.setattr(mounts, "mount_points", read_mounts)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("36 35 98:0 /mnt1 /mnt/a\\040b rw - ext3 /dev/root rw\n")
    real_path = Path

    def fake(path: str) -> Path:
        return mountinfo if path == "/proc/self/mountinfo" else real_path(path)

    monkeypatch.setattr(mounts, "Path", fake)
    assert mounts.mount_points() == [real_path("/mnt/a b")]


def test_without_the_sandbox_one_warning_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kscientist.harness import mounts
    from pytest_kscientist.harness import spawn as worker

    reference = FP8 / "reference.py"
    monkeypatch.setattr(mounts, "sandbox_available", lambda protect: "unshare: not permitted")
    with pytest.warns(mounts.KsSandboxUnavailable, match=r"run without the OS sandbox \("
                      r"unshare: unshare: not permitted\): they can reach the network"):
        assert worker._spawn_mounts(reference, None) is None
    with pytest.raises(worker.WorkerDied, match="sandbox was required but does not work here"):
        worker._spawn_mounts(reference, True)
    assert worker._spawn_mounts(reference, False) is None
