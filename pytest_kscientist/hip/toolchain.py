"""Find the AMDGPU toolchain the compile gate runs: clang, HIP headers, device-library bitcode.

Looked for, in order:
1. ``$KS_HIP_ROOT`` or ``${XDG_CACHE_HOME:-~/.cache}/pytest-kscientist/hip``, the tree that
   ``tools/install_hip_toolchain.sh`` unpacks (HIP, rocPRIM and rocThrust headers, LLVM-22
   bitcode) beside the system's ``clang++-22`` (``$KS_HIP_CLANG`` overrides it);
2. a ROCm install at ``$ROCM_PATH`` (default ``/opt/rocm``), with its own ``llvm/bin/clang++``.
The header folders of torch and of this interpreter are load_inline's own: torch's
``cpp_extension.include_paths()`` (torch is imported for it, when the gate first compiles) and
``sysconfig``'s ``posix_prefix`` include folder, where Python.h is (a virtualenv's sys.prefix
has none: its headers stay under the base interpreter's). Nothing here starts a process: the gate
learns the compiler's version from its first compile.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

INSTALLER = "tools/install_hip_toolchain.sh"


@dataclass(frozen=True)
class Toolchain:
    """A compiler and the trees it needs, as paths."""

    clang: Path
    hip_path: Path  # --hip-path: the folder holding include/hip
    device_libs: Path | None  # --rocm-device-lib-path; None: the compiler finds its own
    includes: tuple[Path, ...]  # -isystem, before torch's
    torch_includes: tuple[Path, ...]
    python_includes: tuple[Path, ...]  # after torch's, as load_inline orders them
    versions: str  # what was installed, one line ("" when unknown)
    # HIP 6.x headers read __AMDGCN_WAVEFRONT_SIZE, which clang 22 no longer defines.
    define_wavefront: bool


def default_root() -> Path:
    """Where the installer puts the unpacked packages unless told otherwise."""
    if os.environ.get("KS_HIP_ROOT"):
        return Path(os.environ["KS_HIP_ROOT"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pytest-kscientist" / "hip"


def install_command() -> str:
    """The command that installs the toolchain, with the installer's path in this checkout."""
    script = Path(__file__).resolve().parents[2] / INSTALLER
    where = str(script) if script.is_file() else f"{INSTALLER} (in a pytest-kscientist checkout)"
    return f"bash {where}"


def torch_includes() -> tuple[Path, ...]:
    """The folders load_inline passes for torch's headers: ``include_paths()`` of
    torch.utils.cpp_extension, with a ROCm torch's THH and ROCm folders ("cuda"); () when
    torch or its headers are not installed."""
    if importlib.util.find_spec("torch") is None:
        return ()
    try:
        from torch.utils import cpp_extension
    except ImportError:
        return ()
    try:
        paths = cpp_extension.include_paths("cuda" if cpp_extension.IS_HIP_EXTENSION else "cpu")
    except OSError:  # a ROCm torch that finds no ROCM_HOME: torch's own folders still hold
        paths = cpp_extension.include_paths("cpu")
    found = tuple(Path(p) for p in paths)
    return found if any((p / "torch" / "types.h").is_file() for p in found) else ()


def python_includes() -> tuple[Path, ...]:
    """The folder load_inline passes for Python.h (<torch/extension.h> includes it):
    sysconfig's ``posix_prefix`` include path, the base interpreter's in a virtualenv."""
    found = sysconfig.get_path("include", scheme="posix_prefix")
    return (Path(found),) if found else ()


def _unpacked(root: Path) -> Toolchain | str:
    clang_name = os.environ.get("KS_HIP_CLANG", "clang++-22")
    clang = shutil.which(clang_name)
    tree = root / "tree" / "usr"
    if not (tree / "include" / "hip" / "hip_runtime.h").is_file():
        return f"no HIP headers under {tree / 'include' / 'hip'}"
    bitcode = sorted(tree.glob("lib/llvm-*/lib/clang/*/amdgcn/bitcode"))
    if not bitcode:
        return f"no device-library bitcode under {tree / 'lib'}"
    if clang is None:
        return f"no {clang_name} on PATH"
    versions = (root / "VERSIONS").read_text(encoding="utf-8", errors="replace") if (
        root / "VERSIONS").is_file() else ""
    return Toolchain(clang=Path(clang), hip_path=tree, device_libs=bitcode[-1],
                     includes=(tree / "include",), torch_includes=torch_includes(),
                     python_includes=python_includes(),
                     versions=", ".join(versions.split("\n")).strip(", "),
                     define_wavefront=True)


def _rocm(root: Path) -> Toolchain | str:
    clang = root / "llvm" / "bin" / "clang++"
    if not (root / "include" / "hip" / "hip_runtime.h").is_file() or not clang.is_file():
        return f"no ROCm install at {root}"
    version = root / ".info" / "version"
    return Toolchain(clang=clang, hip_path=root, device_libs=None, includes=(),
                     torch_includes=torch_includes(), python_includes=python_includes(),
                     versions=f"ROCm {version.read_text().strip()}" if version.is_file() else "",
                     define_wavefront=False)


def find() -> Toolchain | str:
    """The toolchain, or why none was found (one clause per place looked at)."""
    found = _unpacked(default_root())
    if isinstance(found, Toolchain):
        why = ""
    else:
        why = found
        found = _rocm(Path(os.environ.get("ROCM_PATH", "/opt/rocm")))
        if isinstance(found, str):
            why = f"{why}; {found}"
    if isinstance(found, str):
        return why
    if not found.torch_includes:
        return "torch's C++ headers are not installed (load_inline's source includes them)"
    return found
