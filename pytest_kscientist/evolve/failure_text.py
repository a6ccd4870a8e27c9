"""A candidate's error, trimmed for prompts and the findings without losing what it says.

The whole final message is kept (a Triton ``CompilationError`` reads "at 3:4:" on its first
line and states its cause on the last: issue 13), with the candidate's last frames and the
last line of each exception it was raised from; text that is not a traceback (mismatch
details) keeps its head and its tail.
"""

from __future__ import annotations

import re

DETAIL_CHARS = 2400  # of one error in a prompt: the message, three frames and their code
FRAMES_KEPT = 3
_CHAINED = re.compile(
    r"^(The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)$",
    re.MULTILINE,
)
_HEADER = "Traceback (most recent call last):"


def trim(detail: str, limit: int = DETAIL_CHARS) -> str:
    """``detail`` (a traceback or a checker's message) within about ``limit`` characters."""
    text = detail.strip()
    if len(text) <= limit:
        return text
    blocks = [b.strip() for b in _CHAINED.split(text)[::2] if b.strip()]
    if not blocks or _HEADER not in blocks[-1]:
        return _middle_cut(text, limit)
    frames, message = _parse(blocks[-1])
    causes = [_parse(b)[1].splitlines()[-1] for b in blocks[:-1] if _parse(b)[1]]
    head = []
    if len(frames) > FRAMES_KEPT:
        head.append(f"Traceback (last {FRAMES_KEPT} of {len(frames)} frames):")
    elif frames:
        head.append(_HEADER)
    head += frames[-FRAMES_KEPT:]
    tail = [f"(raised from {cause[:300]})" for cause in causes[-2:]]
    room = limit - sum(len(x) + 1 for x in head + tail)
    return "\n".join([*head, _middle_cut(message, max(room, limit // 2)), *tail])


def _parse(block: str) -> tuple[list[str], str]:
    """(frames, each with its code lines; the exception's message) of one traceback block."""
    lines = block.splitlines()
    start = next((i + 1 for i, ln in enumerate(lines) if ln.startswith(_HEADER)), 0)
    frames: list[str] = []
    i = start
    while i < len(lines) and (lines[i].startswith(" ") or not lines[i]):
        if lines[i].lstrip().startswith('File "') or not frames:
            frames.append(lines[i])
        else:
            frames[-1] += "\n" + lines[i]
        i += 1
    message = "\n".join(lines[i:]).strip() or "\n".join(lines[:start]).strip()
    return [f for f in frames if f.strip()], message


def _middle_cut(text: str, limit: int) -> str:
    """``text`` with its middle left out when it is longer than ``limit``: the head says what
    failed, the tail (the last lines) usually why."""
    if len(text) <= limit:
        return text
    head, tail = limit // 3, limit - limit // 3
    cut = len(text) - head - tail
    return f"{text[:head].rstrip()}\n[... {cut} characters left out ...]\n{text[-tail:].lstrip()}"
