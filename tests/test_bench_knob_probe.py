"""bench/knob_probe.py, bench/knob_device.sh and bench/variants_device.sh (no GPU needed): a
knob the seed lacks, a variant cuda_sweep.py lacks, a missing old seed, or an old seed that is
not the seed before the change is named before any build or device setup, with the command
that makes the right file; the probe's count of elements outside the task's tolerance counts
C's NaN fill, and its launch table names each kernel by its function."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from helpers import REPO, load_file

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


def test_the_probe_counts_what_the_task_would_fail_and_names_kernels_by_function() -> None:
    probe = load_file(REPO / "bench" / "knob_probe.py", "knob_probe")
    check = probe.load_task(probe.TASK).spec.check  # atol 1e-3, rtol 2e-2
    want = torch.tensor([0.0, 100.0, 100.0, 1.0, 1.0])
    # inside 1e-3; inside 1e-3 + 2e-2 * 100; outside it; C's NaN fill, never written; exact
    got = torch.tensor([0.0009, 101.9, 102.5, float("nan"), 1.0])
    assert probe.outside(got, want, check) == 2
    assert probe.outside(got.to(torch.bfloat16), want, check) == 2  # C's dtype, as the probe
    # the probe's launch table names kernels by cuda_sweep.py's kernel_name
    kernel_name = load_file(REPO / "bench" / "cuda_sweep.py", "cuda_sweep").kernel_name
    assert kernel_name("void gemm_kernel<128, 1>(CUtensorMap_st, float const*)") == (
        "gemm_kernel")
    assert kernel_name("void upcast_beside(unsigned char const*, int)") == "upcast_beside"
    assert kernel_name("Memset (Device)") == "Memset"


def test_the_probe_reads_its_knob_from_the_seed_given_in_the_seeds_place(tmp_path) -> None:
    """--seed: a variant file is probed in the seed's place; its knobs are what count, and a
    file that is not there is named before anything is built."""
    variant = tmp_path / "variant.py"
    variant.write_text("TUNABLES = {'ONLY_HERE': 1}\n")
    proc = _run([sys.executable, "bench/knob_probe.py", "BLOCK_N", "64", "--seed", str(variant)],
                tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"BLOCK_N is not a knob of {variant} (its TUNABLES: ONLY_HERE)" in proc.stderr
    proc = _run([sys.executable, "bench/knob_probe.py", "BLOCK_N", "64", "--seed",
                 str(tmp_path / "gone.py")], tmp_path)
    assert proc.returncode == 2 and "gone.py: no such file" in proc.stderr, proc.stderr
    assert "built in" not in proc.stdout


def test_the_variants_script_refuses_a_name_cuda_sweep_lacks_before_the_device_setup(
        tmp_path) -> None:
    """bench/variants_device.sh: a name that is not one of cuda_sweep.py's VARIANTS is named,
    with the list, before anything is written; without names it says its usage."""
    proc = _run(["bash", "bench/variants_device.sh", "nozero", "no_such_variant"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "variants_device: ['no_such_variant'] not in bench/cuda_sweep.py's VARIANTS" in (
        proc.stderr) and "'nozero'" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    proc = _run(["bash", "bench/variants_device.sh"], tmp_path)
    assert proc.returncode == 2 and "usage: bash bench/variants_device.sh NAME" in proc.stderr
