"""How an item of the plugin shows its failure: its text, or one line under ``--tb=line``.

pytest's line style prints a report's whole ``longrepr`` and then its crash line (a string
longrepr's first 50 characters), so a text failure came out twice, the second cut mid-word.
Under ``--tb=line`` the failure is a traceback-free exception repr whose crash line is the
failure's first line, at the file and line it concerns: printed once, and carried by xdist.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def failure_repr(item: pytest.Item, text: str, path: Path | str,
                 lineno: int | Callable[[], int] = 1, line: str | None = None) -> Any:
    """``text`` as ``item``'s failure; under ``--tb=line``, ``path:lineno: LINE`` (default: the
    text's first line; ``lineno`` may be a function, called only then)."""
    if item.config.getoption("tbstyle", "auto") != "line":
        return text
    try:
        from _pytest._code.code import ReprExceptionInfo, ReprFileLocation, ReprTraceback
    except ImportError:  # pragma: no cover - a pytest that moved them: the text as before
        return text
    head = line or (text.strip().splitlines()[0] if text.strip() else "failed")
    at = lineno() if callable(lineno) else lineno
    return ReprExceptionInfo(reprtraceback=ReprTraceback([], None, "line"),
                             reprcrash=ReprFileLocation(str(path), at, head))


def def_line(source: Path, name: str) -> int:
    """The line of ``def name`` in ``source`` (1 when it cannot be found)."""
    try:
        lines = source.read_text(errors="replace").splitlines()
    except OSError:
        return 1
    mark = f"def {name}("
    return next((i for i, line in enumerate(lines, 1) if line.lstrip().startswith(mark)), 1)


_FRAME = re.compile(r'^\s*File "(.+)", line (\d+)', re.MULTILINE)


def raised_line(detail: str, source: Path) -> int | None:
    """The line of ``source`` a worker's traceback text (a failure's ``detail``) was raised at:
    its last frame in that file, the innermost of the last exception; None when none is."""
    found = [int(m.group(2)) for m in _FRAME.finditer(detail) if m.group(1) == str(source)]
    return found[-1] if found else None
