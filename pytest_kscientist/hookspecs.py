"""Hook specifications of pytest-kscientist (registered by ``plugin.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_kscientist.evolve.roles import Designer, Selector, Writer


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_selector(config: pytest.Config, task: Any) -> Selector | None:
    """Return the selector role for ``--evolve`` (stage 1), or None to leave it to others.

    The first non-None result wins; the built-in fallback is the LLM selector when a provider is
    configured, else the offline selector.
    """


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_designer(config: pytest.Config, task: Any) -> Designer | None:
    """Return the experiment designer role (stage 2), or None; first non-None result wins."""


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_writer(config: pytest.Config, task: Any) -> Writer | None:
    """Return the kernel writer role (stage 3), or None; first non-None result wins."""


def pytest_kscientist_candidate_result(config: pytest.Config, result: Any) -> None:
    """Called in the controller with each candidate's ``CandidateResult`` after the session."""
