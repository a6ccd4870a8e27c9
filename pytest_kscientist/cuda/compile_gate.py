"""``compile[sm_XY]`` items: a CUDA candidate compiled by nvcc where it cannot run.

A candidate declaring an NVIDIA target (``KS_REQUIRES = "sm_90"``) skips its items on other
devices, so on a CPU CI runner ``pytest tasks/fp8_gemm --kernel k.py`` checked nothing of it.
Where nvcc is installed it now gets one ``compile[sm_XY]`` item per declared target, there
only (on a device that meets the requirement the worker's own build is the check):
1. its ``load_inline`` call is captured: the file is imported in the workers' OS sandbox with
   ``torch.utils.cpp_extension.load_inline`` replaced by a recorder that prints the call's
   arguments and ends the process (nothing is built; a source made by functions, as the CUDA
   seed's, is captured like a literal);
2. cuda.cu is written as load_inline writes it (torch's three headers first unless
   ``no_implicit_headers``) and compiled as load_inline compiles it (``COMMON_NVCC_FLAGS``,
   ``-Xcompiler -fPIC``, ``-std=c++20``, torch's and Python's headers, the candidate's include
   paths and ``extra_cuda_cflags``; its own ``-gencode``/``-arch`` or else the item's target),
   with ptxas reporting each kernel's registers, spills, stack and static shared memory.
The item fails with nvcc's first errors, and skips, saying why, without nvcc (``KS_NVCC`` names
one), for a file that calls no ``load_inline`` at import, or when the import stops before it on
this machine (CUDA calls at module level). Results are kept by their inputs' hash, as the HIP
gate keeps its own (``hip.compile_gate``: ``KS_COMPILE_CACHE``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.formats import requires
from pytest_kscientist.harness import compiles
from pytest_kscientist.harness.results import CompileResult, KernelResources

MARK = "@@ks-load-inline@@"
KEPT = ("name", "cpp_sources", "cuda_sources", "extra_cuda_cflags", "extra_include_paths",
        "functions", "no_implicit_headers")
# Run in the sandbox: the candidate imported with load_inline recorded, not run.
CAPTURE = f"""
import importlib.util, inspect, json, os, sys
import torch.utils.cpp_extension as ext
real = ext.load_inline
def record(*args, **kwargs):
    got = inspect.signature(real).bind(*args, **kwargs).arguments
    os.write(1, ("\\n{MARK}" + json.dumps({{k: got.get(k) for k in {KEPT!r}}}) + "\\n").encode())
    os._exit(0)
ext.load_inline = record
spec = importlib.util.spec_from_file_location("ks_cuda_capture", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
os.write(1, "\\n{MARK}null\\n".encode())
"""
PRELUDE = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
ERROR = re.compile(r"^(?P<where>\S+?\(\d+\)): (?:catastrophic )?error: |^(?P<ptxas>ptxas) "
                   r"(?:fatal|error)\s*: ")
ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
                   r"(?P<loads>\d+) bytes spill loads")
USED = re.compile(r"Used (?P<regs>\d+) registers(?:.*?(?P<smem>\d+) bytes smem)?")


class NotCaptured(Exception):
    """The candidate's load_inline call could not be read here: why (the item skips)."""


def nvcc() -> Path | None:
    """``$KS_NVCC``, else nvcc on the PATH, else under ``$CUDA_HOME`` or /usr/local/cuda."""
    chosen = os.environ.get("KS_NVCC")
    if chosen:
        return Path(chosen) if Path(chosen).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return Path(root) / "bin" / "nvcc"
    return None


def targets(source: Path) -> list[str]:
    """The NVIDIA targets (sm_XY) the candidate declares in KS_REQUIRES."""
    try:
        needs = requires.declared(source)
    except requires.RequiresError:
        return []  # the candidate's own collection error says why
    return [n for n in needs if re.fullmatch(r"sm_\d+[a-z]?", n)]


def capture(path: Path, timeout_s: float) -> dict[str, Any]:
    """The arguments of the candidate's load_inline call, from a sandboxed import (its own
    process group, killed at the timeout; only a line of JSON is read back)."""
    cmd = [*compiles.compiler_sandbox(path), sys.executable, "-c", CAPTURE, str(path)]
    code, output = compiles.run(cmd, path.parent, timeout_s)
    if code is None:
        raise NotCaptured(f"its import did not reach load_inline within {timeout_s:g} s "
                          "(--ks-timeout)")
    for line in reversed(output.splitlines()):
        if not line.startswith(MARK):
            continue
        try:
            build = json.loads(line[len(MARK):])
        except ValueError:
            build = "malformed"
        if build is None:
            raise NotCaptured("its import calls no torch.utils.cpp_extension.load_inline, so "
                              "there is no CUDA source to compile")
        if not isinstance(build, dict):
            raise NotCaptured("what its import printed as load_inline's arguments is not them")
        if not build.get("cuda_sources"):
            raise NotCaptured("its load_inline call has no cuda_sources")
        for key in ("cuda_sources", "extra_cuda_cflags", "extra_include_paths"):
            if not all(isinstance(x, str) for x in _listed(build.get(key))):
                raise NotCaptured(f"its load_inline call's {key} are not all strings")
        return build
    last = (output.strip().splitlines() or ["no output"])[-1]
    raise NotCaptured(f"its import stopped before load_inline on this machine (exit {code}): "
                      f"{last}")


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def unit_text(build: dict[str, Any]) -> str:
    """cuda.cu as load_inline writes it."""
    sources = _listed(build.get("cuda_sources"))
    return "\n".join(sources if build.get("no_implicit_headers") else [*PRELUDE, *sources])


def command(compiler: Path, build: dict[str, Any], arch: str, unit: Path, obj: Path) -> list[str]:
    """nvcc's command line for cuda.cu, as load_inline's, with ptxas reporting."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths

    flags = _listed(build.get("extra_cuda_cflags"))
    headers = [*include_paths(), sysconfig.get_paths()["include"]]
    cmd = [str(compiler), "-c", str(unit), "-o", str(obj), *COMMON_NVCC_FLAGS, "-Xcompiler",
           "-fPIC", "-std=c++20", f"-DTORCH_EXTENSION_NAME={build.get('name') or 'candidate'}",
           "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for folder in headers:
        cmd += ["-isystem", str(folder)]
    cmd += [f"-I{p}" for p in _listed(build.get("extra_include_paths"))]
    if not any(f.startswith(("-gencode", "--generate-code", "-arch", "--gpu-architecture"))
               for f in flags):
        number = arch.removeprefix("sm_")
        cmd.append(f"-gencode=arch=compute_{number},code=sm_{number}")
    return [*cmd, *flags, "-Xptxas", "-v"]


def parse_ptxas(output: str) -> list[KernelResources]:
    """Each entry function's registers, spills, stack and static shared memory (ptxas -v)."""
    kernels: dict[str, dict[str, int]] = {}
    entry = current = None
    for line in output.splitlines():
        if m := ENTRY.search(line):
            entry = current = m["name"]
            kernels.setdefault(entry, {})
        elif m := PROPERTIES.search(line):
            current = m["name"]
        elif (m := FRAME.search(line)) and current in kernels:
            kernels[current].update(stack=int(m["stack"]), stores=int(m["stores"]),
                                    loads=int(m["loads"]))
        elif (m := USED.search(line)) and entry is not None:
            kernels[entry].update(regs=int(m["regs"]), smem=int(m["smem"] or 0))
    names = compiles.demangled(list(kernels))
    return [KernelResources(name=shown, registers=k.get("regs"), shared_bytes=k.get("smem"),
                            stack_bytes=k.get("stack"), spill_store_bytes=k.get("stores"),
                            spill_load_bytes=k.get("loads"))
            for shown, k in zip(names, kernels.values(), strict=True)]


# A line of cuda.cu as first_errors quotes it under its error, read back by with_file_lines.
QUOTE = "  {number:4d} | {text}"
QUOTED = re.compile(r"^  (?P<number> *\d+) \| ")


def first_errors(output: str, unit: str) -> str:
    """nvcc's first errors, each with the line of cuda.cu it names (``QUOTE``)."""
    lines = unit.splitlines()
    found = []
    for line in output.splitlines():
        m = ERROR.match(line)
        if m is None:
            continue
        found.append(line)
        if m["where"] and (n := re.search(r"\((\d+)\)$", m["where"])):
            number = int(n[1])
            if 0 < number <= len(lines):
                found.append(QUOTE.format(number=number, text=lines[number - 1]))
        if len(found) >= 2 * compiles.MAX_ERRORS:
            break
    return "\n".join(found)


def with_file_lines(reason: str, unit: str, file_text: str, shown_as: str) -> str:
    """``reason`` (``first_errors``' lines) with each quoted line of cuda.cu followed by where
    it stands in the candidate's file, where ``file_line`` can tell. Done on every result, kept
    ones too: a kept verdict is shared by files with the same cuda.cu, not the same lines."""
    unit_lines, file_lines = unit.splitlines(), file_text.splitlines()
    out = []
    for line in reason.splitlines():
        m = QUOTED.match(line)
        own = file_line(file_lines, unit_lines, int(m["number"])) if m else None
        out.append(f"{line}   ({shown_as} line {own})" if own is not None else line)
    return "\n".join(out)


def file_line(file_lines: list[str], unit_lines: list[str], number: int) -> int | None:
    """The line of the candidate's file that cuda.cu's line ``number`` (1-based) came from:
    where that line, with as many neighbours as it takes to be told apart (up to three on each
    side), stands in the file as written. None for a line the file builds at import (a
    substituted f-string, a joined list) or one it holds too often to tell."""
    index = number - 1
    if not 0 <= index < len(unit_lines) or not unit_lines[index].strip():
        return None
    written = [line.strip() for line in file_lines]
    for reach in range(4):
        low, high = max(0, index - reach), min(len(unit_lines), index + reach + 1)
        window = [line.strip() for line in unit_lines[low:high]]
        hits = [i for i in range(len(written) - len(window) + 1)
                if written[i:i + len(window)] == window]
        if len(hits) == 1:
            return hits[0] + (index - low) + 1
        if not hits:
            return None
    return None


def compile_candidate(path: Path, arch: str, timeout_s: float) -> CompileResult:
    """Capture the candidate's CUDA source and compile it for ``arch``."""
    compiler = nvcc()
    if compiler is None:
        return CompileResult(arch=arch, outcome="skipped", reason=(
            f"no nvcc to compile for {arch} (not on the PATH, nor under $CUDA_HOME or "
            "/usr/local/cuda); install the CUDA toolkit's compiler or name it with KS_NVCC"))
    try:
        build = capture(path, timeout_s)
    except NotCaptured as exc:
        return CompileResult(arch=arch, outcome="skipped", reason=f"not compiled here: {exc}")
    text = unit_text(build)
    version = compiles.compiler_version(compiler, "release")
    key, ran = compiles.compile_kept(
        path, "cuda.cu", text, lambda unit, obj: command(compiler, build, arch, unit, obj),
        (version,), timeout_s)
    if not isinstance(ran, compiles.Ran):
        return _located(ran, text, path)  # kept from an earlier compile
    code, output = ran.code, ran.output
    result = CompileResult(arch=arch, outcome="passed", seconds=ran.seconds,
                           sandboxed=ran.sandboxed, compiler=version)
    if code is None:
        compiles.killed(result, "nvcc", timeout_s)
    elif code != 0:
        result.outcome = "failed"
        errors = first_errors(output, text)
        result.reason = (
            f"{errors}\n(cuda.cu: the file's cuda_sources as load_inline writes them)" if errors
            else f"nvcc exited with code {code} without an error line")
        shown = sum(bool(ERROR.match(line)) for line in output.splitlines())
        if not errors or shown > compiles.MAX_ERRORS:
            result.detail = output[-4000:]  # more than the reason shows
    else:
        result.kernels = parse_ptxas(output)
    compiles.keep_verdict(key, result, code, output, ERROR)
    return _located(result, text, path)


def _located(result: CompileResult, unit: str, path: Path) -> CompileResult:
    """``result`` with its reason's quoted cuda.cu lines placed in the candidate's file."""
    if result.outcome != "failed" or not result.reason:
        return result
    placed = with_file_lines(result.reason, unit, path.read_text(errors="replace"), path.name)
    return result.model_copy(update={"reason": placed})


class CudaCompileItem(compiles.CompileItem):
    """compile[sm_XY]: a CUDA candidate's load_inline source compiled by nvcc."""

    compile_source = staticmethod(compile_candidate)


def compile_items(parent: pytest.Collector, source: Path, runs_here: bool) -> list[pytest.Item]:
    """One compile[sm_XY] item per NVIDIA target the candidate declares, where it does not run
    (``runs_here`` False) and its file mentions load_inline."""
    if runs_here or "load_inline" not in source.read_text(errors="replace"):
        return []
    return [CudaCompileItem.from_parent(parent, name=f"compile[{arch}]", arch=arch)
            for arch in targets(source)]


def draft_problem(source: str) -> str:
    """Why a written draft that builds CUDA through load_inline does not compile for an sm
    target its KS_REQUIRES names (nvcc's first errors), or "" when it compiles, names none, or
    cannot be compiled here (no nvcc; its import stops before load_inline). For the LLM
    writer's draft check: a draft nvcc rejects goes back to the writer before any GPU time."""
    return compiles.draft_problem(
        source, "CUDA",
        lambda path: targets(path) if "load_inline" in path.read_text(errors="replace") else [],
        compile_candidate)
