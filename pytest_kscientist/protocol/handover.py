"""Large outputs handed from the worker to the pytest process through memory the worker can no
longer change, instead of through the pipe (issue 30: outputs over 16M elements were verified on
a 4M-element sample, because whole ones cost ~2.5 ms per MB on the pipe and frames over 2 GiB
broke it).

CPU, and a CUDA output where the device path below is not available: after the call the worker
copies its snapshot of the output into a fresh memfd and seals it (F_SEAL_WRITE, SHRINK, GROW,
SEAL). From then on the kernel refuses every write to it, through any descriptor or mapping, for
good; sealing fails while any writable shared mapping of it exists. The answer names the
descriptor; the pytest process duplicates it out of the worker (``their_fd``), checks the seals
and the size itself (nothing the worker says about them is believed) and maps it copy-on-write:
no copy on its side, and nothing candidate code does afterwards can change what is compared.

CUDA (``cuda_share.py``): a device allocation exported as a file descriptor, which the
pytest process copies into its own device memory as soon as the answer arrives, before it sends
the next request; the worker could map its allocation again, the copy it compares it cannot.

The worker keeps what it offered until its next request (``Offers``): the pytest process takes
every handed-over output before it asks for anything else. Runs in both processes: standard
library, torch imported where needed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
from collections.abc import Callable
from typing import Any

from pytest_kscientist.errors import CandidateFailure, is_out_of_memory
from pytest_kscientist.protocol import cuda_share

# cuda_share is imported above, not in the functions: the worker hides the package from
# sys.modules once it has started, so an import during a call loads it again, which its
# integrity check reads as the candidate importing the harness (every output over
# SHARED_ABOVE failed so on the H200).

# Bytes above which a tensor is handed over rather than written into the frame. On the 2-core CPU,
# offered and taken in one process, against a frame through a widened pipe: 0.19 / 0.36 ms at
# 64 KiB, 0.38 / 0.74 ms at 256 KiB, 0.99 / 2.27 ms at 1 MiB (notes/timing.md); 256 KiB leaves
# room for a CUDA export's fixed cost, not measured.
SHARED_ABOVE = 1 << 18
_SEALS = {"F_SEAL_WRITE": 8, "F_SEAL_SHRINK": 2, "F_SEAL_GROW": 4, "F_SEAL_SEAL": 1}
_F_ADD_SEALS, _F_GET_SEALS = 1033, 1034  # Linux's, as fcntl names them from Python 3.8 on
_NEEDED = _SEALS["F_SEAL_WRITE"] | _SEALS["F_SEAL_SHRINK"]  # no write, no SIGBUS on a read
_PIDFD_GETFD = 438  # the syscall's number on every Linux architecture (since 5.6)
_FD_LIMIT = 1 << 20


class Offers:
    """What the worker handed over and must keep alive until its next request."""

    def __init__(self) -> None:
        self._release: list[Callable[[], None]] = []

    def hold(self, release: Callable[[], None]) -> None:
        self._release.append(release)

    def release(self) -> None:
        """Let go of everything offered so far (the pytest process has taken it)."""
        held, self._release = self._release, []
        for release in held:
            try:
                release()
            except OSError:
                pass  # a descriptor candidate code closed already: nothing left to free


# -- the worker's side ---------------------------------------------------------------------------


def host_bytes(flat: Any) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy, kept alive by the view."""
    n = flat.numel()
    if n == 0:
        return memoryview(b"")
    array = (ctypes.c_ubyte * n).from_address(flat.data_ptr())
    array.keep = flat  # the tensor lives as long as the view does
    return memoryview(array)


def offer(flat: Any, kinds: list[str], offers: Offers) -> dict[str, Any] | None:
    """Hand over a contiguous uint8 tensor: the description for the answer's header, or None
    where no kind the pytest process accepts works here (the bytes then go in the frame)."""
    if flat.device.type == "cuda" and "cuda" in kinds:
        try:
            desc, release = cuda_share.export(flat)
        except (cuda_share.CudaError, RuntimeError):
            pass  # this driver or device cannot export one: the host path below
        else:
            offers.hold(release)
            return desc
    if "memfd" not in kinds or not hasattr(os, "memfd_create"):
        return None
    fd = _sealed_memfd(host_bytes(flat.cpu()))
    offers.hold(lambda: os.close(fd))
    return {"kind": "memfd", "fd": fd}


def _sealed_memfd(data: memoryview) -> int:
    """A new memfd holding ``data``, sealed against every change."""
    import fcntl

    fd = os.memfd_create("ks-output", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, len(data))
        done = 0
        while done < len(data):  # one pwrite moves at most 2 GiB - 4 KiB on Linux
            done += os.pwrite(fd, data[done:], done)
        fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", _F_ADD_SEALS), sum(_SEALS.values()))
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- the pytest process's side -------------------------------------------------------------------


def their_fd(pid: int, number: int) -> int:
    """A descriptor of this process for the worker's descriptor ``number``: the same open file
    (pidfd_getfd), else the file opened again through /proc (read-only, never blocking)."""
    if not 0 <= number < _FD_LIMIT:
        raise OSError(f"descriptor number {number} out of range")
    first: OSError | None = None  # pidfd_getfd's reason, the more exact one where both fail
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            pidfd, first = -1, exc
        if pidfd >= 0:
            try:
                got = _libc().syscall(_PIDFD_GETFD, pidfd, number, 0)  # close-on-exec set
                if got >= 0:
                    return int(got)
                code = ctypes.get_errno()
                first = OSError(code, os.strerror(code))
            finally:
                os.close(pidfd)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # a FIFO would block
    try:
        return os.open(f"/proc/{pid}/fd/{number}", flags)
    except OSError as exc:
        raise (first or exc) from None


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def accepted(pid: int | None, device: str) -> list[str]:
    """The kinds of handover this process can take from the worker ``pid`` on ``device``
    (empty: every output comes in its frame)."""
    if pid is None or not hasattr(os, "memfd_create"):
        return []
    try:
        os.close(their_fd(pid, 0))  # the runner's stdin (/dev/null): can we reach its files?
    except OSError:
        return []
    kinds = ["memfd"]
    if device.startswith("cuda") and cuda_share.works(device):
        kinds.insert(0, "cuda")
    return kinds


def take(desc: Any, nbytes: int, pid: int | None, device: str) -> Any:
    """The ``nbytes`` bytes the worker ``pid`` handed over as ``desc``: a uint8 tensor it can no
    longer write to (on ``device`` for a CUDA handover, else on the CPU). A description that does
    not check out is the candidate's failure, in one line."""
    if not isinstance(desc, dict) or desc.get("kind") not in ("memfd", "cuda"):
        raise _refused(f"unknown description {str(desc)[:80]!r}")
    number = desc.get("fd")
    if type(number) is not int or pid is None:
        raise _refused(f"descriptor {number!r} is not a descriptor number")
    try:
        fd = their_fd(pid, number)
    except OSError as exc:
        raise _refused(f"cannot take the worker's descriptor {number}: "
                       f"{exc.strerror or exc}") from None
    try:
        if desc["kind"] == "cuda":
            size = desc.get("size")
            if type(size) is not int or not nbytes <= size < 1 << 48:
                raise _refused(f"allocation size {size!r} does not hold {nbytes} bytes")
            try:
                return cuda_share.take(fd, size, nbytes, device)
            except (cuda_share.CudaError, RuntimeError) as exc:
                if is_out_of_memory(exc):  # torch's, in this process
                    # not the candidate's doing: the rounds retire their twins and try again
                    raise CandidateFailure(
                        f"the pytest process ran out of device memory taking the output "
                        f"({nbytes} bytes) beside the workers: {str(exc)[:160]}",
                        out_of_memory=True) from None
                raise _refused(f"CUDA allocation {number}: {exc}") from None
        return _mapped(fd, number, nbytes)
    finally:
        os.close(fd)


def _mapped(fd: int, number: int, nbytes: int) -> Any:
    """The sealed memfd ``fd`` mapped copy-on-write, as a uint8 tensor of ``nbytes``."""
    import fcntl
    import mmap

    import torch

    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _refused(f"descriptor {number} is not a shared-memory file")
    try:
        seals = fcntl.fcntl(fd, getattr(fcntl, "F_GET_SEALS", _F_GET_SEALS))
    except OSError:
        raise _refused(f"descriptor {number} is not a sealed memfd") from None
    if seals & _NEEDED != _NEEDED:
        raise _refused(f"memfd {number} is not sealed against writes and shrinking "
                       f"(seals {seals:#x}): it could change after it was handed over")
    if info.st_size < nbytes:
        raise _refused(f"memfd {number} holds {info.st_size} bytes, the header says {nbytes}")
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    # Copy-on-write: a writable buffer for torch, and any write stays in this process.
    return torch.frombuffer(mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY), dtype=torch.uint8)


def _refused(why: str) -> CandidateFailure:
    return CandidateFailure(f"output handover refused: {why}")
