"""``compile[<arch>]`` items: every HIP candidate compiled for each declared target, anywhere.

No AMD GPU is needed: the candidate's device source (``hip.read_source``) is compiled with a
real AMDGPU toolchain (``hip_toolchain.find``) in a sandboxed subprocess with a timeout, the way
``load_inline`` compiles it on ROCm torch (its prelude and flags, hipcc's ``-O3``), device code
only. The item fails with the compiler's first errors, at the candidate's own lines, and passes
with each kernel's resources (VGPRs, AGPRs, SGPRs, LDS, occupancy, spills) from
``-Rpass-analysis=kernel-resource-usage``; they travel to the summary and ``--ks-json``. Without
a toolchain the item skips with the command that installs it.

A compile is a pure function of its inputs, so its result is kept on disk by their hash (the
translation unit, the command line, the compiler's and headers' versions, torch's version):
``$KS_COMPILE_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/pytest-kscientist/hip-compiles``
(``KS_COMPILE_CACHE=off``: none). Every ``pytest tasks/fp8_gemm`` compiled the HIP seed again
(14-18 s of CPU a target on a 2-core machine); now the first run does. The pytest process writes
the file after the sandboxed compiler exits, so a candidate writes no entry, and an entry
answers only the same inputs. A result that took longer than this run's ``--ks-timeout`` is
compiled again (under this timeout it would not have finished).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.errors import KsError
from pytest_kscientist.harness.results import CompileResult, KernelResources
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
MAX_ERRORS = 3
CACHE_FORMAT = "1"  # bump when CompileResult or what a compile reads changes


class CompileFailure(KsError):
    """A compile[<arch>] item's verdict: the source does not compile for the target."""


def command(tc: hip_toolchain.Toolchain, arch: str, source: hip.HipSource, unit: Path,
            obj: Path) -> list[str]:
    """The compiler's command line for one target (device code only, with resource remarks)."""
    cmd = [str(tc.clang), "-x", "hip", f"--offload-arch={arch}", f"--hip-path={tc.hip_path}"]
    if tc.device_libs is not None:
        cmd.append(f"--rocm-device-lib-path={tc.device_libs}")
    for folder in (*tc.includes, *tc.torch_includes, *tc.python_includes):
        cmd += ["-isystem", str(folder)]
    if tc.define_wavefront:
        # gfx9 (CDNA, GCN) runs 64-wide waves by default, gfx10+ (RDNA) 32-wide.
        cmd.append(f"-D__AMDGCN_WAVEFRONT_SIZE={64 if arch[3] == '9' else 32}")
    cmd += [*LOAD_INLINE_FLAGS, f"-DTORCH_EXTENSION_NAME={source.module_name}", *source.flags,
            "--cuda-device-only", "-c", "-o", str(obj), "-fno-color-diagnostics",
            "-Rpass-analysis=kernel-resource-usage", str(unit)]
    return cmd


@functools.cache
def compiler_version(compiler: Path, marker: str = "") -> str:
    """The compiler's first ``--version`` line, or its last one holding ``marker`` (nvcc's
    "release" line)."""
    try:
        out = subprocess.run([str(compiler), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [line.strip() for line in out.splitlines() if marker in line]
    return (lines[-1] if marker else lines[0]) if lines else "unknown"


def compiler_sandbox(candidate: Path) -> list[str]:
    """The worker's OS sandbox (no network, read-only project) where it works here, else []
    with one warning."""
    from pytest_kscientist.harness.spawn import protected_paths, sandbox_available, sandbox_prefix

    protect = tuple(protected_paths(candidate))
    why = sandbox_available(protect)
    if why is None:
        return sandbox_prefix(protect)
    _warn_unsandboxed(why)
    return []


@functools.cache
def _warn_unsandboxed(why: str) -> None:
    from pytest_kscientist.harness.spawn import KsSandboxUnavailable

    warnings.warn(KsSandboxUnavailable(
        f"compile items run the compiler without the OS sandbox (unshare: {why}): a candidate's "
        "source can then include files of this machine into the compiler's messages; allow "
        "unprivileged user namespaces to sandbox it"), stacklevel=2)


def run(cmd: list[str], cwd: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group; (exit code or None on timeout, output)."""
    from pytest_kscientist.harness.spawn import clean_environment

    env = clean_environment("cpu")
    env["HIP_PLATFORM"] = "amd"  # nvcc on the PATH would otherwise pick the NVIDIA platform
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def shorten(text: str, unit_dir: Path, tc: hip_toolchain.Toolchain) -> str:
    """Diagnostics with the temporary folder and the header trees' long paths cut down."""
    text = text.replace(f"{unit_dir}/", "")
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
    names = _demangled([k["name"] for k in kernels])
    return [KernelResources.model_validate({**k, "name": n}) for k, n in zip(kernels, names,
                                                                              strict=True)
            if {"vgprs", "sgprs", "lds_bytes", "occupancy_waves_per_simd"} <= k.keys()]


def _demangled(names: list[str]) -> list[str]:
    """Kernel names without their C++ mangling and parameters (c++filt when installed)."""
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if not names or tool is None:
        return names
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                             timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return names
    if len(out) != len(names):
        return names
    return [n.split("(")[0].removeprefix("void ") for n in out]


def compile_candidate(path: Path, arch: str, timeout_s: float) -> CompileResult:
    """Compile the candidate's device source for ``arch``: passed, failed or skipped."""
    tc = hip_toolchain.find()
    if isinstance(tc, str):
        return CompileResult(arch=arch, outcome="skipped", reason=(
            f"no AMDGPU toolchain to compile for {arch} ({tc}); install it with: "
            f"{hip_toolchain.install_command()}"))
    try:
        source = hip.read_source(path)
    except hip.HipSourceError as exc:
        return CompileResult(arch=arch, outcome="failed", reason=str(exc))
    with tempfile.TemporaryDirectory(prefix="ks-hip-") as tmp:
        folder = Path(tmp)
        unit = folder / f"{path.stem}.hip"
        text = hip.translation_unit(source, path.name)
        unit.write_text(text, encoding="utf-8")
        cmd = command(tc, arch, source, unit, folder / f"{path.stem}.o")
        key = cache_key(compiler_version(tc.clang), tc.versions, text,
                        *(part.replace(tmp, "<unit>") for part in cmd))
        kept = cached(key, timeout_s)
        if kept is not None:
            return kept
        sandbox = compiler_sandbox(path)
        start = time.perf_counter()
        code, output = run([*sandbox, *cmd], folder, timeout_s)
        seconds = time.perf_counter() - start
        output = shorten(output, folder, tc)
    result = CompileResult(arch=arch, outcome="passed", seconds=seconds,
                           compiler=compiler_version(tc.clang), toolchain=tc.versions,
                           ignored_flags=source.ignored_flags, sandboxed=bool(sandbox),
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


def killed(result: CompileResult, who: str, timeout_s: float) -> None:
    """``result`` made the verdict on a compiler stopped at the timeout."""
    result.outcome = "failed"
    result.reason = (f"{who} did not finish within {timeout_s:g} s (--ks-timeout) and was "
                     "killed; simplify the source or raise --ks-timeout")


def keep_verdict(key: str, result: CompileResult, code: int | None, output: str,
                 error: re.Pattern[str]) -> None:
    """Keep ``result`` unless it is a timeout's or a compiler's that died without an error line
    (neither is a property of the source)."""
    if code == 0 or (code is not None and any(map(error.match, output.splitlines()))):
        keep(key, result)


def cache_folder() -> Path | None:
    """Where compile results are kept (module docstring); None when ``KS_COMPILE_CACHE=off``."""
    chosen = os.environ.get("KS_COMPILE_CACHE", "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-kscientist" / "hip-compiles"


def cache_key(*parts: str) -> str:
    """The key a compile's result is kept under: its format, torch's version and ``parts``
    (the compiler's and headers' versions, the unit's text, the command line)."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    digest = hashlib.sha256()
    for part in (CACHE_FORMAT, torch_version, *parts):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def cached(key: str, timeout_s: float) -> CompileResult | None:
    """The kept result for ``key``, if there is one that finished within ``timeout_s``."""
    folder = cache_folder()
    if folder is None:
        return None
    try:
        result = CompileResult.model_validate_json((folder / f"{key}.json").read_bytes())
    except (OSError, ValueError):
        return None  # none yet, unreadable or from another format: compile again
    if result.seconds is None or result.seconds > timeout_s:
        return None
    return result.model_copy(update={"cached": True})


def keep(key: str, result: CompileResult) -> None:
    """Write ``result`` for ``key`` (atomically; a cache that cannot be written is no cache)."""
    folder = cache_folder()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key[:16]}-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(result.model_dump_json())
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass


def resource_line(result: CompileResult) -> str:
    """One line per compile item: the kernels' resources, or why it failed or skipped."""
    head = f"compile[{result.arch}]"
    if result.outcome != "passed":
        first = result.reason.splitlines()[0] if result.reason else ""
        return f"{head} {result.outcome}: {first}"
    kernels = "; ".join(
        f"{k.name}: {k.registers} registers, spills {k.spill_store_bytes or 0} B stored "
        f"{k.spill_load_bytes or 0} B loaded, stack {k.stack_bytes or 0} B, static shared "
        f"{k.shared_bytes or 0} B" if k.registers is not None else
        f"{k.name}: {k.vgprs} VGPRs, {k.agprs} AGPRs, {k.sgprs} SGPRs, {k.lds_bytes} B LDS, "
        f"occupancy {k.occupancy_waves_per_simd} waves/SIMD, spills {k.vgpr_spills} VGPR "
        f"{k.sgpr_spills} SGPR, scratch {k.scratch_bytes_per_lane} B/lane"
        for k in result.kernels) or "no kernels"
    took = f"{result.seconds or 0:.1f} s" + (", kept from an earlier compile" if result.cached
                                            else "")
    return f"{head} {kernels} ({took})"


class CompileItem(pytest.Item):
    """compile[<arch>]: the candidate's HIP source compiled for one target."""

    def __init__(self, *, arch: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arch = arch
        self.add_marker(pytest.mark.kscientist)
        self.result: CompileResult | None = None  # compiled ahead (compile_ahead)

    def compile(self) -> CompileResult:
        cand: Any = self.parent
        return compile_candidate(cand.source, self.arch, cand.ks.settings.timeout_s)

    def runtest(self) -> None:
        cand: Any = self.parent
        result = self.result or self.compile()
        self.user_properties.append(("ks_compile", {
            "task": cand.task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "role": cand.role, "result": result.model_dump(),
        }))
        if result.outcome == "skipped":
            raise pytest.skip.Exception(result.reason, _use_item_location=True)
        if result.outcome == "failed":
            raise CompileFailure(result.reason, result.detail)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, CompileFailure):
            reason, detail = exc.args
            text = f"{self.parent.name} does not compile for {self.arch}:\n{reason}"
            return text + (f"\n\ncompiler output:\n{detail.rstrip()}" if detail else "")
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self.parent.name}::{self.name}"


def compile_ahead(items: list[Any], jobs: int) -> int:
    """Compile every compile item of ``items``, ``jobs`` at once, before the first item runs
    (each item then reports its result); returns how many. Each compile is one single-threaded
    clang that parses torch's headers (8-10 s on the 2-core CPU): one after another, a
    session's compiles left all cores but one idle."""
    todo = [item for item in items if isinstance(item, CompileItem) and item.result is None]
    if len(todo) < 2 or jobs < 2:
        return 0
    with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
        for item, result in zip(todo, pool.map(lambda item: item.compile(), todo), strict=True):
            item.result = result
    return len(todo)


def compile_items(parent: pytest.Collector, source: Path) -> list[pytest.Item]:
    """One compile[<arch>] item per target the candidate declares in KS_HIP_ARCH."""
    try:
        archs = hip.declared_archs(source)
    except hip.HipDeclarationError as exc:
        raise parent.CollectError(f"candidate {source}: {exc}") from None
    return [CompileItem.from_parent(parent, name=f"compile[{arch}]", arch=arch) for arch in archs]


def summary_lines(cands: list[Any]) -> list[str]:
    """The summary's lines for every compile item: candidate, target, resources or errors."""
    return [f"{c.name} {resource_line(r)}" for c in cands for r in c.compiles]


DRAFT_TIMEOUT_S = 120.0


def draft_problem(source: str) -> str:
    """Why a written draft that declares KS_HIP_ARCH does not compile for one of its targets
    (the compiler's first errors), or "" when it compiles, declares none, or no toolchain is
    installed here (its compile items then report it). For the LLM writer's draft check."""
    with tempfile.TemporaryDirectory(prefix="ks-draft-") as tmp:
        path = Path(tmp) / "draft.py"
        path.write_text(source, encoding="utf-8")
        try:
            archs = hip.declared_archs(path)
        except hip.HipDeclarationError as exc:
            return str(exc)
        for arch in archs:
            result = compile_candidate(path, arch, DRAFT_TIMEOUT_S)
            if result.outcome == "failed":
                return f"the HIP source does not compile for {arch}:\n{result.reason}"
    return ""
