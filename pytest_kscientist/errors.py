"""Typed errors of the harness. Messages name the subject, the expectation, the finding, the fix."""

from __future__ import annotations


class KsError(Exception):
    """Base class of pytest-kscientist errors."""


class TaskSpecError(KsError):
    """A task folder or its spec file is invalid."""


class ChannelError(KsError):
    """A worker message was missing, truncated, out of order or not authentic."""


class CandidateFailure(KsError):
    """A candidate's verdict on one case is a failure: a one-line reason plus detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class GateFailure(KsError):
    """A performance gate (``--ks-min-speedup``, ``--ks-max-regression``) was not met."""
