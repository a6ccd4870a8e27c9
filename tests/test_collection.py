"""Collection: ids name the candidate and the case, -k picks either, seeds are the default."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from xml.etree import ElementTree

import pytest
import session_server
from helpers import AXPY, CANDIDATES, REPO, SESSION, run_pytest


def test_ids_name_candidate_kind_and_case(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "--collect-only", "-q")
    # The task's validation, every check, then each case's bench items back to back (timed
    # in shared rounds).
    result.stdout.fnmatch_lines([
        "*axpy/task.toml::task::validate",
        "*axpy/task.toml::good::check[[]n1000-s1[]]",
        "*axpy/task.toml::good::check[[]n33-s2[]]",
        "*axpy/task.toml::reference::bench[[]n4096-s3[]]",
        "*axpy/task.toml::good::bench[[]n4096-s3[]]",
        "5 tests collected*",
    ])


def test_skip_reference_leaves_the_reference_out(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "-q", "--ks-skip-reference")
    result.assert_outcomes(passed=4)  # good's three items and the task's validation
    text = result.stdout.str()
    assert "::reference::" not in text and "reference (reference)" not in text
    assert "reference not timed (--ks-skip-reference): no speedup_vs_ref" in text


def test_kernel_option_replaces_the_seeds(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        str(AXPY), "--collect-only", "-q", "--kernel", str(CANDIDATES / "wrong.py"),
        "--kernel", str(CANDIDATES / "raises.py"),
    )
    text = result.stdout.str()
    assert "::wrong::check[n33-s2]" in text and "::raises::bench[n4096-s3]" in text
    assert "::good::" not in text


@pytest.mark.parametrize(
    ("expr", "count"), [("good", 3), ("n33", 1), ("bench", 2), ("check and n1000", 1)]
)
def test_k_selects_by_candidate_kind_or_case(pytester: pytest.Pytester, expr: str, count: int):
    result = pytester.runpytest(str(AXPY), "--collect-only", "-q", "-k", expr)
    result.stdout.fnmatch_lines([f"{count}/5 tests collected*"])


def test_a_kernel_given_by_a_symlink_is_named_after_the_link(pytester: pytest.Pytester) -> None:
    """`--kernel link.py` (a link to elsewhere/target.py) was named 'target', its link resolved
    before its stem was taken, so `-k link` selected nothing. Now it is named by the path
    given, and its worker runs the target's code."""
    (pytester.path / "elsewhere").mkdir()
    shutil.copy(AXPY / "seeds" / "good.py", pytester.path / "elsewhere" / "target.py")
    (pytester.path / "link.py").symlink_to(pytester.path / "elsewhere" / "target.py")
    result = pytester.runpytest(str(AXPY), "-q", "--kernel", "link.py", "-k", "link and check",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)  # before: 0 selected
    collected = pytester.runpytest(str(AXPY), "--collect-only", "-q", "--kernel", "link.py")
    assert "::link::check[n33-s2]" in collected.stdout.str(), collected.stdout.str()
    assert "::target::" not in collected.stdout.str(), collected.stdout.str()


def test_population_is_not_collected(pytester: pytest.Pytester) -> None:
    import shutil

    shutil.copytree(AXPY, pytester.path / "population" / "axpy")
    pytester.makeconftest("collect_ignore = ['population']\n")
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_passing_run_exit_code_junit_and_summary(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "--junitxml=junit.xml", "-v"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*::good::check[[]n1000-s1[]] PASSED*",
        "*kscientist summary*",
        "*candidate*passed*failed*geomean_us*speedup_vs_ref*",
        "*good*3*0*",
        "*benchmark (median us)*reference*good*floor_us*",
        "*seed salt * (secret, drawn for this run); reproduce with --ks-salt *",
    ])
    junit = (pytester.path / "junit.xml").read_text()
    assert 'tests="5"' in junit
    # Each item's record is a JSON property value (it was a Python repr: {'task': 'axpy', ...}).
    props = [(p.get("name"), p.get("value"))
             for p in ElementTree.fromstring(junit).iter("property")]
    cases = [json.loads(v) for n, v in props if n == "ks_case"]
    assert len(cases) == 4 and {c["candidate"] for c in cases} == {"good", "reference"}, props
    bench = next(c["result"] for c in cases if c["result"]["kind"] == "bench")
    assert bench["stats"]["median_us"] > 0 and bench["case_id"] == "n4096-s3"
    assert all(json.loads(v)["task"] == "axpy" for n, v in props if n == "ks_item")


@pytest.mark.parametrize(("stem", "select", "line", "message"), [
    ("wrong", "wrong and check", 1,
     "wrong result: 33 of 33 elements outside |out-ref| <= 1e-06 + 1e-06*|ref|"),
    ("raises", "raises and n33", 2, "RuntimeError: boom from the kernel"),
])
def test_tb_line_prints_each_failure_once_at_the_candidates_line(
        pytester: pytest.Pytester, stem: str, select: str, line: int, message: str) -> None:
    """`--tb=line` printed a failure's whole text and then its first 50 characters again, and
    pointed at `def custom_kernel` (line 1 of raises.py), not at the `raise` on line 2 that
    failed; a wrong result has no raising line: its kernel's `def`."""
    kernel = CANDIDATES / f"{stem}.py"
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "--kernel", str(kernel), "--tb=line",
        "-k", select)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    lines = [text for text in out.splitlines()
             if f"{stem} check n33-s2" in text and not text.startswith("FAILED ")]  # -r in CI
    assert lines == [f"{kernel}:{line}: {stem} check n33-s2: {message}"], out
    assert "first: (0,)" not in out  # the detail lines stay out of the line style


def test_the_raising_line_is_the_innermost_frame_in_the_file_of_the_last_exception() -> None:
    from pytest_kscientist.harness.failures import raised_line

    kernel = Path("/k/kernel.py")
    detail = ('Traceback (most recent call last):\n'
              '  File "/k/kernel.py", line 4, in custom_kernel\n'
              'KeyError: 1\n\n'
              'During handling of the above exception, another exception occurred:\n\n'
              'Traceback (most recent call last):\n'
              '  File "/k/kernel.py", line 9, in custom_kernel\n'
              '  File "/k/kernel.py", line 12, in helper\n'
              '  File "/site/torch/functional.py", line 80, in add\n'
              'RuntimeError: no\n')
    assert raised_line(detail, kernel) == 12
    assert raised_line(detail, Path("/k/other.py")) is None
    assert raised_line("wrong result: 3 of 33 elements", kernel) is None


def test_a_seed_whose_stem_holds_a_bracket_is_a_collection_error(
        pytester: pytest.Pytester) -> None:
    """pytest cannot take back a node id like `task.toml::k[1]::check[...]` (its first '[' opens
    the last part's parameters): a seed named so is refused with the rename, not collected."""
    task = pytester.path / "axpy"
    shutil.copytree(AXPY, task)
    shutil.copy(task / "seeds" / "good.py", task / "seeds" / "k[1].py")
    result = pytester.runpytest_subprocess(str(task), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        f"task 'axpy': candidate {task}/seeds/k[[]1[]].py: the file's stem 'k[[]1[]]' names its "
        "test items *; rename the file without '[[]' and '[]]'"])


def test_exitfirst_stops_at_the_first_failure(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "-x", "--kernel", str(CANDIDATES / "wrong.py"),
        "-k", "not reference",
    )
    result.assert_outcomes(passed=1, failed=1)  # the task's validation, then wrong's check
    # x + y for 2x + y: an element with |x| under ~2e-6 is inside the tolerance, and the seeds'
    # salt is drawn per session, so one run in ~650 counts 999 (31 of 20,000 random draws)
    result.stdout.fnmatch_lines(["*wrong check n1000-s1: wrong result: * of 1000 elements*"])


def test_salt_is_reproducible(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "--ks-salt", "1234", "-k", "good and check",
        "--ks-json", "r.json",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*seed salt 1234 (given with --ks-salt)*"])
    assert json.loads((pytester.path / "r.json").read_text())["salt"] == 1234


def test_ks_requires_skips_a_gpu_only_candidate_with_the_reason(pytester: pytest.Pytester) -> None:
    """A hand-written GPU kernel in CPU CI: skipped with why, never failed, never passed."""
    kernel = pytester.path / "cuda_only.py"
    kernel.write_text('KS_REQUIRES = ["nvidia", "sm_90"]\n\n'
                      "def custom_kernel(data):\n    raise RuntimeError('needs CUDA')\n")
    result = pytester.runpytest(str(AXPY), "--ks-device", "cpu", "--kernel", str(kernel),
                                "--kernel", str(AXPY / "seeds" / "good.py"),
                                "--ks-json", "r.json")
    result.assert_outcomes(passed=5, skipped=3)  # good's 4 and the task's validation
    why = ("candidate 'cuda_only' requires nvidia (an NVIDIA GPU, its KS_REQUIRES), this run's "
           "device is cpu; run it on such a device")
    result.stdout.fnmatch_lines([f"  not run: {why}"])
    result.stdout.no_fnmatch_line("  cuda_only *")  # no row of empty numbers in the tables
    # the record says why, so an evolve's child session reports it as not run, not as missing
    by_name = {c["name"]: c for c in json.loads((pytester.path / "r.json").read_text())[
        "candidates"]}
    assert (by_name["cuda_only"]["not_run"], by_name["cuda_only"]["cases"]) == (why, [])


def test_the_items_of_a_kernel_that_declares_its_devices_carry_the_gpu_marker(
        pytester: pytest.Pytester) -> None:
    """`-m "not gpu"`, the usual way to keep GPU work out of a CPU CI job, kept a KS_REQUIRES
    kernel's items (the plugin registered the marker and never set it), and `-m gpu` selected
    nothing; a baseline that requires a device is marked the same way."""
    kernel = pytester.path / "cuda_only.py"
    kernel.write_text('KS_REQUIRES = "cuda"\n\ndef custom_kernel(data):\n    return data[2]\n')
    task = pytester.path / "axpy"
    shutil.copytree(AXPY, task)
    spec = task / "task.toml"
    spec.write_text(spec.read_text() + '\n[[baselines]]\nname = "on_gpu"\nfile = '
                    '"seeds/good.py"\nrequires = ["cuda"]\n')
    args = [str(task), "--ks-device", "cpu", "--kernel", str(kernel), "--kernel",
            str(AXPY / "seeds" / "good.py"), "--co", "-q", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args, "-m", "gpu")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids and all("::cuda_only::" in i or "::on_gpu::" in i for i in ids), ids
    assert {i.split("::")[1] for i in ids} == {"cuda_only", "on_gpu"}, ids
    result = pytester.runpytest(*args, "-m", "not gpu")
    ids = [line for line in result.stdout.lines if "::" in line]
    assert any("::good::" in i for i in ids) and not any(
        "::cuda_only::" in i or "::on_gpu::" in i for i in ids), ids


@pytest.mark.parametrize(("value", "message"), [
    ('"tpu"', "KS_REQUIRES names unknown requirement 'tpu'; expected cuda, nvidia, rocm or "
     "sm_XY (e.g. sm_90)"),
    ("90", "KS_REQUIRES must be a string or a list of strings such as 'sm_90' or "
     "['nvidia', 'sm_90'], got 90"),
])
def test_bad_ks_requires_fails_that_candidates_items_only(pytester: pytest.Pytester, value: str,
                                                          message: str) -> None:
    """A typo in one candidate's declaration is its own failure, as a missing custom_kernel
    is; the task's other candidates still run."""
    kernel = pytester.path / "k.py"
    kernel.write_text(f"KS_REQUIRES = {value}\n\ndef custom_kernel(data):\n    return data[2]\n")
    good = pytester.path / "good.py"
    good.write_text((AXPY / "seeds" / "good.py").read_text())
    result = pytester.runpytest(str(AXPY), "--kernel", str(kernel), "--kernel", str(good),
                                "-k", "check", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, failed=2)  # good's two checks; k's two
    result.stdout.fnmatch_lines([f"k check n1000-s1: candidate {kernel}: k.py:1: {message}"])


def test_a_selection_of_another_profiles_cases_says_so(tmp_path: Path) -> None:
    code, output, _ = run_pytest([str(REPO / "tasks" / "fp8_gemm"), "-k", "m6144",
                                  "--ks-profile", "cpu"], cwd=tmp_path)
    assert code == 5  # pytest's "no tests collected"
    assert ("hint: -k 'm6144' names cases of task 'fp8_gemm' in its profile 'full' (9, e.g. "
            "m6144-n1536-k7168-s6543), not in this run's profile 'cpu'; add --ks-profile full"
            ) in output


def test_another_tools_task_toml_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", task='[task]\nname = "build docs"\n')
    pytester.makepyfile(test_other_tool="def test_docs():\n    assert True\n")
    result = pytester.runpytest()
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1)


def test_a_broken_task_of_ours_is_still_reported(pytester: pytest.Pytester) -> None:
    folder = pytester.mkdir("mytask")
    (folder / "task.toml").write_text('name = "mine"\ncase_keys = ["n"]\n')  # no profiles
    (folder / "reference.py").write_text("")
    result = pytester.runpytest("mytask")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*mytask/task.toml: invalid task spec (1 error(s)):",
                                 "*field 'profiles': Field required"])


def test_ks_json_writes_through_links_and_pipes_and_collect_only_leaves_it(
        tmp_path: Path) -> None:
    """The results were written to a temp file renamed over the path: a symlink became a file,
    a pipe (`--ks-json >(jq ...)`) a file nobody read (a reader hung), a device node a file
    (/dev/full). And `--co` replaced an earlier run's results with `[]`."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    args = ["axpy", "--ks-baselines", "none", "--ks-bench-budget", "0.1"]
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    code, output, _ = run_pytest([*args, "--ks-json", "link.json"], cwd=tmp_path)
    assert code == 0, output
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "target.json").read_text())["task"] == "axpy"

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    code, output, _ = run_pytest([*args, "--ks-json", str(fifo)], cwd=tmp_path)
    reader.join(timeout=30)
    assert code == 0 and fifo.is_fifo(), output
    assert got and json.loads(got[0])["task"] == "axpy", got

    saved = (tmp_path / "target.json").read_text()
    code, output, _ = run_pytest([*args, "--co", "--ks-json", "target.json"], cwd=tmp_path)
    assert code == 0, output
    assert (tmp_path / "target.json").read_text() == saved


def test_stepwise_after_a_fixed_kernel_times_the_reference_too(tmp_path: Path) -> None:
    """`--sw` deselects what came before the last failure as passed, in the order it sees:
    collection's, where the reference's benchmarks precede every candidate's checks, so they
    were skipped unrun and the speedup (and any gate on it) was lost."""

    shutil.copytree(AXPY, tmp_path / "axpy")
    kernel = tmp_path / "k.py"
    kernel.write_text("def custom_kernel(data):\n    x, y, out = data\n    return x + y\n")
    args = [*SESSION, "axpy", "--kernel", "k.py", "--sw", "-rA", "--ks-bench-budget", "0.05"]
    first = session_server.run(args, cwd=tmp_path, timeout=300)
    assert first.returncode != 0 and "FAILED axpy/task.toml::k::check" in first.stdout, \
        first.stdout
    shutil.copy(AXPY / "seeds" / "good.py", kernel)
    again = session_server.run(args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout
    assert "PASSED axpy/task.toml::reference::bench[n4096-s3]" in again.stdout, again.stdout
    row = next(line.split() for line in again.stdout.splitlines()
               if line.strip().startswith("k "))
    assert row[4].endswith("x"), row  # speedup_vs_ref measured, not "-"


def test_a_copy_of_a_task_under_another_folder_name_is_labelled_by_that_folder(
        tmp_path: Path) -> None:
    """A copy ``axpy_v2`` of a native task keeps the ``name`` its task.toml gives; run beside
    the original, its record was labelled ``tasks/axpy``, a folder that is the original's."""
    first, second = tmp_path / "tasks" / "axpy", tmp_path / "tasks" / "axpy_v2"
    for folder in (first, second):
        shutil.copytree(AXPY, folder)
    code, out, data = run_pytest([str(first), str(second), "--ks-bench-budget", "0.05",
                                  "--ks-baselines", "none"], tmp_path)
    assert code == 0, out
    assert [(run["task"], run["task_path"]) for run in data] == [
        ("axpy", str(first)), ("tasks/axpy_v2", str(second))], data
    assert "task tasks/axpy_v2 | profile" in out, out


def test_a_quieter_run_keeps_the_candidate_table_and_leaves_the_rest(
        pytester: pytest.Pytester) -> None:
    """`-q -q` (pytest's quieter still) printed the whole kscientist summary, the per-benchmark
    table and its legends included; now each task's line, its candidate table, what was not
    run and the salt."""
    args = [str(AXPY), "--ks-bench-budget", "0.05", "-p", "no:cacheprovider"]
    full = pytester.runpytest(*args, "-q").stdout.str()
    brief = pytester.runpytest(*args, "-qq").stdout.str()
    for out in (full, brief):
        assert "task axpy | profile" in out and "  good " in out and "seed salt" in out, out
    assert "benchmark (median us)" in full and "task validation: passed" in full, full
    assert "benchmark (median us)" not in brief and "task validation" not in brief, brief


def test_a_node_id_naming_no_candidate_says_where_candidates_come_from(
        pytester: pytest.Pytester) -> None:
    """`pytest axpy/task.toml::wrong` without `--kernel wrong.py` got pytest's bare "not
    found", with no word that candidates come from --kernel or the task's seeds/."""
    shutil.copytree(AXPY, pytester.path / "axpy")
    result = pytester.runpytest("axpy/task.toml::wrong", "-p", "no:cacheprovider", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines([
        "kscientist: axpy/task.toml::wrong: no candidate 'wrong' in this run (it has: task, "
        "reference, good); a kernel file is a candidate when given with --kernel PATH*"])
    found = pytester.runpytest("axpy/task.toml::good", "-p", "no:cacheprovider", "--co")
    assert found.ret == pytest.ExitCode.OK and "kscientist: " not in found.stdout.str()
