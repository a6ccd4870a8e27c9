"""Atomic file writes shared by every record the plugin persists, and whether a file's owning
process still runs (standard library only)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_target(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temp path beside ``path``, unique to this process and call; on a clean exit it
    replaces ``path`` atomically, and it is removed either way.

    The name is unique so that two runs writing the same document at once (two ``--evolve``
    runs sharing a population) never rename each other's file away. ``suffix`` keeps the
    extension tools choose a format by (``.png`` for matplotlib).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def owner_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host, which owns a file or folder, may still run (one
    of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
