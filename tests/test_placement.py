"""``[bench] placement`` (issue 31): on a GPU, each timed call's data behind a spacer of a
random size, so one worker times a kernel over many placements in memory."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import AXPY

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.evaluate import PLACE_MIN, PLACE_STEP, PLACE_STEPS, Evaluator
from pytest_kscientist.harness.spawn import Worker


def _axpy(tmp_path: Path, bench_line: str = "") -> Path:
    task = tmp_path / "axpy"
    shutil.copytree(AXPY, task)
    spec = task / "task.toml"
    spec.write_text(spec.read_text().replace("[bench]\n", f"[bench]\n{bench_line}\n"))
    return task


def test_spacers_vary_on_a_gpu_only_and_not_when_fixed(tmp_path: Path) -> None:
    task = load_task(AXPY)
    assert task.spec.bench.placement == "vary"
    assert {Evaluator(task, "cpu", salt=1).place_bytes() for _ in range(20)} == {0}
    sizes = [Evaluator(task, "cuda:0", salt=1).place_bytes() for _ in range(200)]
    assert len(set(sizes)) > 190
    top = PLACE_MIN + PLACE_STEP * PLACE_STEPS
    assert all(PLACE_MIN <= s < top and s % PLACE_STEP == 0 for s in sizes)
    fixed = load_task(_axpy(tmp_path, 'placement = "fixed"'))
    assert {Evaluator(fixed, "cuda:0", salt=1).place_bytes() for _ in range(20)} == {0}


def test_an_unknown_placement_is_named(tmp_path: Path) -> None:
    task = _axpy(tmp_path, 'placement = "random"')
    with pytest.raises(TaskSpecError, match=re.escape("field 'bench.placement'")) as err:
        load_task(task)
    assert "'vary' or 'fixed'" in str(err.value)


RECORDER = """
import torch

_seen = set()
_calls = [0]


def custom_kernel(data):
    x, y, out = data
    _seen.add((x.data_ptr(), out.data_ptr()))
    _calls[0] += 1
    if _calls[0] == 12:
        raise RuntimeError(f"placements {len(_seen)}")
    torch.add(y, x, alpha=2, out=out)
    return out
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
@pytest.mark.parametrize(("place", "fewest", "most"), [(True, 8, 12), (False, 1, 2)])
def test_the_worker_moves_each_calls_data_by_its_spacer(
        tmp_path: Path, place: bool, fewest: int, most: int) -> None:
    """Twelve calls of one case: behind spacers the kernel meets its inputs and output at
    (nearly) twelve places, without them at the one or two the caching allocator repeats."""
    kernel = tmp_path / "recorder.py"
    kernel.write_text(RECORDER)
    task = load_task(AXPY)
    evaluator = Evaluator(task, "cuda:0", salt=1)
    worker = Worker(task.describe(), "cuda:0", task.spec.output_index, 120.0)
    try:
        worker.request("load", path=str(kernel), entry="custom_kernel")
        header: dict = {}
        for seed in range(12):
            header, _ = worker.request("call", case={"n": 1 << 20, "seed": 1}, seed=seed,
                                       place=evaluator.place_bytes() if place else 0)
    finally:
        worker.close()
    found = re.search(r"placements (\d+)", str(header.get("reason")))
    assert found, header
    assert fewest <= int(found.group(1)) <= most, header
