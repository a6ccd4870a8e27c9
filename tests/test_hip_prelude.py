"""The HIP compile items' precompiled prelude (hip/prelude.py): torch's and HIP's headers built
once per target into a PCH kept beside the compile results, shared by knob variants, refused
PCHs rebuilt, nothing precompiled where results are not kept. Real clang (the toolchain of
tools/install_hip_toolchain.sh), like test_hip_compile.py; the tests share one compile folder,
so the PCH is built once for the module (the refusal test, which damages it, runs last)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO

from pytest_kscientist.harness import compiles
from pytest_kscientist.hip import compile_gate, prelude
from pytest_kscientist.hip import source as hip

HIP = REPO / "tests" / "data" / "hip"
SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "hip_mfma.py"


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kept")


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch, kept: Path) -> list[list[str]]:
    """Every compiler command line the gate runs (the real compiler still runs), with compile
    results and the PCH kept in the module's folder."""
    monkeypatch.setenv("KS_COMPILE_CACHE", str(kept))
    ran: list[list[str]] = []
    real = compiles.run

    def spy(cmd: list[str], cwd: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> tuple[int | None, str]:
        ran.append(cmd)
        return real(cmd, cwd, timeout_s, env)

    monkeypatch.setattr(compiles, "run", spy)
    return ran


def _pch_of(cmd: list[str]) -> Path:
    return Path(cmd[cmd.index("-include-pch") + 1])


@pytest.mark.slow  # runs clang
def test_knob_variants_share_one_pch_and_compile_through_it(
        toolchain, tmp_path: Path, commands: list[list[str]]) -> None:
    variant = tmp_path / "hip_mfma_pad8.py"
    variant.write_text(SEED.read_text().replace('"LDS_PAD": 4,', '"LDS_PAD": 8,'))
    assert variant.read_text() != SEED.read_text()
    first = compile_gate.compile_candidate(SEED, "gfx942", 300)
    second = compile_gate.compile_candidate(variant, "gfx942", 300)
    assert first.outcome == second.outcome == "passed", (first.reason, second.reason)
    builds = [c for c in commands if "-emit-pch" in c]
    through = [c for c in commands if "-include-pch" in c]
    assert len(builds) == 1 and len(through) == 2
    assert _pch_of(through[0]) == _pch_of(through[1]) and _pch_of(through[0]).is_file()
    # The variant's own macros stay on its command line, off the PCH's.
    assert "-DLDS_PAD=8" in through[1] and not any("LDS_PAD" in f for f in builds[0])
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in through[0])
    # The same code, the same resources as with the headers parsed (the one plain compile).
    plain = compile_gate.compile_candidate(SEED, "gfx942", 300, precompiled=False)
    assert not plain.cached and "-include-pch" not in commands[-1]
    assert first.kernels == plain.kernels


@pytest.mark.slow  # runs clang
def test_errors_through_the_pch_name_the_candidates_lines(
        toolchain, commands: list[list[str]]) -> None:
    result = compile_gate.compile_candidate(HIP / "syntax_error.py", "gfx942", 300)
    assert result.outcome == "failed"
    assert result.reason.startswith(
        "syntax_error.py:13:28: error: expected ';' after expression"), result.reason
    assert "-include-pch" in commands[-1]


def test_nothing_is_precompiled_where_results_are_not_kept(
        monkeypatch: pytest.MonkeyPatch, toolchain, commands: list[list[str]]) -> None:
    monkeypatch.setenv("KS_COMPILE_CACHE", "off")
    monkeypatch.setattr(compiles, "run", lambda cmd, *args: commands.append(cmd) or (1, ""))
    compile_gate.compile_candidate(HIP / "syntax_error.py", "gfx942", 300)
    assert len(commands) == 1  # the compile itself, nothing built first
    assert not any("-emit-pch" in c or "-include-pch" in c for c in commands)


def test_flags_the_headers_do_not_compile_with_are_not_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    ran: list[list[str]] = []
    monkeypatch.setattr(compiles, "run", lambda cmd, *args: ran.append(cmd) or (
        1, "prelude.h:1:10: error: C++17 or later required"))
    command = lambda header, out: ["clang", "-std=c++11", "-o", str(out), str(header)]  # noqa: E731
    args = (hip.PRELUDE, command, ("clang 22",), HIP / "syntax_error.py", 60.0)
    assert prelude.built(*args) is None and len(ran) == 1
    assert prelude.built(*args) is None and len(ran) == 1  # the mark answers
    (mark,) = (tmp_path / "kept" / "prelude").glob("*.failed")
    monkeypatch.setattr(compiles, "run", lambda cmd, *args: ran.append(cmd) or (None, ""))
    mark.unlink()
    assert prelude.built(*args) is None and len(ran) == 2
    assert not mark.exists()  # a timeout leaves no mark: the flags may be fine


@pytest.mark.parametrize(("flags", "shared"), [
    (["-std=c++20", "-O3", "-DBLOCK_M=64", "-UWAVES"], []),
    (["-std=c++17", "-ffast-math", "-mcumode", "-Wall", "-w"],
     ["-std=c++17", "-ffast-math", "-mcumode"]),
    (["-D__HIP_NO_HALF_CONVERSIONS__=0", "-DNDEBUG", "-U_GLIBCXX_ASSERTIONS", "-DTILE=4"],
     ["-D__HIP_NO_HALF_CONVERSIONS__=0", "-DNDEBUG", "-U_GLIBCXX_ASSERTIONS"]),
])
def test_the_pch_keeps_only_the_flags_the_headers_may_read(flags: list[str],
                                                            shared: list[str]) -> None:
    assert compile_gate.headers_flags(flags) == shared


def test_a_unit_through_the_pch_defines_the_extension_name_itself() -> None:
    source = hip.read_source(HIP / "syntax_error.py")
    with_pch = hip.translation_unit(source, "k.py", precompiled=True)
    assert with_pch.startswith(f"#define TORCH_EXTENSION_NAME {source.module_name}\n#line ")
    assert "#include <torch/types.h>" not in with_pch
    assert hip.translation_unit(source, "k.py").startswith(hip.PRELUDE)


@pytest.mark.slow  # runs clang
def test_a_pch_clang_refuses_is_removed_and_the_compile_still_passes(
        toolchain, tmp_path: Path, commands: list[list[str]]) -> None:
    fixed = tmp_path / "scale.py"
    fixed.write_text((HIP / "syntax_error.py").read_text().replace(
        "x[i] *= 2.0f\n", "x[i] *= 2.0f;\n"))
    assert compile_gate.compile_candidate(fixed, "gfx942", 300).outcome == "passed"
    pch = _pch_of(commands[-1])
    pch.write_bytes(b"not a precompiled header")
    fixed.write_text(fixed.read_text().replace("2.0f;", "3.0f;"))  # not a kept result
    again = compile_gate.compile_candidate(fixed, "gfx942", 300)
    assert again.outcome == "passed" and not again.cached, again.reason
    # Refused, compiled again without it, and the damaged file gone: the next compile of this
    # target builds it anew.
    assert "-include-pch" in commands[-2] and "-include-pch" not in commands[-1]
    assert not pch.exists()
