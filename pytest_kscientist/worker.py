"""The pytest side of a candidate worker: spawn, talk, watch, kill, replace.

Each candidate runs in a fresh ``python -m pytest_kscientist.runner`` process in its own session
(process group), pinned to one device, in a temporary working directory, with secrets removed
from its environment, its stdout/stderr going to a log file that is never parsed. Results come
back over a dedicated pipe as HMAC-authenticated frames (``channel.py``).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_kscientist import channel
from pytest_kscientist.errors import ChannelError

SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|"
    r"^(GEMINI|GOOGLE|OPENAI|ANTHROPIC|AWS|AZURE|HF|HUGGING|GITHUB|GH|CI_JOB)_|^PYTEST_|^KS_",
    re.IGNORECASE,
)


class WorkerDied(Exception):
    """The worker did not answer: it exited, crashed, hung or sent something not authentic."""

    def __init__(self, reason: str, log_tail: str = "", hung: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.hung = hung


def clean_environment(device: str) -> dict[str, str]:
    """The parent's environment without secrets, pinned to ``device``."""
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device.startswith("cuda"):
        index = device.partition(":")[2] or "0"
        env["CUDA_VISIBLE_DEVICES"] = index
        env["HIP_VISIBLE_DEVICES"] = index
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class Worker:
    """One live candidate process. Any failure to answer kills it; make a new one to go on."""

    def __init__(self, reference: Path, device: str, output_index: int | None, timeout: float):
        self.timeout = timeout
        self.key = secrets.token_bytes(32)
        self.seq_out = 0
        self.seq_in = 0
        self.tmp = tempfile.TemporaryDirectory(prefix="ks-worker-")
        self.log_path = Path(self.tmp.name) / "candidate.log"
        req_r, self.req_w = os.pipe()
        self.res_r, res_w = os.pipe()
        worker_device = "cuda:0" if device.startswith("cuda") else "cpu"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest_kscientist.runner", str(req_r), str(res_w)],
                pass_fds=(req_r, res_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.tmp.name,
                env=clean_environment(device),
                start_new_session=True,
            )
        os.close(req_r)
        os.close(res_w)
        hello = {
            "key": self.key.hex(),
            "device": worker_device,
            "reference": str(reference),
            "output_index": output_index,
        }
        self._send(hello, key=b"")
        self.overhead_us = self._receive("hello", timeout * 2)[0].get("overhead_us", 0.0)

    def _send(self, header: dict[str, Any], key: bytes = b"") -> None:
        try:
            channel.write_all(self.req_w, channel.encode(key, self.seq_out, header))
        except OSError as exc:
            self.kill()
            raise WorkerDied(f"worker closed its request pipe ({exc.strerror})", self.log_tail())
        self.seq_out += 1

    def _receive(self, op: str, timeout: float) -> tuple[dict[str, Any], bytes]:
        deadline = time.monotonic() + timeout
        try:
            header, payload = channel.read_frame(self.res_r, self.key, self.seq_in, deadline)
        except TimeoutError:
            self.kill()
            raise WorkerDied(
                f"no answer to '{op}' within {timeout:.0f} s (hang?); worker killed; "
                "raise --ks-timeout if the kernel is legitimately slow",
                self.log_tail(),
                hung=True,
            ) from None
        except EOFError:
            code = self.kill()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise WorkerDied(f"worker {how} before answering '{op}'", self.log_tail()) from None
        except ChannelError as exc:
            self.kill()
            raise WorkerDied(f"{exc}; worker killed", self.log_tail()) from None
        self.seq_in += 1
        if header.get("op") != op:
            self.kill()
            raise WorkerDied(f"worker answered '{header.get('op')}' to '{op}'", self.log_tail())
        return header, payload

    def request(
        self, op: str, timeout: float | None = None, **fields: Any
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its authenticated answer."""
        self._send({"op": op, **fields})
        return self._receive(op, self.timeout if timeout is None else timeout)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        """Kill the worker's whole process group; return its exit code."""
        # The whole group, even after the leader exited: a candidate may leave children behind.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self._close_fds()
        return code

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                channel.write_all(self.req_w, channel.encode(b"", self.seq_out, {"op": "exit"}))
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.tmp.cleanup()

    def _close_fds(self) -> None:
        for fd in (self.req_w, self.res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.req_w = self.res_r = -1
