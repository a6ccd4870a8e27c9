"""Framed, authenticated messages between the pytest process and a candidate worker.

A frame is: 4-byte header length, 8-byte payload length, 32-byte HMAC-SHA256, JSON header,
raw payload. The HMAC covers a per-direction sequence number, the header and the payload, keyed
by a secret the parent sends before the candidate is imported; anything the candidate prints or
writes elsewhere is never parsed. Runs in both processes: standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import struct
import time
from typing import Any

from pytest_kscientist.errors import ChannelError

_PREFIX = struct.Struct("!IQ32s")
MAX_HEADER = 16 * 1024 * 1024


def _mac(key: bytes, seq: int, header: bytes, payload: bytes) -> bytes:
    h = hmac.new(key, seq.to_bytes(8, "big"), hashlib.sha256)
    h.update(header)
    h.update(payload)
    return h.digest()


# Linux's F_SETPIPE_SZ: a pipe of 1 MiB rather than 64 KiB moves large outputs in 16 times
# fewer wake-ups of the reader (fcntl.F_SETPIPE_SZ is there from Python 3.10 on Linux only).
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def widen(fd: int) -> None:
    """Ask for a larger pipe buffer; where that is refused (not Linux, a lower limit), keep
    the default, which only costs speed."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), PIPE_BYTES)
    except (ImportError, OSError):
        pass


def _head(key: bytes, seq: int, header: dict[str, Any], payload: bytes) -> bytes:
    """A frame without its payload: prefix (lengths, HMAC) and JSON header."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(len(raw), len(payload), _mac(key, seq, raw, payload)) + raw


def encode(key: bytes, seq: int, header: dict[str, Any], payload: bytes = b"") -> bytes:
    """Serialise one frame."""
    return _head(key, seq, header, payload) + payload


def send(fd: int, key: bytes, seq: int, header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one frame without copying the payload into it (``encode``'s bytes, in parts)."""
    write_all(fd, _head(key, seq, header, payload))
    if payload:
        write_all(fd, payload)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytearray:
    """``n`` bytes read straight into one buffer (no chunks joined afterwards)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError
        count = os.readv(fd, [view[got:]])
        if not count:
            raise EOFError
        got += count
    return buf


def read_frame(
    fd: int, key: bytes, seq: int, deadline: float | None = None
) -> tuple[dict[str, Any], bytes]:
    """Read and authenticate one frame; raise EOFError, TimeoutError or ChannelError."""
    hlen, plen, mac = _PREFIX.unpack(_read_exact(fd, _PREFIX.size, deadline))
    if hlen > MAX_HEADER:
        raise ChannelError(f"worker frame header of {hlen} bytes exceeds {MAX_HEADER}")
    raw = _read_exact(fd, hlen, deadline)
    try:
        payload = _read_exact(fd, plen, deadline)  # a bytearray: torch.frombuffer takes it as is
    except (MemoryError, OverflowError):
        raise ChannelError(f"worker frame {seq} claims a payload of {plen} bytes, more than "
                           "this process can hold") from None
    if not hmac.compare_digest(mac, _mac(key, seq, raw, payload)):
        raise ChannelError(f"worker frame {seq} failed authentication (forged or out of order)")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ChannelError(f"worker frame {seq} has a header that is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ChannelError(f"worker frame {seq} header is {type(header).__name__}, not an object")
    return header, payload
