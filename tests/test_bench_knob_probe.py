"""bench/knob_probe.py, bench/knob_device.sh and bench/variants_device.sh (no GPU needed): a
knob the seed lacks, a variant cuda_sweep.py lacks, a missing old seed, or an old seed that is
not the seed before the change is named before any build or device setup, with the command
that makes the right file; the probe's count of elements outside the task's tolerance counts
C's NaN fill, and its launch table names each kernel by its function; seed_rounds.sh's
seed_test_as runs the seed's GPU test on a variant and puts the seed back."""

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


def test_seed_test_as_runs_the_seeds_gpu_test_on_the_variant_and_puts_the_seed_back(
        tmp_path) -> None:
    """bench/seed_rounds.sh's seed_test_as (variants_device.sh's step e): while the seed's GPU
    test runs, the seed's file is the variant under the seed's build name; afterwards the seed
    is back, whether the test passed or failed, and the test's status is the function's."""
    seed = tmp_path / "repo" / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
    seed.parent.mkdir(parents=True)
    seed.write_text('X = "seed"\n        name="ks_cuda_wgmma_v8",\n')
    variant = tmp_path / "cuda_wgmma_skew.py"
    variant.write_text('X = "skew"\n        name="ks_skew_v8",\n')
    fake = tmp_path / "bin" / "python3"  # stands for `python3 -m pytest ...` on a GPU
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\ncp tasks/fp8_gemm/seeds/cuda_wgmma.py "$OUT/seen.py"\n'
                    'echo "$*"\nexit "$FAKE_RC"\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    for rc in (0, 1):
        env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "OUT": str(out),
               "FAKE_RC": str(rc)}
        proc = subprocess.run(
            ["bash", "-c", f"source {REPO}/bench/seed_rounds.sh && seed_test_as {variant} skew"],
            cwd=seed.parents[3], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == rc, proc.stdout + proc.stderr
        assert (out / "seen.py").read_text() == 'X = "skew"\n        name="ks_cuda_wgmma_v8",\n'
        assert seed.read_text() == 'X = "seed"\n        name="ks_cuda_wgmma_v8",\n'
        assert f"seed test as skew rc {rc}" in proc.stdout, proc.stdout
        assert "tests/test_cuda_seed.py -m gpu" in (out / "seed_test_skew.log").read_text()
