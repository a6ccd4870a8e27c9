"""What the compile items of every language share (``hip.compile_gate``,
``cuda.compile_gate``): the item, compiles run ahead in parallel, the compiler's process in the
workers' sandbox with a timeout, the summary line, and results kept on disk.

A compile is a pure function of its inputs, so its result is kept by their hash (the unit's
text, the command line, the compiler's and headers' versions, torch's version):
``$KS_COMPILE_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/pytest-kscientist/hip-compiles``
(``KS_COMPILE_CACHE=off``: none; the folder keeps the name it had when only HIP compiles were
kept). Every ``pytest tasks/fp8_gemm`` compiled the HIP seed again (14.7-17.6 s a target on the
2-core CPU); now the first run does. The pytest process writes an entry after the sandboxed
compiler exits, so a candidate writes none, and an entry answers only the same inputs. A
result that took longer than this run's ``--ks-timeout`` is compiled again (under this timeout
it would not have finished); timeouts and compilers that died without an error line are not
kept.
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.errors import KsError
from pytest_kscientist.harness.failures import failure_repr
from pytest_kscientist.harness.files import atomic_write
from pytest_kscientist.harness.mounts import (
    KsSandboxUnavailable,
    cache_folder,
    sandbox_plan,
    sandbox_prefix,
    warn_cache_writable,
)
from pytest_kscientist.harness.results import CompileResult, report_property

MAX_ERRORS = 3
# Bump when CompileResult or what a compile reads changes. "2": before it, compilers in
# sandboxes shared /tmp, where nvcc's temporary files of two compiles could be one another's
# (``run``), so a kept result may describe another unit.
CACHE_FORMAT = "2"


class CompileFailure(KsError):
    """A compile[<arch>] item's verdict: the source does not compile for the target."""


@dataclass(frozen=True)
class Ran:
    """A compiler's run: its exit code (None: killed at the timeout), its output with the
    temporary folder's path cut out, how long it took, whether it ran in the sandbox."""

    code: int | None
    output: str
    seconds: float
    sandboxed: bool


def compile_kept(candidate: Path, unit_name: str, text: str,
                 command: Callable[[Path, Path], list[str]], versions: Sequence[str],
                 timeout_s: float, env: dict[str, str] | None = None
                 ) -> tuple[str, CompileResult | Ran]:
    """Write ``text`` as ``unit_name`` in a temporary folder and compile it with
    ``command(unit, object)`` in ``candidate``'s sandbox, unless a result for the same inputs
    (``versions``, the text, the command line) is kept: (the key, the kept result or the run)."""
    with tempfile.TemporaryDirectory(prefix="ks-compile-") as tmp:
        unit = Path(tmp) / unit_name
        unit.write_text(text, encoding="utf-8")
        cmd = command(unit, unit.with_suffix(".o"))
        key = cache_key(*versions, text, *(part.replace(tmp, "<unit>") for part in cmd))
        kept = cached(key, timeout_s)
        if kept is not None:
            return key, kept
        sandbox = compiler_sandbox(candidate)
        start = time.perf_counter()
        code, output = run([*sandbox, *cmd], Path(tmp), timeout_s, env)
        return key, Ran(code, output.replace(f"{tmp}/", ""), time.perf_counter() - start,
                        bool(sandbox))


DRAFT_TIMEOUT_S = 120.0


def draft_problem(source: str, language: str, targets: Callable[[Path], list[str]],
                  compile_one: Callable[[Path, str, float], CompileResult]) -> str:
    """Why a written draft does not compile for one of the targets ``targets`` finds in it
    (``compile_one``'s first errors), or "" when it compiles, declares none, or cannot be
    compiled here (no compiler: its compile items and worker say so). A ``ValueError`` from
    ``targets`` (a malformed declaration) is the problem. For the LLM writer's draft check."""
    with tempfile.TemporaryDirectory(prefix="ks-draft-") as tmp:
        path = Path(tmp) / "draft.py"
        path.write_text(source, encoding="utf-8")
        try:
            archs = targets(path)
        except ValueError as exc:
            return str(exc)
        for arch in archs:
            result = compile_one(path, arch, DRAFT_TIMEOUT_S)
            if result.outcome == "failed":
                return f"the {language} source does not compile for {arch}:\n{result.reason}"
    return ""


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
    """The workers' OS sandbox (no network; the project, the builds, the kept verdicts, the
    workers' folders and caches read-only: ``mounts.sandbox_plan``) where it works here, else
    [] with one warning. The CUDA items import the candidate in it (``cuda/compile_gate``):
    before, that import could write what a worker cannot, other candidates' builds and the
    kept verdicts included."""
    mounts, why, cache_why = sandbox_plan(candidate, None)
    if mounts is not None:
        if cache_why is not None:
            warn_cache_writable(cache_why)
        return sandbox_prefix(*mounts)
    _warn_unsandboxed(why or "unknown")
    return []


@functools.cache
def _warn_unsandboxed(why: str) -> None:
    warnings.warn(KsSandboxUnavailable(
        f"compile items run the compiler without the OS sandbox (unshare: {why}): a candidate's "
        "source can then include files of this machine into the compiler's messages; allow "
        "unprivileged user namespaces to sandbox it"), stacklevel=2)


def run(cmd: list[str], cwd: Path, timeout_s: float,
        env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group, in the workers' scrubbed environment plus ``env``;
    (exit code or None on timeout, output). The group dies with this process (a lifeline: a
    ``kill -9`` of pytest leaves no compiler running beside the next session's timing).

    Each run gets a temporary folder of its own as ``TMPDIR``, removed after it. In the sandbox
    every command has its own PID namespace, so two compilers at once have the same PIDs, and
    nvcc names its intermediate files in ``TMPDIR`` by PID: with /tmp shared, a compile read
    another's files (on an H100 three of a session's four shared builds failed with the same
    errors; on the CPU two nvcc runs made one object, the other's kernels in both)."""
    from pytest_kscientist.harness.lifeline import Lifeline
    from pytest_kscientist.harness.spawn import clean_environment

    with tempfile.TemporaryDirectory(prefix="ks-tmp-", ignore_cleanup_errors=True) as private:
        env = {**clean_environment("cpu"), **(env or {}), "TMPDIR": private}
        lifeline = Lifeline()
        try:
            proc = subprocess.Popen(lifeline.command(cmd, group=True), cwd=cwd, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", start_new_session=True,
                                    pass_fds=(lifeline.read_fd,))
            lifeline.started()
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                return None, out
            return proc.returncode, out
        finally:
            lifeline.cut()  # kills the group if it still runs (an interrupt during the wait)


def demangled(names: list[str]) -> list[str]:
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
        atomic_write(folder / f"{key}.json", result.model_dump_json())
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
    """compile[<arch>]: the candidate's source compiled for one target (each language's
    subclass, in hip.compile_gate and cuda.compile_gate, names its ``compile_source``)."""

    def __init__(self, *, arch: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arch = arch
        self.add_marker(pytest.mark.kscientist)
        self.result: CompileResult | None = None  # compiled ahead (compile_ahead)

    # The language's compile: (candidate file, target, timeout) -> its result.
    compile_source: Callable[[Path, str, float], CompileResult]

    def compile(self) -> CompileResult:
        cand: Any = self.parent
        return type(self).compile_source(cand.source, self.arch, cand.ks.settings.timeout_s)

    def runtest(self) -> None:
        cand: Any = self.parent
        result = self.result or self.compile()
        self.user_properties.append(("ks_compile", report_property({
            "task": cand.task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "role": cand.role, "result": result.model_dump(mode="json"),
        })))
        if result.outcome == "skipped":
            raise pytest.skip.Exception(result.reason, _use_item_location=True)
        if result.outcome == "failed":
            raise CompileFailure(result.reason, result.detail)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, CompileFailure):
            reason, detail = exc.args
            head = f"{self.parent.name} does not compile for {self.arch}:"
            text = f"{head}\n{reason}"
            text += f"\n\ncompiler output:\n{detail.rstrip()}" if detail else ""
            first = reason.strip().splitlines()[0] if reason.strip() else ""
            return failure_repr(self, text, self.parent.source, line=f"{head} {first}")
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


def summary_lines(cands: list[Any]) -> list[str]:
    """The summary's lines for every compile item: candidate, target, resources or errors."""
    return [f"{c.name} {resource_line(r)}" for c in cands for r in c.compiles]
