"""bench/knob_probe.py and bench/knob_device.sh (no GPU needed): a knob the seed lacks, a
missing old seed, or an old seed that is not the seed before the change is named before any
build or device setup, with the command that makes the right file."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO

SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"


def _run(cmd: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path / "out")}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_probe_names_a_knob_the_seed_lacks_before_building(tmp_path) -> None:
    proc = _run([sys.executable, "bench/knob_probe.py", "NO_SUCH_KNOB", "0", "1"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("NO_SUCH_KNOB is not a knob of tasks/fp8_gemm/seeds/cuda_wgmma.py (its TUNABLES: "
            "BLOCK_N, ") in proc.stderr, proc.stderr
    assert "built in" not in proc.stdout  # nothing was built


def test_the_probe_names_a_missing_old_seed_with_the_command_that_writes_it(tmp_path) -> None:
    missing = tmp_path / "old_seed.py"
    proc = _run([sys.executable, "bench/knob_probe.py", "BLOCK_N", "64", "128", "--old",
                 str(missing)], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--old {missing}: no such file" in proc.stderr, proc.stderr
    assert "git show HEAD:tasks/fp8_gemm/seeds/cuda_wgmma.py" in proc.stderr, proc.stderr


def test_the_device_script_refuses_an_old_seed_that_is_not_the_one_before(tmp_path) -> None:
    """The seed as it is (it has BLOCK_N) and a file without the seed's build name are both
    refused, before the device setup writes anything."""
    stranger = tmp_path / "other.py"
    stranger.write_text("TUNABLES = {}\n")
    for knob, old in [("BLOCK_N", SEED), ("NEW_KNOB", stranger)]:
        proc = _run(["bash", "bench/knob_device.sh", knob, "0 1", str(old)], tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"knob_device: {old} is not the seed before the change" in proc.stdout, proc.stdout
        assert not (tmp_path / "out").exists()
    proc = _run(["bash", "bench/knob_device.sh"], tmp_path)
    assert proc.returncode != 0 and "usage: bash bench/knob_device.sh KNOB" in proc.stderr
