"""Pure modules: statistics, the element-wise check, the authenticated channel, seed mixing."""

from __future__ import annotations

import math
import os
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_kscientist.errors import ChannelError
from pytest_kscientist.harness.correctness import compare
from pytest_kscientist.harness.evaluate import derive_seed
from pytest_kscientist.harness.stats import geomean, summarize
from pytest_kscientist.protocol import channel

times = st.lists(st.floats(0.01, 1e6, allow_nan=False), min_size=1, max_size=200)


@given(times)
def test_summary_statistics(values: list[float]) -> None:
    s = summarize(values)
    assert s.runs == len(values)
    assert s.min_us <= s.median_us <= s.max_us
    assert s.min_us <= s.mean_us * (1 + 1e-12) and s.mean_us <= s.max_us * (1 + 1e-12)
    if len(values) > 1:
        assert s.stderr_us == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)))


@given(st.lists(st.floats(1e-3, 1e6), min_size=1, max_size=30))
def test_geomean_lies_between_min_and_max(values: list[float]) -> None:
    g = geomean(values)
    assert min(values) * (1 - 1e-9) <= g <= max(values) * (1 + 1e-9)


def test_geomean_and_summary_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="positive values"):
        geomean([1.0, 0.0])
    with pytest.raises(ValueError, match="at least one timed call"):
        summarize([])


def test_compare_tolerance_and_specials() -> None:
    ref = torch.tensor([1.0, 100.0, float("nan"), float("inf")]).bfloat16()
    assert compare(ref.clone(), ref, 1e-3, 2e-2) is None
    near = torch.tensor([1.0, 101.5, float("nan"), float("inf")]).bfloat16()
    assert compare(near, ref, 1e-3, 2e-2) is None
    off = torch.tensor([1.0, 103.0, 0.0, float("inf")]).bfloat16()
    message = compare(off, ref, 1e-3, 2e-2)
    assert message is not None and message.startswith("2 of 4 elements outside")
    assert "(1,): got 103, expected 100" in message


def test_compare_reports_poison_shape_and_dtype() -> None:
    ref = torch.ones(2, 3, dtype=torch.bfloat16)
    poisoned = ref.clone()
    poisoned[1, 2] = float("nan")
    assert "1 are NaN where the reference is not: unwritten output?" in compare(poisoned, ref, 0, 0)
    assert compare(ref.T, ref, 0, 0) == "output shape (3, 2), expected (2, 3)"
    assert compare(ref.float(), ref, 0, 0) == "output dtype torch.float32, expected torch.bfloat16"


def test_compare_judges_complex_outputs_by_both_parts() -> None:
    """A conjugated or real-only FFT passed before: both sides were cast to float64, which
    keeps the real part alone."""
    ref = torch.tensor([1 + 2j, -3 + 0.5j, 4 - 1j], dtype=torch.complex64)
    assert compare(ref.clone(), ref, 1e-5, 1e-5) is None
    assert compare(ref.conj().resolve_conj(), ref, 1e-5, 1e-5).startswith("3 of 3 elements")
    message = compare(torch.complex(ref.real, torch.zeros(3)), ref, 1e-5, 1e-5)
    assert "(0,): got 1+0j, expected 1+2j" in message
    # Closeness is the complex distance against the complex magnitude, as torch.allclose.
    assert compare(torch.tensor([100 + 0.5j]), torch.tensor([100 + 0.001j]), 1e-3, 2e-2) is None
    nan = torch.tensor([complex(float("nan"), 1.0)])
    assert compare(nan.clone(), nan, 0, 0) is None
    assert "NaN where the reference is not" in compare(nan, torch.tensor([1 + 1j]), 0, 0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_compare_judges_integers_exactly(dtype: torch.dtype) -> None:
    ref = torch.tensor([0, 1, 1, 0]).to(dtype)
    assert compare(ref.clone(), ref, 0, 0) is None
    off = ref.clone()
    off[2] = 0
    assert compare(off, ref, 0, 0).startswith("1 of 4 elements outside")
    if dtype == torch.int64:  # one apart above 2**53, where float64 holds them as one value
        big = torch.tensor([2**60, 2**60 + 3])
        message = compare(big + torch.tensor([0, 1]), big, 0, 0)
        assert message is not None and f"got {2**60 + 4}, expected {2**60 + 3}" in message


def test_channel_round_trip_and_tampering() -> None:
    key = os.urandom(32)
    r, w = os.pipe()
    try:
        channel.write_all(w, channel.encode(key, 0, {"op": "x", "v": [1, 2]}, b"payload"))
        header, payload = channel.read_frame(r, key, 0, deadline=None)
        assert (header, payload) == ({"op": "x", "v": [1, 2]}, b"payload")
        channel.write_all(w, channel.encode(key, 0, {"op": "replayed"}))
        with pytest.raises(ChannelError, match="frame 1 failed authentication"):
            channel.read_frame(r, key, 1)
        channel.write_all(w, channel.encode(os.urandom(32), 2, {"op": "forged"}))
        with pytest.raises(ChannelError, match="failed authentication"):
            channel.read_frame(r, key, 2)
    finally:
        os.close(r)
        os.close(w)


def test_channel_eof_and_timeout() -> None:
    import time

    r, w = os.pipe()
    with pytest.raises(TimeoutError):
        channel.read_frame(r, b"", 0, deadline=time.monotonic() + 0.05)
    os.close(w)
    with pytest.raises(EOFError):
        channel.read_frame(r, b"", 0, deadline=time.monotonic() + 5)
    os.close(r)


@given(st.integers(0, 2**31), st.integers(0, 2**32), st.integers(-5, 500))
def test_derived_seeds_are_stable_and_salted(seed: int, salt: int, index: int) -> None:
    s = derive_seed(seed, salt, index)
    assert s == derive_seed(seed, salt, index) and 0 <= s < 2**56
    assert s != derive_seed(seed, salt + 1, index)


def test_fp8_gemm_reference_matches_blockwise_definition() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "reference.py"
    spec = importlib.util.spec_from_file_location("fp8_ref", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    a, b, sa, sb, c = ref.generate_input(m=40, n=200, k=384, seed=7)
    assert a.stride() == (1, 40) and b.stride() == (1, 200) and c.stride() == (200, 1)
    assert sa.shape == (40, 3) and sb.shape == (2, 3) and sa.stride() == (1, 40)
    expected = torch.zeros(40, 200, dtype=torch.float64)
    for kb in range(3):
        block = slice(kb * 128, (kb + 1) * 128)
        part = a[:, block].double() @ b[:, block].double().T
        expected += part * sa[:, kb : kb + 1].double() * sb[torch.arange(200) // 128, kb].double()
    out = ref.ref_kernel((a, b, sa, sb, c))
    assert out.dtype == torch.bfloat16
    assert compare(out, expected.bfloat16(), 1e-3, 2e-2) is None


def test_tests_that_start_processes_are_marked_slow() -> None:
    import types

    from helpers import spawns

    module = types.ModuleType("fake_tests")
    exec(  # noqa: S102 - a module of sample tests
        "import subprocess\n"
        "def helper():\n    subprocess.run(['true'])\n"
        "def test_through_a_helper():\n    helper()\n"
        "def test_in_a_comprehension():\n    return [subprocess.Popen for _ in range(1)]\n"
        "def test_pure():\n    return sorted([3, 1])\n",
        module.__dict__,
    )
    assert spawns(module.test_through_a_helper, module)
    assert spawns(module.test_in_a_comprehension, module)
    assert not spawns(module.test_pure, module)


def test_a_real_worker_loads_only_the_worker_side_of_the_package() -> None:
    """The process boundary, enforced: a worker started as the harness starts it reports the
    package modules it had loaded before candidate code; they are the worker package, the
    protocol, the formats' input drawing and the package's root only."""
    from helpers import REPO

    from pytest_kscientist.formats.task import load_task
    from pytest_kscientist.harness.spawn import Worker

    task = load_task(REPO / "tasks" / "fp8_gemm")
    worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=False)
    try:
        loaded = set(worker.worker_modules)
    finally:
        worker.close()
    assert "pytest_kscientist.worker.timing" in loaded  # the report is the runner's own
    allowed_packages = ("pytest_kscientist.worker.", "pytest_kscientist.protocol.")
    allowed = {"pytest_kscientist", "pytest_kscientist.errors", "pytest_kscientist.worker",
               "pytest_kscientist.protocol", "pytest_kscientist.formats",
               "pytest_kscientist.formats.forms"}
    outside = {m for m in loaded if m not in allowed and not m.startswith(allowed_packages)}
    assert not outside, f"the worker loaded harness modules {sorted(outside)}"


def test_the_runner_refuses_harness_modules_beside_it() -> None:
    from pytest_kscientist.worker.runner import outside_worker_side

    assert outside_worker_side([
        "pytest_kscientist.worker.timing", "pytest_kscientist.protocol.channel",
        "pytest_kscientist.formats.forms", "pytest_kscientist.errors", "torch"]) == []
    assert outside_worker_side(["pytest_kscientist.harness.evaluate",
                                "pytest_kscientist.formats.task",
                                "pytest_kscientist.evolve"]) == [
        "pytest_kscientist.evolve", "pytest_kscientist.formats.task",
        "pytest_kscientist.harness.evaluate"]


def test_worker_side_code_imports_the_package_only_at_module_level() -> None:
    """The runner hides the package from sys.modules once it has started, and a call after
    which the package is back in sys.modules fails as "imported the harness's own package". So
    code the worker runs during a call (its package and the protocol) must not import the
    package inside a function: handover.offer did, for CUDA outputs, and on the H200 every
    benchmark whose output went through the CUDA handover failed so (2026-12-03)."""
    import ast

    from helpers import REPO

    found = []
    for sub in ("worker", "protocol"):
        for path in sorted((REPO / "pytest_kscientist" / sub).glob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text())):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                             [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                    if any(n.split(".")[0] == "pytest_kscientist" for n in names):
                        found.append(f"{path.name}:{node.lineno} in {fn.name}")
    assert not found, found


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32,
                                   torch.float64, torch.complex64, torch.complex128, torch.bool,
                                   torch.int16])
def test_input_bits_compare_in_place_and_bit_for_bit(dtype: torch.dtype) -> None:
    """The worker's unchanged-input check reads elements as same-size integers (runner._bits):
    a transposed input is not copied, NaN equals NaN, -0.0 differs from 0.0, one flipped
    element is found."""
    from pytest_kscientist.worker.runner import _bits

    base = torch.randn(48, 64).to(dtype) if dtype != torch.bool else torch.rand(48, 64) > 0.5
    if dtype.is_floating_point:
        base[0, 0], base[1, 1] = float("nan"), 0.0
    given = base.T  # a transposed view, as fp8_gemm's operands arrive
    bits = _bits(given)
    if dtype.itemsize <= 8:
        assert bits.data_ptr() == given.data_ptr() and bits.shape == given.shape
    twin = given.clone()
    assert torch.equal(_bits(twin), bits)  # NaN included
    if dtype.is_floating_point:
        twin[1, 1] = -0.0
        assert not torch.equal(_bits(twin), bits)
    twin = given.clone()
    one = twin[5, 7]
    twin[5, 7] = ~one if dtype == torch.bool else one + 1 if dtype.is_complex else (
        one.to(torch.float64) + 1).to(dtype)
    assert not torch.equal(_bits(twin), bits)


def test_a_refused_write_wrapped_in_another_error_says_where_to_write() -> None:
    """Inductor raises its own error from the OSError the sandbox caused: the hint is given
    for the cause too, and not for other errors."""
    import errno

    from pytest_kscientist.worker.runner import READ_ONLY_HINT, _one_line

    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/tmp/x.lock")
        except OSError as exc:
            raise RuntimeError(f"InductorError: {exc}") from exc
    except RuntimeError as wrapped:
        assert _one_line(wrapped).endswith(READ_ONLY_HINT)
    assert not _one_line(RuntimeError("no such file")).endswith(READ_ONLY_HINT)
