"""Typed errors of the harness. Messages name the subject, the expectation, the finding, the fix."""

from __future__ import annotations

import sys


class KsError(Exception):
    """Base class of pytest-kscientist errors."""


class TaskSpecError(KsError):
    """A task folder or its spec file is invalid."""


class ChannelError(KsError):
    """A worker message was missing, truncated, out of order or not authentic."""


class CandidateFailure(KsError):
    """A candidate's verdict on one case is a failure: a one-line reason plus detail.

    ``wrong_result``: the worker answered and the pytest process judged its output wrong; the
    worker itself is fine to keep (every other failure replaces it). ``out_of_memory``: what
    raised was torch's OutOfMemoryError, which other workers on the device may have caused.
    """

    def __init__(self, reason: str, detail: str = "", wrong_result: bool = False,
                 out_of_memory: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.wrong_result = wrong_result
        self.out_of_memory = out_of_memory

    def prefixed(self, prefix: str) -> CandidateFailure:
        """The same failure with ``prefix`` before its reason."""
        return CandidateFailure(prefix + self.reason, self.detail, self.wrong_result,
                                self.out_of_memory)


class ReferenceFailed(KsError):
    """The task's reference raised on a check's inputs: the task's fault, not the candidate's
    (which is then not judged on them). ``where``: the reference file and line it raised at;
    ``out_of_memory``: it raised torch's OutOfMemoryError (the workers beside it may hold the
    device's memory)."""

    def __init__(self, message: str, where: tuple[str, int], out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.where = where
        self.out_of_memory = out_of_memory


class GateFailure(KsError):
    """A performance gate (``--ks-min-speedup``, ``--ks-max-regression``) was not met."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's OutOfMemoryError (torch not imported here: not that)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ()))
