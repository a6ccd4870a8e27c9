"""Runners forked ready-made: ``python -m pytest_kscientist.worker.zygote CTRL``.

The zygote imports torch and the worker side once, then, for each request of its pytest process
(``harness/forked.py``) on the ``SOCK_SEQPACKET`` socket CTRL, forks a worker that needs no
import of its own: 1.4 s of torch's import saved per worker on the 2-core CPU (issue 32). It
never runs candidate code, holds no secret (its environment is a worker's) and no file of
another worker: each request's descriptors are closed once its worker is forked.

A forked worker is what ``harness/runners.RunnerProcess`` starts through its exec'd prefix,
piece for piece: its own session (process group), the lifeline armed on it, stdout and stderr
to its log, its own folder; then, sandboxed (``sandbox.py``), new user, mount, network and PID
namespaces with the same mounts, a child that is the namespace's init and dies with its parent
(``--kill-child``), its own /proc, every capability dropped; then the runner. The parent stays
as ``unshare`` does and reports the runner's exit code on a status pipe.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
from typing import Any

from pytest_kscientist.worker import runner, sandbox

STATUS = struct.Struct("i")  # the runner's exit code (-N: killed by signal N)


def _arm(fd: int) -> None:
    """The lifeline of spawn._ARM, on this process's group (which it leads)."""
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETOWN, -os.getpgrp())
    fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGKILL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    if select.select([fd], [], [], 0)[0]:  # the pytest process died before the arming
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _keep_only(fds: set[int]) -> None:
    """Close every descriptor but ``fds`` (fork keeps them all, close-on-exec ones too)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _worker(request: dict[str, Any], fds: list[int], ready: int) -> int:
    """In the forked child: become the worker of ``request``; returns the exit code."""
    req_r, res_w, life_r, log, err, status_w = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _arm(life_r)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(err, 2)
    _keep_only({0, 1, 2, req_r, res_w, life_r, status_w, ready})
    os.chdir(request["cwd"])
    sandbox.unshare()
    for path, readonly in sandbox.in_order(request["protect"], request["writable"]):
        sandbox.bind(path, readonly=readonly)
    os.environ.update(request.get("env", {}))  # its own compiler caches
    tempfile.tempdir = None  # its own TMPDIR, not the one the zygote may have looked up
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child:  # unshare's part: wait, then report
        # res_w stays open here until the code is written: the pytest process, seeing the
        # result pipe's end, then finds the code (not a kill of its own) on the status pipe.
        for fd in (alive_r, req_r, ready):
            os.close(fd)
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        os.write(status_w, STATUS.pack(code))
        return 0
    sandbox.die_with_parent()
    os.close(alive_w)
    if select.select([alive_r], [], [], 0)[0]:  # the parent died before the line above
        return 1
    os.close(alive_r)
    os.close(status_w)
    sandbox.mount_proc()
    sandbox.drop_privileges()
    sandbox.name(b"ks-runner")
    # The zygote answers with the pid once the sandbox is in place: where the kernel refuses
    # a step here (while `unshare` may succeed), the pytest side starts a runner of its own.
    os.write(ready, b"1")
    os.close(ready)
    sys.argv = [runner.__file__, str(req_r), str(res_w)]  # as `python -m ...runner` has it
    sys.modules["__main__"] = runner  # likewise (adversarial patch_harness_class reaches it)
    return runner.main(["runner", str(req_r), str(res_w)])


def _fork(ctrl: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.close(ready_r)
            ctrl.close()
            code = _worker(request, fds, ready_w)
        except BaseException:  # noqa: BLE001 - the worker's own process: its log says why
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(ready_w)
    for fd in fds:
        os.close(fd)
    got = select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1)
    os.close(ready_r)
    if got:
        return {"pid": pid}
    try:
        os.killpg(pid, signal.SIGKILL)  # not in place within 30 s: no worker
    except OSError:
        pass
    return {"error": f"the forked worker {pid} did not set up its sandbox (see its log)"}


def main(argv: list[str]) -> int:
    ctrl = socket.socket(fileno=int(argv[1]))
    import torch  # noqa: F401 - what every forked worker then finds imported

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers report through their status pipe
    gc.collect()
    gc.freeze()  # forked children then do not copy the pages gc would touch
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(ctrl, 65536, 8)
        except OSError:
            return 0
        if not message:
            return 0  # the pytest process closed its end
        answer = _fork(ctrl, json.loads(message), fds)
        ctrl.send(json.dumps(answer).encode())


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv))
