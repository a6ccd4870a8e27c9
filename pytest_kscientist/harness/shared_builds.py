"""Shared ``load_inline`` builds, made by the pytest process (issue 32; the worker side is
``worker/inline_builds.py``).

The offline scientist's CUDA children change only knob values, which the seed reads at each
call, so their ``load_inline`` sources equal their parent's; each used to build them again in
its own ``ks-<sha>`` folder, while a generation's first check waited. Now a worker whose
sandbox keeps torch's extension root read-only asks this process for each ``load_inline``
call; the build is made here, from the call's arguments alone, into
``<extension root>/src-<hash>`` (the hash of the arguments, the arch flags, the build
environment and the versions of Python and torch), and every later call with the same hash,
in any session, imports it from there.

Why it is safe to share: no candidate code runs here (torch's build steps are run without the
import that ends ``load_inline``), the folder is written under a temporary name and renamed
when complete, and candidates can only read it. A worker that lies about its arguments gets an
honest build of what it said. What a build reads beyond the arguments must be fixed by them:
calls with include paths, flags that name files or plugins, or ``#include`` lines that reach
outside the build folder and the compiler's own paths are declined and built by the candidate
as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kscientist.harness.results import InlineBuild
from pytest_kscientist.worker.inline_builds import BUILD_ENVIRONMENT, FLAGS, SOURCES

# A flag is one token of these characters: no paths ("/"), response files ("@"), spaces or
# ninja's "$".
FLAG = re.compile(r"-[A-Za-z0-9_+\-=.,:]*")
# Options that make a compiler read or run a file named in them (gcc, clang, nvcc), also when
# passed on through -Xcompiler=..., -Wl,... (every piece between "=" and "," is looked at).
FILE_OPTIONS = ("-B", "-I", "-L", "-fplugin", "-specs", "--specs", "-ccbin", "--compiler-bindir",
                "-include", "-imacros", "-iquote", "-isystem", "-idirafter", "-iprefix",
                "-iwithprefix", "-optf", "--options-file", "-fprofile", "-wrapper",
                "--include-path", "--library-path", "-odir", "--output-directory")
ARCH_FLAG = re.compile(r"-gencode=arch=compute_\d+a?,code=(sm|compute)_\d+a?")
# Preprocessor lines that read a file (digraph "%:" too): only a literal <name> or "name" that
# neither starts at "/" nor climbs with ".." is built here; assembler and C23 file embedding,
# and trigraphs ("??=" is "#" under -std=c++98), not at all.
INCLUDE = re.compile(r"^\s*(?:#|%:)\s*(\w+)(.*)$", re.MULTILINE)
READS = ("include", "include_next", "import", "embed")
LITERAL = re.compile(r"""\s*(<[^<>]+>|"[^"]+")\s*(//.*|/\*.*)?""")
EMBEDS = re.compile(r"incbin|\.include|__has_embed|\?\?=", re.IGNORECASE)
MAX_SOURCE_BYTES = 8 << 20
DONE = "ks-built.json"
BUILD_LOG = "ks-build.log"
STALE_S = 3600.0
# Part of every build's key: bump when builds made before may be wrong to read. 2: before it
# the compilers shared /tmp, and a build could hold another's code (compiles.run).
BUILD_FORMAT = 2
# A compiler's or linker's error line (gcc, clang, nvcc "error:", "fatal error:", collect2's).
ERROR_LINE = re.compile(r"\berror( \w+)?:")


def declined_because(args: dict[str, Any], arch: list[str], environment: dict[str, Any]
                     ) -> str | None:
    """Why a load_inline call cannot be built here for sharing; None when it can."""
    name = args.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        return "its module name is not an identifier"
    if any(args.get(key) for key in ("extra_include_paths", "sycl_sources", "with_sycl")):
        return "it names include paths or SYCL sources"
    for key in (*SOURCES, *FLAGS):  # the worker sends lists (inline_builds.normalised)
        if not isinstance(args.get(key) or [], list):
            return f"{key} is {type(args.get(key)).__name__}, not a list"
    for key in FLAGS:
        for flag in args.get(key) or []:
            if not isinstance(flag, str) or not FLAG.fullmatch(flag.strip()):
                return f"{key} holds '{flag}', not one plain flag"
            pieces = re.split(r"[=,]", flag.strip())
            if any(p.startswith(FILE_OPTIONS) for p in pieces):
                return f"{key} holds '{flag}', which names a file"
    if not all(isinstance(a, str) and ARCH_FLAG.fullmatch(a) for a in arch):
        return f"arch flags {arch} are not -gencode flags"
    sources = [s for key in SOURCES for s in args.get(key) or []]
    if not all(isinstance(s, str) for s in sources):
        return "a source is not a string"
    if sum(len(s) for s in sources) > MAX_SOURCE_BYTES:
        return f"its sources exceed {MAX_SOURCE_BYTES >> 20} MB"
    for source in sources:
        for match in INCLUDE.finditer(source):
            if match.group(1) in READS and not _plain_include(match):
                return f"'{match.group(0).strip()}' may read a file outside the build"
        if EMBEDS.search(source):
            return f"its sources hold '{EMBEDS.search(source).group(0)}', which can read a file"
    own = {n: os.environ.get(n) for n in BUILD_ENVIRONMENT}
    if environment != own:
        return "the worker's build environment differs from pytest's"
    return None


def _plain_include(match: re.Match[str]) -> bool:
    """Whether an #include line names a header by a literal relative name without ".."."""
    literal = LITERAL.fullmatch(match.group(2))
    if match.group(1) != "include" or literal is None:
        return False
    name = literal.group(1)[1:-1]
    return not name.startswith("/") and ".." not in name


def build_key(args: dict[str, Any], arch: list[str], environment: dict[str, Any]) -> str:
    """The SHA-256 naming a call's build: what load_inline builds from, and where."""
    import torch

    material = {"format": BUILD_FORMAT, "args": args, "arch": arch,
                "environment": environment, "python": sys.version, "torch": torch.__version__,
                "cuda": torch.version.cuda, "hip": torch.version.hip}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class _Building(threading.local):
    """The build this thread is making, if any: torch's last steps of load_inline then build
    in the sandbox under its deadline, and import nothing."""

    partial: Path | None = None
    root: Path | None = None
    deadline: float = 0.0


# Per thread; the same object for every session of the process, as torch's functions it
# answers are patched once (SharedBuilds._intercept).
_BUILDING = _Building()
# Two first builds at once both passed the check that torch's steps were not yet replaced,
# and the second wrapped the first's wrapper: every later build was declined as Unsupported.
_INTERCEPTING = threading.Lock()


class BuildTimeout(RuntimeError):
    """A shared build ran past its load's deadline and was killed."""


class Unsupported(Exception):
    """This torch's build steps are not the ones the build here takes apart (its private
    functions or their parameters differ): the call is declined, built by the candidate."""


# torch's private functions the build here uses (cpp_extension, torch 2.11 and 2.13).
PYTEST_NEEDS = ("_jit_compile", "_run_ninja_build", "_write_ninja_file_and_build_library",
                "_get_num_workers", "_is_cuda_file")


@dataclass
class SharedBuilds:
    """The builds one pytest session answers (``KsSession.shared_builds``), into ``root``."""

    root: Path
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _turns: dict[str, threading.Lock] = field(default_factory=dict)  # key -> its build's turn
    # key -> the failed build's message: the session's other calls with it get it at once (a
    # generation's children of one broken parent would each build it again).
    _failed: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The temporary folders of builds whose pytest process died (kill -9) an hour ago or
        # more: never renamed, never read.
        for stale in self.root.glob(".src-*"):
            try:
                if time.time() - stale.stat().st_mtime > STALE_S:
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                continue

    def answer(self, request: dict[str, Any], deadline: float) -> tuple[dict[str, Any],
                                                                          InlineBuild]:
        """The reply to a worker's build request, and its record."""
        began = time.monotonic()
        args = request.get("args")
        module = str(args.get("name")) if isinstance(args, dict) else "?"
        arch = request.get("arch_flags")
        environment = request.get("environment")
        if not isinstance(args, dict) or not isinstance(arch, list) or not isinstance(
                environment, dict):
            return {"declined": True}, InlineBuild(module=module, outcome="declined",
                                                   why="a malformed request")
        why = declined_because(args, arch, environment) or _unsupported()
        if why is not None:
            return {"declined": True}, InlineBuild(module=module, outcome="declined", why=why)
        key = build_key(args, arch, environment)
        folder = self.root / f"src-{key[:32]}"
        # One build of a key at a time in this session; the others wait for it and load it.
        with self._lock:
            turn = self._turns.setdefault(key, threading.Lock())
        if not turn.acquire(timeout=max(0.0, deadline - time.monotonic())):
            reason = f"load_inline build of '{module}' did not finish before the load's deadline"
            return {"ok": False, "reason": reason}, self._record(module, key, "failed", began)
        try:
            if (folder / DONE).exists():
                outcome = "reused"
            elif key in self._failed:
                return ({"ok": False, "reason": self._failed[key]},
                        self._record(module, key, "failed", began))
            else:
                try:
                    failure, kept = self._build(args, arch, folder, deadline)
                except Unsupported as exc:
                    return {"declined": True}, InlineBuild(module=module, outcome="declined",
                                                           why=str(exc))
                if failure is not None:
                    if kept:
                        self._failed[key] = failure
                    return ({"ok": False, "reason": failure},
                            self._record(module, key, "failed", began))
                outcome = "built"
        finally:
            turn.release()
        reply = {"ok": True, "folder": str(folder), "module": module}
        return reply, self._record(module, key, outcome, began)

    @staticmethod
    def _record(module: str, key: str, outcome: str, began: float) -> InlineBuild:
        return InlineBuild(module=module, key=key[:16], outcome=outcome,  # type: ignore[arg-type]
                           seconds=time.monotonic() - began)

    def _build(self, args: dict[str, Any], arch: list[str], folder: Path, deadline: float
               ) -> tuple[str | None, bool]:
        """Build ``args`` into ``folder`` (renamed from a temporary folder when complete);
        the compiler's message when it fails or outlives ``deadline``, and whether that
        verdict holds for every call with these arguments (a timeout is this load's)."""
        from torch.utils import cpp_extension

        from pytest_kscientist.worker.runner import guard_pch

        guard_pch(cpp_extension, str(self.root))
        self._intercept(cpp_extension)
        partial = self.root / f".{folder.name}-{uuid.uuid4().hex[:8]}"
        partial.mkdir()
        call = dict(args)
        if arch:
            call["extra_cuda_cflags"] = [*call.get("extra_cuda_cflags", []), *arch]
        began = time.monotonic()
        _BUILDING.partial, _BUILDING.root, _BUILDING.deadline = partial, self.root, deadline
        try:
            cpp_extension.load_inline(**call, build_directory=str(partial), verbose=False)
            error: BaseException | None = None
        except Unsupported:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        except BuildTimeout as exc:
            _settle(partial)
            shutil.rmtree(partial, ignore_errors=True)
            return (f"load_inline build of '{args['name']}' did not finish within "
                    f"{time.monotonic() - began:.0f} s ({exc}) and was killed; raise "
                    "--ks-timeout or build less"), False
        except Exception as exc:  # noqa: BLE001 - a failed build is the candidate's verdict
            error = exc
        finally:
            _BUILDING.partial = None
        library = partial / f"{args['name']}{getattr(cpp_extension, 'LIB_EXT', '.so')}"
        if error is None and not library.is_file():
            error = RuntimeError(f"the build made no {library.name}")
        if error is not None:
            shutil.rmtree(partial, ignore_errors=True)
            # The temporary folder's path, on every line of the output, says nothing to them.
            return _failure(args["name"], str(error).replace(f"{partial}{os.sep}", "")), True
        (partial / DONE).write_text(json.dumps({"module": args["name"],
                                                "seconds": time.monotonic() - began}))
        try:
            partial.rename(folder)
        except OSError:  # another process finished the same build first
            shutil.rmtree(partial, ignore_errors=True)
        return None, True

    @staticmethod
    def _intercept(cpp_extension: Any) -> None:
        """In this session's build threads only, make load_inline's last step build without
        importing (the module's initialisers would run candidate code in this process) and
        without torch's versioning by name, and run ninja in the sandbox under the deadline."""
        with _INTERCEPTING:  # the check and the patch as one step
            if not hasattr(cpp_extension._jit_compile, "ks_original"):  # not yet
                SharedBuilds._patch(cpp_extension)

    @staticmethod
    def _patch(cpp_extension: Any) -> None:
        import inspect

        jit, ninja = cpp_extension._jit_compile, cpp_extension._run_ninja_build
        build = cpp_extension._write_ninja_file_and_build_library
        jit_signature = inspect.signature(jit)
        parameters = inspect.signature(build).parameters
        named = {n: p for n, p in parameters.items()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        takes = None if len(named) < len(parameters) else set(named)  # None: **kwargs too
        required = [n for n, p in named.items() if p.default is inspect.Parameter.empty]
        local = _BUILDING

        def jit_compile(*args: Any, **kwargs: Any) -> Any:
            if local.partial is None:
                return jit(*args, **kwargs)
            try:
                given = jit_signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise Unsupported(f"torch's _jit_compile was called otherwise: {exc}") from None
            given.apply_defaults()
            values = dict(given.arguments)
            missing = [n for n in required if n not in values]
            if missing:
                raise Unsupported(f"torch's build step needs {missing}, which load_inline "
                                  "does not pass here")
            build(**{k: v for k, v in values.items() if takes is None or k in takes})
            return None

        def run_ninja(build_directory: str, verbose: bool, error_prefix: str) -> None:
            if local.partial is None:
                return ninja(build_directory, verbose, error_prefix)
            jobs = cpp_extension._get_num_workers(False)
            command = ["ninja", "-v", *(["-j", str(jobs)] if jobs is not None else [])]
            code, output = _sandboxed(command, local.root, local.partial,
                                      max(1.0, local.deadline - time.monotonic()))
            if code is None:
                raise BuildTimeout("the load's deadline")
            if code:
                raise RuntimeError(f"{error_prefix}: {output}")
            # What verbose=True would have printed (ptxas -v's registers, warnings), kept.
            Path(build_directory, BUILD_LOG).write_text(output)
            return None

        jit_compile.ks_original = jit  # type: ignore[attr-defined]
        run_ninja.ks_original = ninja  # type: ignore[attr-defined]
        cpp_extension._jit_compile = jit_compile
        cpp_extension._run_ninja_build = run_ninja


def _unsupported() -> str | None:
    """Why this torch's cpp_extension cannot be built here (PYTEST_NEEDS), or None."""
    from torch.utils import cpp_extension

    missing = [name for name in PYTEST_NEEDS if not hasattr(cpp_extension, name)]
    return f"this torch's cpp_extension lacks {missing}" if missing else None


def _sandboxed(command: list[str], root: Path, partial: Path, timeout_s: float
               ) -> tuple[int | None, str]:
    """Run ``command`` in ``partial`` in the workers' sandbox, where only ``partial`` of the
    extension root is writable (the project and working folder read-only, no network)."""
    from pytest_kscientist.harness.compiles import run
    from pytest_kscientist.harness.mounts import protected_paths, sandbox_available, sandbox_prefix

    protect = (*protected_paths(Path.cwd() / "build"), root)
    prefix = (sandbox_prefix(protect, (partial,))
              if sandbox_available(protect, (partial,)) is None else [])
    return run([*prefix, *command], partial, timeout_s)


# What torch.utils.cpp_extension says when it is asked for CUDA sources without a toolkit.
NO_CUDA = "CUDA_HOME environment variable is not set"


def _failure(module: str, output: str) -> str:
    """A failed build's message: the count of errors, the compiler's output (its end), and
    the first error last, where a one-line report of it looks."""
    lines = output.strip().splitlines() or ["no output"]
    errors = [ln.strip() for ln in lines if ERROR_LINE.search(ln)]
    first = errors[0] if errors else lines[-1].strip()
    if NO_CUDA in output:  # GPU MODE's CUDA files declare no device: say what is missing
        first = (f"{first} (this machine's torch finds no CUDA toolkit: a CUDA candidate runs "
                 'where torch has one; KS_REQUIRES = "cuda" in the file skips it elsewhere)')
    return (f"load_inline build of '{module}' failed ({len(errors)} error line(s)); the "
            f"compiler's output:\n{output.strip()[-6000:]}\nfirst error: {first}")


def working_in(folder: Path) -> list[int]:
    """The processes whose working folder is ``folder`` or inside it (ninja runs in a build's
    folder, and the compilers it starts inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = Path(os.readlink(entry / "cwd"))
            except OSError:
                continue
            if cwd == folder or folder in cwd.parents:
                found.append(int(entry.name))
    return found


def _settle(folder: Path, timeout_s: float = 10.0) -> None:
    """Wait until no process works in ``folder``: a killed sandbox's PID namespace takes its
    compilers down a moment after its first process."""
    deadline = time.monotonic() + timeout_s
    while working_in(folder) and time.monotonic() < deadline:
        time.sleep(0.05)

