"""The public fixtures work from a user's own test file."""

from __future__ import annotations

import shutil

import pytest
from helpers import AXPY, CANDIDATES, DATA


def test_users_own_tests_with_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine=f"""
        import pytest


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

        def test_calls_that_cannot_mean_anything_raise(ks_load_task, ks_evaluate):
            task = ks_load_task({str(AXPY)!r})
            case = task.profile("cpu").tests[1]
            good = {str(AXPY / "seeds" / "good.py")!r}
            with pytest.raises(ValueError, match="kind must be 'check' or 'bench', got 'checks'"):
                ks_evaluate(task, good, "checks", case)
            with pytest.raises(ValueError, match="lacks seed"):
                ks_evaluate(task, good, "check", {{"n": 8}})
            with pytest.raises(FileNotFoundError, match="no candidate file at nowhere.py"):
                ks_evaluate(task, "nowhere.py", "check", case)
        """
    )
    # Its test asks for the cpu profile and asserts ks_device == "cpu".
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py",
                                           "--ks-device", "cpu")
    result.assert_outcomes(passed=2)


def test_a_task_given_by_a_relative_path_or_its_task_toml(pytester: pytest.Pytester) -> None:
    """Workers run in a folder of their own: a relative task path reached them as it was, and
    every candidate failed as the task's fault (no axpy/reference.py there); a task.toml path,
    as pytest's node ids name it, raised NotADirectoryError."""
    shutil.copytree(AXPY, pytester.path / "axpy")
    pytester.makepyfile(
        test_mine="""
        import pytest

        from pytest_kscientist.errors import TaskSpecError


        @pytest.mark.parametrize("path", ["axpy", "axpy/task.toml"])
        def test_relative(ks_load_task, ks_evaluate, path):
            task = ks_load_task(path)
            result = ks_evaluate(task, "axpy/seeds/good.py", "check", {"n": 8, "seed": 1})
            assert result.outcome == "passed", result.reason

        def test_another_file(ks_load_task):
            with pytest.raises(TaskSpecError, match="is none of the tasks collection claims"):
                ks_load_task("axpy/reference.py")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py")
    result.assert_outcomes(passed=3)


def test_gpu_mode_and_kernelbench_tasks_load_as_collection_claims_them(
        pytester: pytest.Pytester) -> None:
    """ks_load_task read task.toml only: a GPU MODE folder (or its task.yml) and a KernelBench
    problem file, which `pytest PATH` collects, failed with "no task spec here"."""
    shutil.copytree(DATA / "formats", pytester.path / "formats")
    pytester.makepyfile(
        test_mine="""
        import pytest

        GPUMODE = "formats/gpumode/cpu/scale_py"
        RELU = "formats/kernelbench/level1/2_ReLU.py"


        @pytest.mark.parametrize("path", [GPUMODE, GPUMODE + "/task.yml"])
        def test_gpumode(ks_load_task, ks_evaluate, path):
            task = ks_load_task(path)
            case = task.profile("cpu").tests[0]
            good = ks_evaluate(task, GPUMODE + "/solutions/correct/torch_ops.py", "check", case)
            assert good.outcome == "passed", good.reason
            bad = ks_evaluate(task, GPUMODE + "/solutions/wrong/no_square.py", "check", case)
            assert bad.outcome == "failed"

        def test_kernelbench(ks_load_task, ks_evaluate):
            task = ks_load_task(RELU)
            case = task.profile("cpu").tests[0]
            result = ks_evaluate(task, "formats/kernelbench/solutions/2_ReLU/clamp.py", "check",
                                 case)
            assert result.outcome == "passed", result.reason
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py")
    result.assert_outcomes(passed=3)


def test_a_candidate_this_device_cannot_run_is_skipped_as_its_items_are(
        pytester: pytest.Pytester) -> None:
    """ks_evaluate ran a KS_REQUIRES = "sm_90" kernel on the CPU (its collected items skip),
    and returned that run's verdict; a wrong declaration (its items fail) was not read."""
    pytester.makepyfile(
        sm90="KS_REQUIRES = 'sm_90'\n\ndef custom_kernel(data):\n    x, y, out = data\n"
             "    out.copy_(2 * x + y)\n    return out\n",
        typo="KS_REQUIRES = 'sm_9x'\n\ndef custom_kernel(data):\n    return data[2]\n",
        test_mine=f"""
        def test_requires(ks_load_task, ks_evaluate, ks_device):
            task = ks_load_task({str(AXPY)!r})
            case = task.profile("cpu").tests[1]
            skipped = ks_evaluate(task, "sm90.py", "check", case)
            assert skipped.outcome == "skipped", skipped
            assert skipped.reason.startswith("candidate 'sm90' requires sm_90 ("), skipped
            assert skipped.reason.endswith(f"this run's device is {{ks_device}}; run it on "
                                           "such a device"), skipped
            wrong = ks_evaluate(task, "typo.py", "check", case)
            assert wrong.outcome == "failed" and "KS_REQUIRES names" in wrong.reason, wrong
        """,
    )
    # On the CPU, which sm_90 is not (an H100 runs it).
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_mine.py",
                                           "--ks-device", "cpu")
    result.assert_outcomes(passed=1)
