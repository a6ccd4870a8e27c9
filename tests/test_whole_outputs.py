"""Outputs judged whole, whatever their size (issue 30): checks and verified timed calls of an
output over 16M elements, frames and handovers over 2 GiB, handed-over outputs the worker can
no longer change, and malformed handovers as the candidate's failure."""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import AXPY, case_reasons, run_pytest

from pytest_kscientist.errors import CandidateFailure, ChannelError
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness import correctness, received
from pytest_kscientist.harness.evaluate import Evaluator
from pytest_kscientist.protocol import channel, handover
from pytest_kscientist.worker import runner

LARGE = (1 << 24) + 8  # over the 16M elements the checks used to sample 4M of

ONE_OFF = """import torch

def custom_kernel(data):
    x, y, out = data
    torch.add(y, x, alpha=2, out=out)
    if x.numel() > 1 << 24:
        out[x.numel() // 3] += 1.0  # one element of 16M wrong
    return out
"""

# Right on the first two calls at each size (a check and its re-run), one element wrong after.
COUNTS_CALLS = """import collections
import torch

calls = collections.Counter()

def custom_kernel(data):
    x, y, out = data
    torch.add(y, x, alpha=2, out=out)
    calls[x.numel()] += 1
    if calls[x.numel()] > 2 and x.numel() > 1 << 20:
        out[x.numel() // 3] += 1.0
    return out
"""


def _large_task(tmp_path: Path, tests: str, benchmarks: str) -> Path:
    task = tmp_path / "axpy"
    shutil.copytree(AXPY, task)
    spec = (task / "task.toml").read_text()
    spec = spec.replace("tests = [{ n = 1000, seed = 1 }, { n = 33, seed = 2 }]", tests)
    spec = spec.replace("benchmarks = [{ n = 4096, seed = 3 }]", benchmarks)
    (task / "task.toml").write_text(spec)
    return task


def test_one_wrong_element_of_a_16m_element_output_fails_both_checks(tmp_path: Path) -> None:
    task = _large_task(tmp_path, f"tests = [{{ n = {LARGE}, seed = 1 }}, "
                                 f"{{ n = {LARGE + 4}, seed = 2 }}]",
                       "benchmarks = [{ n = 4096, seed = 3 }]")
    (tmp_path / "one_off.py").write_text(ONE_OFF)
    code, output, data = run_pytest(
        [str(task), "-k", "check", f"--kernel={tmp_path / 'one_off.py'}",
         f"--kernel={task / 'seeds' / 'good.py'}"], cwd=tmp_path)
    assert data is not None, output[-3000:]
    reasons = case_reasons(data)
    for n, seed in ((LARGE, 1), (LARGE + 4, 2)):
        outcome, reason = reasons[("one_off", f"n{n}-s{seed}")]
        assert outcome == "failed", reason
        assert reason.startswith(f"wrong result: 1 of {n} elements outside"), reason
        assert reasons[("good", f"n{n}-s{seed}")] == ("passed", "")
    assert code == 1


def test_a_kernel_wrong_only_after_its_checks_fails_its_benchmark(tmp_path: Path) -> None:
    # Timed calls were sampled above 2^18 elements (65536 of them): 1M is enough to tell.
    n = (1 << 20) + 8
    task = _large_task(tmp_path, f"tests = [{{ n = {n}, seed = 1 }}]",
                       f"benchmarks = [{{ n = {n}, seed = 3 }}]")
    (tmp_path / "counts_calls.py").write_text(COUNTS_CALLS)
    code, output, data = run_pytest(
        [str(task), f"--kernel={tmp_path / 'counts_calls.py'}"], cwd=tmp_path)
    assert data is not None, output[-3000:]
    reasons = case_reasons(data)
    assert reasons[("counts_calls", f"n{n}-s1")] == ("passed", "")
    outcome, reason = reasons[("counts_calls", f"n{n}-s3")]
    assert outcome == "failed", reason
    assert re.match(rf"timed call \d+: wrong result: 1 of {n} elements outside", reason), reason
    assert code == 1


# -- over 2 GiB --------------------------------------------------------------------------------

HUGE = (1 << 31) + 4096  # bytes: over what one C int counts


def _through_the_pipe(meta: dict[str, Any], payload: Any) -> tuple[dict[str, Any], Any]:
    """One frame written by a thread and read here, as the worker and the pytest process do."""
    read_fd, write_fd = os.pipe()
    channel.widen(write_fd)
    key = b"k" * 32
    writer = threading.Thread(target=channel.send, args=(write_fd, key, 0, meta, payload))
    writer.start()
    try:
        got = channel.read_frame(read_fd, key, 0)
    finally:
        writer.join()
        os.close(read_fd)
        os.close(write_fd)
    return got


@pytest.mark.slow  # 2 GiB through a pipe and a memfd: about 4-6 GB of memory, 10-20 s here
def test_an_output_over_2_gib_crosses_the_pipe_and_the_handover() -> None:
    source = torch.arange(HUGE // 4, dtype=torch.int32)
    offers = handover.Offers()
    meta, payload = runner._serialise(source, None, offers)  # no handover: in the frame
    header, body = _through_the_pipe(meta, payload)
    del payload
    out = received.output(_Here(), header, body, "cpu")
    assert out.shape == source.shape and torch.equal(out, source)
    del out, body
    spec = {"above": handover.SHARED_ABOVE, "kinds": handover.accepted(os.getpid(), "cpu")}
    meta, payload = runner._serialise(source, spec, offers)
    assert meta["shared"]["kind"] == "memfd" and len(payload) == 0
    out = received.output(_Here(), meta, payload, "cpu")
    offers.release()  # the worker's side let go: the mapping here holds the memory
    assert torch.equal(out, source)


def test_a_frame_claiming_more_memory_than_there_is_is_a_channel_error() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, channel._PREFIX.pack(2, 1 << 62, b"\0" * 32) + b"{}")
        with pytest.raises(ChannelError, match=r"worker frame 0 claims a payload of "
                           r"4611686018427387904 bytes, more than this process can hold"):
            channel.read_frame(read_fd, b"k", 0)
    finally:
        os.close(read_fd)
        os.close(write_fd)


# -- what the worker can no longer change --------------------------------------------------------


class _Here:
    """A worker whose runner is this process (its descriptors are ours)."""

    def _runner_pid(self) -> int:
        return os.getpid()


def test_a_handed_over_output_cannot_be_written_after_the_handover() -> None:
    offers = handover.Offers()
    source = torch.arange(1 << 20, dtype=torch.float32)
    spec = received.spec(_Here(), "cpu")
    assert spec is not None and spec["kinds"] == ["memfd"]
    meta, payload = runner._serialise(source, spec, offers)
    fd = meta["shared"]["fd"]
    taken = received.output(_Here(), meta, payload, "cpu")
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"\0" * 64, 0)  # the worker's own descriptor, opened read-write
    with pytest.raises(PermissionError):
        mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
    source.zero_()  # the worker's snapshot is not what is compared either
    offers.release()
    assert torch.equal(taken, torch.arange(1 << 20, dtype=torch.float32))


def _memfd(data: bytes, seals: int = 0) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


SEALED = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _meta(shared: Any, nbytes: int = 4096, shape: Any = (1024,)) -> dict[str, Any]:
    return {"shape": list(shape), "dtype": "float32", "nbytes": nbytes, "shared": shared}


@pytest.mark.parametrize(("make", "reason"), [
    (lambda tmp: {"kind": "memfd", "fd": _memfd(b"\0" * 4096)},
     r"memfd \d+ is not sealed against writes and shrinking \(seals 0x0\)"),
    (lambda tmp: {"kind": "memfd", "fd": _memfd(b"\0" * 4096, fcntl.F_SEAL_SHRINK)},
     r"memfd \d+ is not sealed against writes"),
    (lambda tmp: {"kind": "memfd", "fd": _memfd(b"\0" * 100, SEALED)},
     r"memfd \d+ holds 100 bytes, the header says 4096"),
    (lambda tmp: {"kind": "memfd", "fd": os.open(tmp / "plain", os.O_RDWR | os.O_CREAT)},
     r"descriptor \d+ is not a sealed memfd"),
    (lambda tmp: {"kind": "memfd", "fd": os.pipe()[0]},
     r"descriptor \d+ is not a shared-memory file"),
    (lambda tmp: {"kind": "memfd", "fd": 1 << 19},
     r"cannot take the worker's descriptor 524288: Bad file descriptor"),
    (lambda tmp: {"kind": "memfd", "fd": -3}, r"cannot take the worker's descriptor -3"),
    (lambda tmp: {"kind": "memfd", "fd": "3"}, r"descriptor '3' is not a descriptor number"),
    (lambda tmp: {"kind": "shm", "fd": 3}, r"unknown description"),
    (lambda tmp: ["memfd", 3], r"unknown description"),
])
def test_a_malformed_handover_is_a_one_line_candidate_failure(tmp_path: Path, make: Any,
                                                              reason: str) -> None:
    with pytest.raises(CandidateFailure) as caught:
        received.output(_Here(), _meta(make(tmp_path)), b"", "cpu")
    assert caught.value.reason.startswith("output handover refused: "), caught.value.reason
    assert re.search(reason, caught.value.reason) and "\n" not in caught.value.reason


@pytest.mark.parametrize(("meta", "payload", "reason"), [
    (_meta({"kind": "memfd", "fd": 3}, nbytes=4000), b"",
     r"output header says 4000 bytes for shape \(1024,\) of torch.float32"),
    ({"shape": ["a"], "dtype": "float32", "nbytes": 4}, b"\0" * 4,
     r"output header cannot be read \(ValueError"),
    ({"shape": [2], "dtype": "float32", "nbytes": 8}, b"\0" * 12,
     r"output header accounts for 8 of the payload's 12 bytes"),
    ({"shape": [2], "dtype": "no_such", "nbytes": 8}, b"\0" * 8, r"unknown dtype 'no_such'"),
    ("junk", b"", r"output header is str, not an object"),
    ({"parts": [{"shape": [4], "dtype": "float32", "nbytes": 16}], "nbytes": 8}, b"\0" * 8,
     r"output parts add up to more than the payload's 8 bytes"),
])
def test_a_malformed_output_header_is_a_candidate_failure(meta: Any, payload: bytes,
                                                          reason: str) -> None:
    with pytest.raises(CandidateFailure, match=reason):
        received.output(_Here(), meta, payload, "cpu")


class _Forger(_Here):
    """Answers a check with a memfd it never sealed (and could rewrite after the verdict)."""

    overhead_us = 0.0
    timeout = 30.0

    def request(self, op: str, timeout: float | None = None,
                **fields: Any) -> tuple[dict[str, Any], bytes]:
        self.fd = _memfd(b"\0" * 4000 * 4)
        meta = {"shape": [4000], "dtype": "float32", "nbytes": 16000,
                "shared": {"kind": "memfd", "fd": self.fd}}
        return {"ok": True, "op": op, "output": meta}, b""


def test_an_unsealed_handover_fails_the_check_in_one_line() -> None:
    ev = Evaluator(load_task(AXPY), "cpu", salt=3)
    forger = _Forger()
    with pytest.raises(CandidateFailure, match=r"^output handover refused: memfd \d+ is not "
                       r"sealed against writes and shrinking \(seals 0x0\): it could change "
                       r"after it was handed over$"):
        ev.check(forger, {"n": 4000, "seed": 1})  # type: ignore[arg-type]
    os.close(forger.fd)


# -- the chunked judge -----------------------------------------------------------------------------


def test_the_judge_in_chunks_counts_and_shows_what_the_whole_test_would(monkeypatch) -> None:
    monkeypatch.setattr(correctness, "CPU_CHUNK", 5)  # 24 elements: five chunks
    ref = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    out = ref.clone()
    out[0, 0, 1] = float("nan")  # unwritten
    out[1, 2, 3] += 1.0
    out[1, 0, 0] = float("inf")
    found = correctness.judge(out, ref, 1e-6, 1e-6)
    assert found is not None and (found.count, found.numel, found.structural) == (3, 24, True)
    assert found.message == (
        "3 of 24 elements outside |out-ref| <= 1e-06 + 1e-06*|ref| (1 are NaN where the "
        "reference is not: unwritten output?); first: (0, 0, 1): got nan, expected 1; "
        "(1, 0, 0): got inf, expected 12; (1, 2, 3): got 24, expected 23")
    ref[1, 0, 0] = float("inf")
    out[0, 0, 1] = 1.0
    found = correctness.judge(out, ref, 1e-6, 1e-6)  # inf where inf is expected: one left
    assert found is not None and (found.count, found.structural) == (1, False)
    assert correctness.judge(ref.clone(), ref, 0.0, 0.0) is None


# -- CUDA ------------------------------------------------------------------------------------------

CUDA = torch.cuda.is_available() and torch.version.hip is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU")
def test_a_cuda_output_is_handed_over_on_the_device_and_judged_whole() -> None:
    from pytest_kscientist.harness.baselines import start_worker
    from pytest_kscientist.protocol import cuda_share

    assert cuda_share.works("cuda"), "the driver cannot export and import an allocation here"
    task = load_task(AXPY)
    ev = Evaluator(task, "cuda", salt=3)
    worker = start_worker(task, AXPY / "seeds" / "good.py", "custom_kernel", None, "cuda", 120)
    try:
        assert received.spec(worker, "cuda")["kinds"][0] == "cuda"  # type: ignore[index]
        case = {"n": LARGE, "seed": 1}
        out = ev._output(worker, "check", case=case, seed=5)
        assert out.device.type == "cuda" and out.numel() == LARGE  # never through the host
        assert torch.equal(out, ev.expected(case, 5))
    finally:
        worker.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU")
def test_a_malformed_cuda_handover_is_refused_and_leaves_the_device_usable() -> None:
    from pytest_kscientist.protocol import cuda_share

    data = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    desc, release = cuda_share.export(data.view(torch.uint8))
    try:
        nbytes = data.numel() * 4
        taken = handover.take(desc, nbytes, os.getpid(), "cuda")
        assert torch.equal(taken.view(torch.int32), data)
        for bad, why in (({**desc, "size": desc["size"] * 4}, r"CUDA allocation \d+: cuMemMap"),
                         ({**desc, "size": nbytes - 1}, r"does not hold"),
                         ({"kind": "cuda", "fd": _memfd(b"\0" * 4096), "size": desc["size"]},
                          r"CUDA allocation \d+: cuMemImportFromShareableHandle")):
            with pytest.raises(CandidateFailure, match=why):
                handover.take(bad, nbytes, os.getpid(), "cuda")
    finally:
        release()
    assert int((data * 2).sum()) == 2 * int(data.sum())  # no error left on the device
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU")
def test_one_wrong_element_of_a_cuda_output_fails_its_check_and_benchmark(tmp_path) -> None:
    task = _large_task(tmp_path, f"tests = [{{ n = {LARGE}, seed = 1 }}]",
                       f"benchmarks = [{{ n = {LARGE}, seed = 3 }}]")
    (tmp_path / "one_off.py").write_text(ONE_OFF)
    (tmp_path / "counts_calls.py").write_text(COUNTS_CALLS)
    code, output, data = run_pytest(
        [str(task), "--ks-device", "cuda", f"--kernel={tmp_path / 'one_off.py'}",
         f"--kernel={tmp_path / 'counts_calls.py'}", f"--kernel={task / 'seeds' / 'good.py'}"],
        cwd=tmp_path)
    assert data is not None, output[-3000:]
    reasons = case_reasons(data)
    assert reasons[("one_off", f"n{LARGE}-s1")][1].startswith(
        f"wrong result: 1 of {LARGE} elements outside")
    assert reasons[("counts_calls", f"n{LARGE}-s1")] == ("passed", "")
    assert re.match(rf"timed call \d+: wrong result: 1 of {LARGE} elements outside",
                    reasons[("counts_calls", f"n{LARGE}-s3")][1])
    assert reasons[("good", f"n{LARGE}-s3")] == ("passed", "")
    assert code == 1

