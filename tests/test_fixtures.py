"""The public fixtures work from a user's own test file."""

from __future__ import annotations

import pytest
from helpers import AXPY, CANDIDATES


def test_users_own_tests_with_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine=f"""
        def test_good_passes_and_wrong_fails(ks_load_task, ks_evaluate, ks_device):
            task = ks_load_task({str(AXPY)!r})
            case = task.profile("cpu").tests[1]
            good = ks_evaluate(task, {str(AXPY / "seeds" / "good.py")!r}, "check", case)
            assert good.outcome == "passed", good.reason
            bad = ks_evaluate(task, {str(CANDIDATES / "wrong.py")!r}, "check", case)
            assert bad.outcome == "failed"
            assert bad.reason.startswith("wrong result: 33 of 33 elements")
            bench = ks_evaluate(task, {str(AXPY / "seeds" / "good.py")!r}, "bench",
                                task.profile("cpu").benchmarks[0])
            assert bench.outcome == "passed" and bench.stats.runs >= 5
            assert ks_device == "cpu"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py")
    result.assert_outcomes(passed=1)
