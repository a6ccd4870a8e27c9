"""What a candidate prints reaches its items' reports, as pytest shows a test's own prints.

Its worker's stdout and stderr went to a log read only when the worker died, so a kernel
developer's `print` in `custom_kernel` was never seen, not even under the failure it was added
to explain.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from xml.etree import ElementTree

from helpers import AXPY, SESSION, run_pytest

WRONG_AND_CHATTY = '''
import sys
print("importing the kernel")

def custom_kernel(data):
    x, y, out = data
    print(f"n={x.numel()} first={float(x[0]):.3f}")
    print("to stderr", file=sys.stderr)
    out.copy_(2 * x + y + (1 if x.numel() == 33 else 0))
    return out
'''

FLOOD = '''
def custom_kernel(data):
    x, y, out = data
    print("x" * 5000)
    out.copy_(2 * x + y)
    return out
'''


def test_a_candidates_prints_are_shown_under_its_failure_and_with_rP(tmp_path: Path) -> None:
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "chatty.py").write_text(WRONG_AND_CHATTY)
    code, output, _ = run_pytest(["axpy", "--kernel", "chatty.py", "--ks-bench-budget", "0.1",
                                  "--ks-baselines", "none", "--junitxml", "junit.xml",
                                  "-o", "junit_logging=all"], cwd=tmp_path)
    assert code == 1, output
    failure = output.split("___ chatty::check[n33-s2] ___", 1)[1].split("\n___", 1)[0]
    # Each stream under its own section; stderr was shown as stdout, one log holding both.
    stdout, stderr = _section(failure, "stdout"), _section(failure, "stderr")
    assert stdout.startswith("| n=33 first=") and "to stderr" not in stdout, failure
    assert stderr.strip() == "| to stderr", failure
    assert "n=1000" not in failure  # each item shows what was printed during it
    passed = output.split("___ chatty::check[n1000-s1] ___", 1)[1].split("\n___", 1)[0]
    assert "importing the kernel" in passed and "n=1000 first=" in passed, output
    junit = ElementTree.parse(tmp_path / "junit.xml").getroot()
    check = next(case for case in junit.iter("testcase") if case.get("name") == "check[n33-s2]")
    assert "n=33 first=" in (check.findtext("system-out") or ""), ElementTree.tostring(check)
    assert "to stderr" not in (check.findtext("system-out") or "")
    assert "to stderr" in (check.findtext("system-err") or ""), ElementTree.tostring(check)


def _section(failure: str, stream: str) -> str:
    """The text of a failure's "Captured <stream> call" section ("" when it has none)."""
    parts = re.split(r"\n-+ Captured (\w+) call -+\n", failure)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    return re.split(r"\n[-=]{8}", found.get(stream, ""), maxsplit=1)[0]  # to the next rule


def test_what_a_candidate_printed_before_it_raised_is_shown_under_its_failure(
        tmp_path: Path) -> None:
    """A raising candidate's worker is dropped (a fresh one for the next item) before its
    item's report was made, and what it had printed was never shown."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "loud.py").write_text(
        "import sys\n\ndef custom_kernel(data):\n    print('about to raise')\n"
        "    print('raising now', file=sys.stderr)\n    raise RuntimeError('boom')\n")
    code, output, _ = run_pytest(["axpy", "--kernel", "loud.py", "--ks-baselines", "none",
                                  "-k", "loud and check"], cwd=tmp_path)
    assert code == 1, output
    for case in ("n1000-s1", "n33-s2"):  # the second in the fresh worker the first left
        failure = output.split(f"___ loud::check[{case}] ___", 1)[1].split("\n___", 1)[0]
        assert _section(failure, "stdout").strip() == "| about to raise", failure
        assert _section(failure, "stderr").strip() == "| raising now", failure


def test_a_flood_of_prints_is_cut_to_its_head_and_tail(tmp_path: Path) -> None:
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "flood.py").write_text(FLOOD)
    code, output, _ = run_pytest(["axpy", "--kernel", "flood.py", "--ks-bench-budget", "0.1",
                                  "--ks-baselines", "none"], cwd=tmp_path)
    assert code == 0, output
    bench = output.split("___ flood::bench[n4096-s3] ___", 1)[1].split("\n___", 1)[0]
    assert "bytes left out ..." in bench, bench
    assert len(bench) < 12_000, len(bench)  # uncut: 5000 characters a call, 20 calls or more


HANGS = '''
import time

def custom_kernel(data):
    print("started", flush=True)
    time.sleep(1000)
'''


def _in_sleep(root: int) -> bool:
    """Whether a process below ``root`` is in a sleep of the kernel's (``time.sleep``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += children.get(pid, [])
    for pid in seen[1:]:
        try:
            if "nanosleep" in Path(f"/proc/{pid}/wchan").read_text():
                return True
        except OSError:
            continue
    return False


def test_ctrl_c_during_a_busy_kernel_ends_the_session_at_once(tmp_path: Path) -> None:
    """Ctrl-C while a kernel was busy waited 10 s for its worker to read a request to exit it
    could not read (a second Ctrl-C in that wait ended in a traceback). Now the workers of an
    interrupted session are killed at once."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "hangs.py").write_text(HANGS)
    proc = subprocess.Popen(
        [*SESSION, "axpy", "--kernel", "hangs.py", "--ks-timeout", "600",
         "--ks-baselines", "none", "-p", "no:cacheprovider", "-k", "hangs or validate",
         "--ks-json", "cut.json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not _in_sleep(proc.pid):
        time.sleep(0.2)
    assert proc.poll() is None and _in_sleep(proc.pid), "the kernel never started its sleep"
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    assert took < 8, (took, out)  # it waited 10 s per busy worker
    # Its results say it was cut short: a gate reading them skipped a kernel they lack, so a
    # cancelled CI job's file switched the gate off.
    saved = json.loads((tmp_path / "cut.json").read_text())
    assert saved["interrupted"] is True, saved
    code, output, _ = run_pytest(["axpy", "--kernel", str(AXPY / "seeds" / "good.py"),
                                  "--ks-baselines", "none", "--ks-bench-budget", "0.05",
                                  "--ks-compare", "cut.json", "--ks-max-regression", "5%"],
                                 cwd=tmp_path)
    assert code == 1, output
    assert "'good' has no result in cut.json, written by a run that was interrupted before " \
        "its items ran" in output, output


def test_a_sub_second_timeout_is_named_as_given(tmp_path: Path) -> None:
    """`--ks-timeout 0.5` was reported as "no answer ... within 0 s"."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "slowk.py").write_text(
        "import time\ndef custom_kernel(data):\n    time.sleep(30)\n")
    code, output, _ = run_pytest(["axpy", "--kernel", "slowk.py", "--ks-timeout", "0.5",
                                  "--ks-baselines", "none", "-k", "slowk and n33"], cwd=tmp_path)
    assert code == 1, output
    assert "no answer to 'check' within 0.5 s (hang?); worker killed" in output, output


def test_a_short_timeout_does_not_fail_a_kernel_for_its_workers_slow_start(
        tmp_path: Path) -> None:
    """The worker's start (torch, the device, the task's modules) had 2 x --ks-timeout: on the
    H100, `--ks-timeout 0.5` failed the kernel with "no answer to 'hello' within 1 s", before
    any of its code ran. Here the task's reference takes 3.5 s to import, past 2 x 1.5 s."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    reference = tmp_path / "axpy" / "reference.py"
    reference.write_text("import time\ntime.sleep(3.5)\n" + reference.read_text())
    (tmp_path / "fine.py").write_text("def custom_kernel(data):\n    x, y, out = data\n"
                                      "    out.copy_(2 * x + y)\n    return out\n")
    code, output, _ = run_pytest(["axpy", "--kernel", "fine.py", "--ks-timeout", "1.5",
                                  "--ks-baselines", "none", "-k", "fine and check and n33"],
                                 cwd=tmp_path)
    assert code == 0, output


def test_tee_sys_shows_a_candidates_prints_as_they_come_and_keeps_them(tmp_path: Path) -> None:
    """--capture=tee-sys passes what a test prints through to the terminal and keeps it in the
    report: a candidate's prints went to the report only, never shown on a passing run."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "loud.py").write_text(
        "import sys\n\ndef custom_kernel(data):\n    x, y, out = data\n"
        "    print('printed by the kernel')\n    print('to stderr', file=sys.stderr)\n"
        "    out.copy_(2 * x + y)\n    return out\n")
    code, output, _ = run_pytest(["axpy", "--kernel", "loud.py", "--ks-baselines", "none",
                                  "-k", "loud and check and n33", "--capture=tee-sys",
                                  "--junitxml", "junit.xml", "-o", "junit_logging=all"],
                                 cwd=tmp_path)
    assert code == 0, output
    live = output.split("==== PASSES ====")[0]  # run_pytest passes -rA
    assert "| printed by the kernel" in live, output
    after = output.rsplit("passed, 4 deselected", 1)[1]  # the session's stderr, after stdout
    assert "| to stderr" in after, output
    junit = ElementTree.parse(tmp_path / "junit.xml").getroot()
    check = next(case for case in junit.iter("testcase") if case.get("name") == "check[n33-s2]")
    assert "printed by the kernel" in (check.findtext("system-out") or ""), output
    assert "to stderr" in (check.findtext("system-err") or ""), output
