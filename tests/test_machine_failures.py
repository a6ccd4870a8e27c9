"""A worker that does not start on the machine, before any candidate code ran (CUDA out of
memory at the device's context on a shared GPU, the timer's scratch): not a verdict on the
kernel, in a session or in ``--evolve``.

The failure is injected where a GPU's would come from: a ``sitecustomize`` on the workers'
``PYTHONPATH`` makes the timer's construction raise what torch raises when a device's memory is
taken, in every process that runs the worker's start.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import session_server
import torch
from helpers import PYTEST, REPO, run_pytest

AXPY = REPO / "tests" / "data" / "axpy"
OOM = "CUDA error: out of memory"
SITECUSTOMIZE = f"""
import pytest_kscientist.worker.timing as timing


def _no_memory(device, after_call=None):
    raise RuntimeError({OOM!r} + " (another process holds the device's memory)")


timing.make_timer = _no_memory
"""


def _broken_machine(tmp_path: Path) -> dict[str, str]:
    """The environment of a session whose workers cannot start."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH"))
                           if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_worker_that_does_not_start_fails_its_items_as_not_judged(
        tmp_path: Path, xdist: list[str]) -> None:
    """Under xdist too: the controller's results hear of it from the items' reports."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    code, output, data = run_pytest(
        ["axpy", "--ks-device", "cpu", "--ks-skip-reference", "--ks-baselines", "none",
         "-k", "good and (check or bench)", *xdist], cwd=tmp_path,
        env=_broken_machine(tmp_path))
    assert code == 1, output[-3000:]
    assert data is not None, output[-3000:]
    cases = [case for c in data["candidates"] for case in c["cases"]]
    assert cases and all(case["outcome"] == "failed" for case in cases)
    # Not the kernel's load failing: its first item says whose failure it was, and why.
    first = cases[0]["reason"]
    assert first.startswith("not judged: the worker did not start, and no candidate code had "
                            "run: the machine failed (or the task's own modules), not the "
                            "kernel: cpu: "), first
    assert OOM in first and "failed to load" not in first
    assert data["machine_failures"] and OOM in data["machine_failures"][0]
    assert "the machine failed: a worker did not start: cpu: RuntimeError" in output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
def test_a_gpu_worker_that_does_not_start_is_not_judged_either(tmp_path: Path) -> None:
    """On a GPU the runners start ahead (in collection, and spares): the same verdict."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    code, output, data = run_pytest(
        ["axpy", "--ks-device", "cuda", "--ks-skip-reference", "--ks-baselines", "none",
         "-k", "good and (check or bench)"], cwd=tmp_path, env=_broken_machine(tmp_path))
    assert code == 1 and data is not None, output[-3000:]
    reasons = [case["reason"] for c in data["candidates"] for case in c["cases"]]
    assert reasons and all(r.startswith("not judged: the worker did not start") for r in reasons)
    assert data["machine_failures"] and "cuda:0: RuntimeError: " + OOM in data[
        "machine_failures"][0]


def test_evolve_stops_on_a_machine_failure_and_records_no_kernel_as_failed(
        tmp_path: Path) -> None:
    task = tmp_path / "axpy"
    task.mkdir()
    for name in ("task.toml", "reference.py"):
        shutil.copy(AXPY / name, task / name)
    (task / "seeds").mkdir()
    shutil.copy(AXPY / "seeds" / "good.py", task / "seeds" / "good.py")
    proc = session_server.run(
        [*PYTEST, "--evolve", "1", "axpy", "--ks-llm", "offline", "--ks-profile", "cpu"],
        cwd=tmp_path, env=_broken_machine(tmp_path), timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output[-3000:]
    assert "the machine failed in the child session, so its kernels were not recorded" in output
    assert "run the same command again" in output
    root = tmp_path / "population" / "axpy"
    assert not list(root.glob("c*/results.json")), "a kernel was recorded as evaluated"
    stops = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "evaluation_failed" and OOM in e["data"]["error"] for e in stops)
