"""``compile[<arch>]`` items: every HIP candidate compiled for each declared target, anywhere.

No AMD GPU is needed: the candidate's device source (``hip.read_source``) is compiled with a
real AMDGPU toolchain (``hip_toolchain.find``) in a sandboxed subprocess with a timeout, the way
``load_inline`` compiles it on ROCm torch (its prelude and flags, hipcc's ``-O3``), device code
only. The item fails with the compiler's first errors, at the candidate's own lines, and passes
with each kernel's resources (VGPRs, AGPRs, SGPRs, LDS, occupancy, spills) from
``-Rpass-analysis=kernel-resource-usage``; they travel to the summary and ``--ks-json``. Without
a toolchain the item skips with the command that installs it.

Results are kept by their inputs' hash, with the other languages' (``harness/compiles.py``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.harness import compiles
from pytest_kscientist.harness.compiles import (
    MAX_ERRORS,
    CompileItem,
    Ran,
    compile_kept,
    compiler_version,
    demangled,
    keep_verdict,
    killed,
)
from pytest_kscientist.harness.results import CompileResult, KernelResources
from pytest_kscientist.hip import prelude
from pytest_kscientist.hip import source as hip
from pytest_kscientist.hip import toolchain as hip_toolchain

ERROR = re.compile(r"^(?P<where>.+?:\d+:\d+): (?:fatal )?error: ")
DIAGNOSTIC = re.compile(r"^(.+?:\d+(:\d+)?: (error|fatal error|warning|note|remark): |In file "
                        r"included from |\d+ errors? generated)")
REMARK = re.compile(r"^(?P<where>.+?):\d+:\d+: remark: +(?P<key>[^:]+): (?P<value>.*?)"
                    r" \[-Rpass-analysis=kernel-resource-usage\]$")
FIELDS = {"TotalSGPRs": "sgprs", "SGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs",
          "ScratchSize [bytes/lane]": "scratch_bytes_per_lane",
          "Occupancy [waves/SIMD]": "occupancy_waves_per_simd", "SGPRs Spill": "sgpr_spills",
          "VGPRs Spill": "vgpr_spills", "LDS Size [bytes/block]": "lds_bytes"}
# load_inline's flags for HIP sources on ROCm torch (torch 2.13's cpp_extension: -DWITH_HIP,
# COMMON_HIP_FLAGS, COMMON_HIPCC_FLAGS, -std=c++20 before the candidate's own flags); hipcc
# adds -O3 when no -O is given.
LOAD_INLINE_FLAGS = ("-DWITH_HIP", "-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-DHIPBLAS_V2",
                     "-fPIC", "-DCUDA_HAS_FP16=1", "-D__HIP_NO_HALF_OPERATORS__=1",
                     "-D__HIP_NO_HALF_CONVERSIONS__=1", "-DHIP_ENABLE_WARP_SYNC_BUILTINS=1",
                     "-DTORCH_API_INCLUDE_EXTENSION_H", "-std=c++20", "-O3")
# The compiler's environment, for the PCH and the compiles that read it alike: nvcc on the PATH
# would otherwise pick the NVIDIA platform.
ENV = {"HIP_PLATFORM": "amd"}


def command(tc: hip_toolchain.Toolchain, arch: str, source: hip.HipSource, unit: Path,
            obj: Path, pch: Path | None = None) -> list[str]:
    """The compiler's command line for one target (device code only, with resource remarks);
    with ``pch``, the prelude read from it and the extension's name left to the unit."""
    cmd = [str(tc.clang), "-x", "hip", f"--offload-arch={arch}", f"--hip-path={tc.hip_path}"]
    if tc.device_libs is not None:
        cmd.append(f"--rocm-device-lib-path={tc.device_libs}")
    for folder in (*tc.includes, *tc.torch_includes, *tc.python_includes):
        cmd += ["-isystem", str(folder)]
    if tc.define_wavefront:
        # gfx9 (CDNA, GCN) runs 64-wide waves by default, gfx10+ (RDNA) 32-wide.
        cmd.append(f"-D__AMDGCN_WAVEFRONT_SIZE={64 if arch[3] == '9' else 32}")
    cmd += [*LOAD_INLINE_FLAGS,
            *([] if pch else [f"-DTORCH_EXTENSION_NAME={source.module_name}"]), *source.flags,
            "--cuda-device-only", "-c", "-o", str(obj), "-fno-color-diagnostics"]
    if pch is not None:
        cmd += ["-include-pch", str(pch)]
    return [*cmd, "-Rpass-analysis=kernel-resource-usage", str(unit)]


def pch_command(tc: hip_toolchain.Toolchain, arch: str, source: hip.HipSource, header: Path,
                out: Path) -> list[str]:
    """The command line that precompiles load_inline's prelude for ``command``'s compiles of
    this target: the same, with the PCH as the device side's only output, and of the
    candidate's flags only those the headers may read (``headers_flags``), so knob variants
    that differ in their own macros share one PCH."""
    shared = dataclasses.replace(source, flags=headers_flags(source.flags))
    cmd = command(tc, arch, shared, header, out, pch=header)
    at = cmd.index("-include-pch")
    return [*cmd[:at], "-S", "-Xclang", "-emit-pch", str(header)]


def headers_flags(flags: list[str]) -> list[str]:
    """The flags a PCH of the prelude is built with: language and target options (``-std=``,
    ``-f``, ``-m``) and macros named for the headers (a leading underscore, ``NDEBUG``). The
    candidate's own macros (``-DBLOCK_M=64``), optimisation levels and warnings stay on its
    compile's command line, which clang accepts beside a PCH built without them (clang 22);
    those macros then apply to the candidate's code, not to torch's and HIP's headers."""
    kept = []
    for flag in flags:
        if flag in LOAD_INLINE_FLAGS:
            continue  # already there (a -std=c++20 of its own)
        if flag.startswith(("-D", "-U")):
            name = flag[2:].split("=", 1)[0]
            if name.startswith("_") or name == "NDEBUG":
                kept.append(flag)
        elif not flag.startswith(("-O", "-W", "-w")):
            kept.append(flag)
    return kept


def shorten(text: str, tc: hip_toolchain.Toolchain) -> str:
    """Diagnostics with the header trees' long paths cut down."""
    for folder in tc.torch_includes[:1]:
        text = text.replace(str(folder), "<torch>/include")
    return text.replace(str(tc.hip_path), "<hip>")


def without_remarks(output: str) -> str:
    """The compiler's output without the resource remarks and the notes and snippets that
    follow them (a failing compile still prints them for the kernels it got through)."""
    kept: list[str] = []
    skipping = False
    for line in output.splitlines():
        if REMARK.match(line) or "could not determine the original source location" in line:
            skipping = True
            continue
        if skipping and not DIAGNOSTIC.match(line):
            continue
        skipping = False
        kept.append(line)
    return "\n".join(kept)


def first_errors(output: str, limit: int = MAX_ERRORS) -> str:
    """The first ``limit`` errors, each with its source line and caret, trimmed."""
    lines = output.splitlines()
    picked: list[str] = []
    count = 0
    for i, line in enumerate(lines):
        if not ERROR.match(line):
            continue
        count += 1
        if count > limit:
            continue
        picked.append(line[:300])
        for follow in lines[i + 1:i + 3]:
            if DIAGNOSTIC.match(follow):
                break
            picked.append(follow[:300])
    if count > limit:
        picked.append(f"... and {count - limit} more error(s)")
    return "\n".join(picked)


def parse_resources(output: str) -> list[KernelResources]:
    """Each kernel's resources from the ``kernel-resource-usage`` remarks, in output order."""
    kernels: list[dict[str, Any]] = []
    for line in output.splitlines():
        match = REMARK.match(line)
        if match is None:
            continue
        key, value = match["key"].strip(), match["value"].strip()
        if key == "Function Name":
            kernels.append({"name": value})
        elif kernels and key in FIELDS:
            kernels[-1][FIELDS[key]] = int(value)
    names = demangled([k["name"] for k in kernels])
    return [KernelResources.model_validate({**k, "name": n}) for k, n in zip(kernels, names,
                                                                              strict=True)
            if {"vgprs", "sgprs", "lds_bytes", "occupancy_waves_per_simd"} <= k.keys()]


def compile_candidate(path: Path, arch: str, timeout_s: float,
                      precompiled: bool = True) -> CompileResult:
    """Compile the candidate's device source for ``arch``: passed, failed or skipped. The
    prelude's headers come precompiled (``hip.prelude``) unless ``precompiled`` is False."""
    tc = hip_toolchain.find()
    if isinstance(tc, str):
        return CompileResult(arch=arch, outcome="skipped", reason=(
            f"no AMDGPU toolchain to compile for {arch} ({tc}); install it with: "
            f"{hip_toolchain.install_command()}"))
    try:
        source = hip.read_source(path)
    except hip.HipSourceError as exc:
        return CompileResult(arch=arch, outcome="failed", reason=str(exc))
    versions = (compiler_version(tc.clang), tc.versions)
    pch = prelude.built(hip.PRELUDE, lambda header, out: pch_command(
        tc, arch, source, header, out), versions, path, timeout_s, ENV) if precompiled else None
    key, ran = compile_kept(
        path, f"{path.stem}.hip", hip.translation_unit(source, path.name, pch is not None),
        lambda unit, obj: command(tc, arch, source, unit, obj, pch), versions, timeout_s, ENV)
    if not isinstance(ran, Ran):
        return ran  # kept from an earlier compile
    if pch is not None and ran.code != 0 and prelude.refused(ran.output, pch):
        return compile_candidate(path, arch, timeout_s, precompiled=False)
    code, output = ran.code, shorten(ran.output, tc)
    result = CompileResult(arch=arch, outcome="passed", seconds=ran.seconds,
                           compiler=compiler_version(tc.clang), toolchain=tc.versions,
                           ignored_flags=source.ignored_flags, sandboxed=ran.sandboxed,
                           detail=without_remarks(output)[-4000:])
    if code is None:
        killed(result, "the compiler", timeout_s)
    elif code != 0:
        result.outcome = "failed"
        result.reason = first_errors(output) or (
            f"the compiler exited with code {code} without an error line")
        if "'Python.h' file not found" in output:
            where = ", ".join(map(str, tc.python_includes)) or "nowhere (sysconfig names none)"
            result.reason += (f"\n(load_inline looks for Python.h in {where}, this "
                              "interpreter's include folder; install its development headers, "
                              "e.g. python3-dev)")
        if sum(bool(ERROR.match(line)) for line in output.splitlines()) <= MAX_ERRORS:
            result.detail = ""  # the reason holds every error already
    else:
        result.kernels = parse_resources(output)
        result.detail = ""
    keep_verdict(key, result, code, output, ERROR)
    return result


def compile_items(parent: pytest.Collector, source: Path) -> list[pytest.Item]:
    """One compile[<arch>] item per target the candidate declares in KS_HIP_ARCH."""
    try:
        archs = hip.declared_archs(source)
    except hip.HipDeclarationError as exc:
        raise parent.CollectError(f"candidate {source}: {exc}") from None
    return [HipCompileItem.from_parent(parent, name=f"compile[{arch}]", arch=arch)
            for arch in archs]


class HipCompileItem(CompileItem):
    """compile[<arch>]: the candidate's HIP source compiled for one AMD target."""

    compile_source = staticmethod(compile_candidate)


def draft_problem(source: str) -> str:
    """Why a written draft that declares KS_HIP_ARCH does not compile for one of its targets
    (the compiler's first errors), or "" when it compiles, declares none, or no toolchain is
    installed here (its compile items then report it). For the LLM writer's draft check."""
    return compiles.draft_problem(source, "HIP", hip.declared_archs, compile_candidate)
