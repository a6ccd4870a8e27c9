"""A task run under pytest-xdist (``-n 2``): one task's items in one worker, one salt for all
workers, the results written once by the controller."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import AXPY, case_reasons, run_pytest

GOOD = "def custom_kernel(data):\n    x, y, out = data\n    out.copy_(2 * x + y)\n    return out\n"
# Right but for its first element, which tells the inputs apart in the failure's text.
OFF = ("def custom_kernel(data):\n    x, y, out = data\n    out.copy_(2 * x + y)\n"
       "    out[0] += 1000\n    return out\n")


@pytest.mark.parametrize("dist", ["load", "loadgroup"])
def test_one_tasks_items_run_in_one_worker_and_the_json_is_whole(tmp_path: Path,
                                                                 dist: str) -> None:
    """Before, the items of one task went to both workers (a gate read the one benchmark its
    worker had run), the controller's --ks-json raised KeyError after the run and a worker's
    partial file was left in its place; under --dist loadgroup until 2026-12-05 (each worker
    timed every kernel, both on one device at once, and the gates skipped)."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    for name in ("one", "two", "three", "four"):
        (tmp_path / f"{name}.py").write_text(GOOD)
    code, out, data = run_pytest(
        ["axpy", "-n", "2", "-v", "--dist", dist, "--kernel", "one.py", "--kernel", "two.py",
         "--kernel", "three.py", "--ks-beside", "four.py"], tmp_path)
    assert code == 0, out
    assert "Traceback" not in out and "KeyError" not in out, out
    workers = set(re.findall(r"\[(gw\d+)\] .*PASSED .*axpy/task.toml::", out))
    assert len(workers) == 1, out
    assert data["task_path"] == str(tmp_path / "axpy"), data["task_path"]
    names = {c["name"] for c in data["candidates"]}
    assert names == {"one", "two", "three", "reference"}, names
    assert set(case_reasons(data).values()) == {("passed", "")}
    # The task's baselines, --ks-beside's among them: the controller collects no task, and
    # its summary and JSON had no column and no entry for them.
    assert [b["name"] for b in data["baselines"]] == ["four"], data["baselines"]
    head = next(line for line in out.splitlines() if line.strip().startswith("candidate "))
    assert "vs_four" in head.split(), head


def test_the_printed_salt_reproduces_the_workers_draws(tmp_path: Path) -> None:
    """Each xdist worker drew a salt of its own and the controller printed a third: rerun
    with the printed --ks-salt, a failure read other inputs."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "off.py").write_text(OFF)
    code, out, data = run_pytest(["axpy", "-n", "2", "-k", "check", "--kernel", "off.py"],
                                 tmp_path)
    assert code == 1, out
    salt = re.search(r"reproduce with --ks-salt (\d+)", out).group(1)
    assert data["salt"] == int(salt)
    again_code, again, again_data = run_pytest(["axpy", "-k", "check", "--kernel", "off.py",
                                                "--ks-salt", salt], tmp_path)
    assert again_code == 1, again

    def details(run: dict) -> dict:  # "... first: (0,): got 1001.49, expected 1.48882"
        return {(c["name"], case["case_id"]): case["detail"] for c in run["candidates"]
                for case in c["cases"]}

    assert details(data) == details(again_data)
    assert all("expected" in d for d in details(data).values()), details(data)
