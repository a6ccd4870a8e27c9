"""The OS sandbox entered by a forked worker (``zygote.py``), as system calls (Linux only).

It does what the exec'd runner's prefix does (``harness/mounts.sandbox_prefix``): ``unshare
--map-current-user --keep-caps --mount --net --pid --kill-child --mount-proc``, bind mounts
made read-only (the project, the working folder, torch's extension root) or writable again (the
candidate's own build folder), then ``setpriv --inh-caps=-all --ambient-caps=-all
--bounding-set=-all --no-new-privs``. Standard library only: it runs on the worker side.
"""

from __future__ import annotations

import ctypes
import os
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAPABILITY_VERSION_3 = 0x20080522

# statvfs flag -> the mount flag a bind remount must repeat: in a user namespace the kernel
# refuses a remount that would drop a flag locked on the mount it copies (EPERM).
_KEPT = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
         (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
         (os.ST_RELATIME, MS_RELATIME))

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), None), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def unshare() -> None:
    """New user (this user mapped to itself), mount (private), network and PID namespaces; the
    next child forked is the PID namespace's init. The caller must be single-threaded."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)


def in_order(protect: list[str], writable: list[str]) -> list[tuple[str, bool]]:
    """(folder, read-only) in the order to bind them: the shallower first, so that no bind
    hides one made before it (a bind is not recursive: it hides the mounts below it), which
    lets either kind sit inside the other; at equal depth the read-only first (a folder in
    both lists ends writable)."""
    entries = [(p, True) for p in protect] + [(p, False) for p in writable]
    return sorted(entries, key=lambda e: len(os.path.normpath(e[0]).split(os.sep)))


def bind(path: str, readonly: bool) -> None:
    """``mount --bind path path && mount -o remount,bind,ro|rw path``."""
    _mount(path, path, None, MS_BIND)
    flags = os.statvfs(path).f_flag
    kept = sum(ms for st, ms in _KEPT if flags & st)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | kept | (MS_RDONLY if readonly else 0))


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (``unshare --kill-child``)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def mount_proc() -> None:
    """A /proc of this PID namespace (``--mount-proc``): the processes outside it unlisted."""
    _mount("none", "/proc", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV)


def drop_privileges() -> None:
    """No capability in any set, an empty bounding set, no new privileges (``setpriv``)."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT)")
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def name(title: bytes) -> None:
    """This process's name in /proc/PID/comm (at most 15 bytes)."""
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(title[:15]), 0, 0, 0)
