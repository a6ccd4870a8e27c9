"""Hypothesis-drawn cases (issue 12): a candidate checked on cases drawn from the space its task
declares (``[profiles.X.space]``), a failure shrunk by Hypothesis (to a failing case it could
not make smaller, not always the smallest there is).

The task's fixed cases are public, so a kernel can special-case them; drawn cases are not known
before the run. Draws are derandomised from the session's salt (``--ks-salt`` reproduces them);
each drawn case is checked exactly like a fixed one (``Evaluator.check``: fresh secret inputs,
then the re-run with changed elements). Runs in the pytest process; imports Hypothesis only
when a drawn check runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.formats.task import Case, Space

DRAWN_SEED = 1  # the public seed of drawn cases; inputs mix in the secret salt as always


def describe(case: Case) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items() if k != "seed")


def falsify(space: Space, case_keys: list[str], check: Callable[[Case], None], salt: int,
            examples: int) -> tuple[Case, CandidateFailure, bool] | None:
    """Check ``examples`` drawn cases; None when all pass, else (the failing case Hypothesis
    shrank to, its failure, whether it failed again when replayed)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st
    from hypothesis.reporting import with_reporter

    spans = {
        key: st.integers(span.first() // span.multiple_of, span.max // span.multiple_of).map(
            lambda v, m=span.multiple_of: v * m)
        for key, span in space.keys.items()
    }
    failures: list[tuple[Case, CandidateFailure]] = []

    @seed(salt)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink])
    @given(st.fixed_dictionaries(spans))
    def run(drawn: dict[str, Any]) -> None:
        case = {k: (DRAWN_SEED if k == "seed" else drawn[k]) for k in case_keys}
        try:
            check(case)
        except CandidateFailure as exc:
            failures.append((case, exc))
            raise

    try:
        with with_reporter(lambda _: None):
            run()
    except CandidateFailure:
        case, exc = failures[-1]  # Hypothesis replays the shrunk failing case last
        return case, exc, True
    except Exception:  # noqa: BLE001 - Hypothesis' Flaky: a failure that did not come back
        if not failures:
            raise
        case, exc = min(failures, key=lambda f: sorted(f[0].items()))
        return case, exc, False
    return None
