"""Hook specifications of pytest-kscientist (registered by ``plugin.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_kscientist.evolve.roles import Designer, Selector, TaskBrief, Writer
    from pytest_kscientist.harness.results import CandidateResult


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_selector(config: pytest.Config, task: TaskBrief) -> Selector | None:
    """Return the selector role for ``--evolve`` (stage 1), or None to leave it to others.

    :param config: the pytest config of the ``--evolve`` run.
    :param task: the brief the roles get: name, description, reference source, hardware and
        benchmark ids as last measured (``pytest_kscientist.evolve.roles.TaskBrief``).

    Called once per run, after the seeds are measured. Stops at the first non-None result. The
    built-in scientists are ``trylast`` implementations: the LLM selector when a provider is
    configured, else the offline one. The result must implement the ``Selector`` protocol of
    ``pytest_kscientist.evolve.roles`` (a ``select`` method).
    """


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_designer(config: pytest.Config, task: TaskBrief) -> Designer | None:
    """Return the experiment designer role (stage 2), or None to leave it to others.

    Parameters, call and fallback as for ``pytest_kscientist_make_selector``; the result must
    implement the ``Designer`` protocol (a ``design`` method).
    """


@pytest.hookspec(firstresult=True)
def pytest_kscientist_make_writer(config: pytest.Config, task: TaskBrief) -> Writer | None:
    """Return the kernel writer role (stage 3), or None to leave it to others.

    Parameters, call and fallback as for ``pytest_kscientist_make_selector``; the result must
    implement the ``Writer`` protocol (a ``write`` method).
    """


def pytest_kscientist_candidate_result(config: pytest.Config, result: CandidateResult) -> None:
    """Called once per candidate in the controller process after the session, with its
    ``CandidateResult`` (cases, geomean, speedups, gates): the place to export results.

    :param config: the pytest config.
    :param result: ``pytest_kscientist.harness.results.CandidateResult``, fully scored.
    """
