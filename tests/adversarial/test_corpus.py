"""Adversarial corpus: each candidate tries one way to pass the fp8_gemm task without doing the
work (or to escape the harness); each is rejected with its own reason, and honest controls pass.

Two pytest sessions run at once, each over a private copy of the task's CPU profile: one check
case for the attacks a correctness check exposes, one benchmark case for the timing attacks.
Candidates that only the OS sandbox stops run only where the sandbox works.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import PYTEST, REPO, case_reasons

from pytest_kscientist.harness.mounts import protected_paths, sandbox_available
from pytest_kscientist.harness.results import RunResults
from pytest_kscientist.worker.runner import READ_ONLY_HINT

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
CHECK_CASE = "m32-n200-k384-s1236"  # three K blocks and a partial block of B
BENCH_CASE = "m64-n576-k1024-s12346"  # the most work per call of the CPU benchmarks
UNWRITTEN = "NaN where the reference is not: unwritten output?"
RERUN = "re-run in the same input tensors with 4 elements changed: wrong result"
PATCHED = "clocks, synchronisation and the harness's own objects must not be patched"

# candidate -> a substring of its reason on the check case.
CHECK = {
    # not doing the work
    "untouched_output": UNWRITTEN,
    "partial_output": "2304 of 6400 elements outside",
    "skips_k_blocks": "wrong result: ",
    "stale_empty_like": RERUN,
    "mutates_inputs": "modified input 0 in place",
    "zeroes_scales": "modified input 3 in place",
    "returns_input_view": "returned a tensor sharing memory with input 1",
    "aliases_input_memory": "returned a tensor sharing memory with input 1",
    "subclass_always_close": "returned _ks_candidate.AlwaysClose, expected a plain torch.Tensor",
    "lazy_result": "returned _ks_candidate.LazyResult, expected a plain torch.Tensor",
    "meta_tensor": "returned a tensor on meta, expected cpu",
    "expanded_output": "returned an expanded tensor (stride 0",
    # caching
    "cache_data_ptr": RERUN,
    "cache_id": RERUN,
    "cache_version": RERUN,
    "cache_fingerprint": RERUN,
    "cache_dequant_b": RERUN,
    # timing
    "background_thread": "custom_kernel returned while a Python thread it started "
    "('Thread-1 (_fill)', in _fill at background_thread.py:12) was still running",
    "patch_perf_counter": f"failed to load: while importing: replaced time.perf_counter; {PATCHED}",
    "patch_timer_gc": f"failed to load: while importing: replaced timer._now; {PATCHED}",
    "patch_cuda_sync": f"replaced torch.cuda.synchronize; {PATCHED}",
    "patch_cuda_event": f"replaced torch.cuda.Event.elapsed_time; {PATCHED}",
    "patch_harness_class": f"replaced Runner._check_output; {PATCHED}",
    "imports_harness": "imported the harness's own package pytest_kscientist",
    "flag_tf32": "changed the process-wide setting torch.get_float32_matmul_precision() from "
    "'highest' to 'medium'",
    "flag_default_dtype": "changed the process-wide setting torch.get_default_dtype() from "
    "torch.float32 to torch.float16",
    # harness and process
    "frame_snoop": "LookupError: no reference output and no ref_kernel anywhere in this process",
    "seeds_from_env": "LookupError: no seed found in the environment, argv, the working folder "
    "or the request pipe",
    "env_keys": "LookupError: no key, token or secret in the environment",
    "exits_on_import": "failed to load: worker exited with code 0 before answering 'load'",
    "sys_exit": "SystemExit: 0",
    "pytest_skip": "Skipped: kernel not applicable on this device",
    "pytest_xfail": "XFailed: known issue",
    "fake_records": UNWRITTEN,
}
# candidate -> a substring of its reason on the benchmark case.
BENCH = {
    "cache_call_count": "wrong result: ",
    "precompute_seeds": "warm-up call 0: LookupError: no precomputed output: the future seeds "
    "were not visible",
    "work_after_clock": "timing disagrees with what the pytest process measures from outside",
    "rewrites_clock_reading": "impossible time: fastest call",
}
# Stopped by the OS sandbox (check case); without it these attacks succeed (README).
SANDBOXED = {
    "writes_project": "OSError: [Errno 30] Read-only file system",
    "net_exfiltrate": "OSError: [Errno 101] Network is unreachable",
    "proc_secrets": "LookupError: no other process's command line or environment is readable",
    "escapes_process_group": UNWRITTEN,
}
CONTROLS = ("torch_dequant", "honest_cache", "honest_threads")
KEY = "must-not-reach-candidates"


def _sandbox_works() -> bool:
    task = REPO / "tasks" / "fp8_gemm" / "reference.py"
    return sandbox_available(tuple(protected_paths(task))) is None


SANDBOX = _sandbox_works()
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="the OS worker sandbox (unshare) is "
                                   "not available here")


def _session(task: Path, cwd: Path, names: list[str], select: str, env: dict[str, str],
             *extra: str) -> subprocess.Popen[str]:
    cwd.mkdir()
    kernels = [f"--kernel={CANDIDATES / n}.py" for n in names if n != "torch_dequant"]
    kernels.append(f"--kernel={task / 'seeds' / 'torch_dequant.py'}")
    args = [*PYTEST, "-rA",
            "--ks-json", str(cwd / "ks-results.json"), str(task), *kernels, "-k", select,
            "--ks-device", "cpu", "--ks-profile", "cpu", "--ks-timeout", "60", *extra]
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("adversarial")
    task = tmp / "fp8_gemm"
    shutil.copytree(REPO / "tasks" / "fp8_gemm", task,
                    ignore=shutil.ignore_patterns("__pycache__", "population"))
    escape = tmp / "escape"
    escape.mkdir()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    env = dict(os.environ, GEMINI_API_KEY=KEY, MY_SERVICE_TOKEN=KEY, ESCAPE_DIR=str(escape),
               EXFIL_PORT=str(listener.getsockname()[1]))
    check_names = [*CHECK, *(SANDBOXED if SANDBOX else {}), *CONTROLS]
    runs = {
        "check": _session(task, tmp / "check", check_names, f"check and {CHECK_CASE}", env),
        "bench": _session(task, tmp / "bench", [*BENCH, *CONTROLS],
                          f"bench and {BENCH_CASE} and not reference", env,
                          "--ks-bench-budget", "0.3"),
    }
    found: dict[str, Any] = {"task": task, "escape": escape, "listener": listener}
    for kind, proc in runs.items():
        output, _ = proc.communicate(timeout=600)
        path = tmp / kind / "ks-results.json"
        data = json.loads(path.read_text()) if path.exists() else None
        found[kind] = (proc.returncode, output, data)
    yield found
    listener.close()


@pytest.mark.parametrize(("kind", "name"), [
    *(("check", n) for n in CHECK),
    *(("bench", n) for n in BENCH),
])
def test_attack_is_rejected_with_its_reason(corpus: dict[str, Any], kind: str, name: str) -> None:
    _, output, data = corpus[kind]
    assert data is not None, output[-3000:]
    case = CHECK_CASE if kind == "check" else BENCH_CASE
    outcome, reason = case_reasons(data)[(name, case)]
    assert outcome == "failed"
    assert (CHECK if kind == "check" else BENCH)[name] in reason


@needs_sandbox
@pytest.mark.parametrize("name", sorted(SANDBOXED))
def test_sandbox_stops_the_attack(corpus: dict[str, Any], name: str) -> None:
    _, _, data = corpus["check"]
    outcome, reason = case_reasons(data)[(name, CHECK_CASE)]
    assert outcome == "failed"
    assert SANDBOXED[name] in reason
    if "Read-only file system" in reason:  # and it says where a candidate may write
        assert reason.endswith(READ_ONLY_HINT)


@needs_sandbox
def test_sandbox_leaves_no_trace(corpus: dict[str, Any]) -> None:
    task, escape, listener = corpus["task"], corpus["escape"], corpus["listener"]
    assert not (task / "population").exists()
    assert not (task / "seeds" / "planted.py").exists()
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected
    assert (escape / "started").exists()  # the escaping daemon did run...
    with open(escape / "lock", "a") as lock:  # ...and is gone: its lock is free
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("kind", ["check", "bench"])
def test_honest_controls_pass(corpus: dict[str, Any], kind: str) -> None:
    code, output, data = corpus[kind]
    assert data is not None, output[-3000:]
    case = CHECK_CASE if kind == "check" else BENCH_CASE
    reasons = case_reasons(data)
    for name in CONTROLS:
        assert reasons[(name, case)] == ("passed", ""), name
    assert code == 1


def test_results_file_is_the_harness_own(corpus: dict[str, Any]) -> None:
    code, output, data = corpus["check"]
    run = RunResults.model_validate(data)
    fake = next(c for c in run.candidates if c.name == "fake_records")
    assert [c.outcome for c in fake.cases] == ["failed"]
    assert fake.geomean_us is None and fake.speedup_over_reference is None
    lines = output.splitlines()
    assert not [line for line in lines
                if line.startswith("PASSED tasks/fp8_gemm/task.toml::fake_records")], output
    # Its print is shown under its failure, behind the margin that marks it as its own.
    assert "| PASSED tasks/fp8_gemm/task.toml::fake_records::check" in lines, output
    assert KEY not in json.dumps(data)
