"""Worker side of shared ``load_inline`` builds (issue 32; the pytest side is
``harness/shared_builds.py``).

A candidate's ``torch.utils.cpp_extension.load_inline`` is answered by the pytest process: the
worker sends the call's arguments (normalised to JSON) with the CUDA arch flags torch would add
here, the pytest process builds them into a folder of torch's extension root named by their
hash (or finds that folder built already: a child whose sources equal its parent's) and
answers with it, and the worker imports the module from there as load_inline would. The folder
is read-only in every worker's sandbox, and no candidate code runs in the process that builds
it, so a candidate gets an honest build of exactly what it asked for and cannot hand another
candidate a build of its own making.

Calls the pytest process declines (a build folder of their own, include paths, flags that name
files: ``harness/shared_builds.py`` says which) go to torch's own load_inline as before, into
the candidate's own ``ks-<sha>`` folder.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

# Environment variables a build reads; the pytest process builds only when the worker's values
# equal its own (a candidate that changed them builds on its own). TORCH_CUDA_ARCH_LIST, which
# GPU MODE files often set before load_inline, is not among them: the arch flags it makes are
# computed here and sent with the call (``arch_flags``).
BUILD_ENVIRONMENT = ("CXX", "CC", "CUDA_HOME", "CUDA_PATH", "ROCM_HOME", "NVCC_APPEND_FLAGS",
                     "NVCC_PREPEND_FLAGS", "PYTORCH_NVCC")
# torch's private functions the worker side uses (a torch without them builds on its own).
WORKER_NEEDS = ("_get_cuda_arch_flags", "_import_module_from_library")
# load_inline's arguments that do not change what is built.
UNBUILT = ("verbose", "keep_intermediates", "build_directory")
SOURCES = ("cpp_sources", "cuda_sources", "sycl_sources")
FLAGS = ("extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags",
         "extra_include_paths")


def extensions_base() -> str:
    """Torch's extension build root as torch computes it (``TORCH_EXTENSIONS_DIR``, else
    ``<XDG_CACHE_HOME or ~/.cache>/torch_extensions``), before its per-Python folder."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_extensions")


def builds_extensions(source: bytes) -> bool:
    """Whether a candidate file builds torch extensions (says load_inline or cpp_extension):
    such a file gets a build folder of its own (mounts.build_folder) and this module's
    load_inline."""
    return b"load_inline" in source or b"cpp_extension" in source


def normalised(bound: dict[str, Any]) -> dict[str, Any] | None:
    """load_inline's bound arguments as plain JSON (sources and flags as lists of strings);
    None when a value is of another kind (the call then goes to torch's own load_inline)."""
    out: dict[str, Any] = {}
    for name, value in bound.items():
        if name in UNBUILT:
            continue
        if name in SOURCES or name in FLAGS:
            value = [value] if isinstance(value, str) else list(value or [])
            if not all(isinstance(v, str) for v in value):
                return None
        elif name == "functions":
            if isinstance(value, (list, tuple)):
                value = list(value)
            if not (value is None or isinstance(value, str) or
                    (isinstance(value, list) and all(isinstance(v, str) for v in value)) or
                    (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()))):
                return None
        elif not (value is None or isinstance(value, (bool, str))):
            return None
        out[name] = value
    return out


def arch_flags(cpp_extension: Any, torch: Any, args: dict[str, Any]) -> list[str]:
    """The ``-gencode`` flags torch adds to this worker's CUDA compile of ``args`` (from its
    visible GPU or TORCH_CUDA_ARCH_LIST); none without CUDA sources or on a CPU torch."""
    if not args.get("cuda_sources") or torch.version.cuda is None:
        return []
    return list(cpp_extension._get_cuda_arch_flags(args.get("extra_cuda_cflags") or []))


def install(cpp_extension: Any, torch: Any, ask: Callable[[dict[str, Any]], dict[str, Any]]
            ) -> None:
    """Answer ``cpp_extension.load_inline`` through ``ask`` (the pytest process: a reply with
    ``folder``, a build failure's ``reason``, or ``declined``); each module name once (a name
    loaded again goes to torch, whose versioning renames it)."""
    original = cpp_extension.load_inline
    signature = inspect.signature(original)
    served: set[str] = set()

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # torch's own error for a wrong call
        bound.apply_defaults()
        call = normalised(dict(bound.arguments))
        name = bound.arguments.get("name")
        if (call is None or bound.arguments.get("build_directory") is not None
                or name in served or torch.version.hip is not None
                or not all(hasattr(cpp_extension, f) for f in WORKER_NEEDS)):
            return original(*args, **kwargs)
        # The pytest process builds only in its own environment, so it declines a call made
        # after the candidate changed these (its record says so).
        now = {n: os.environ.get(n) for n in BUILD_ENVIRONMENT}
        reply = ask({"args": call, "arch_flags": arch_flags(cpp_extension, torch, call),
                     "environment": now})
        if reply.get("declined"):
            return original(*args, **kwargs)
        if not reply.get("ok"):
            raise RuntimeError(str(reply.get("reason", "the shared build failed")))
        served.add(name)
        return cpp_extension._import_module_from_library(
            reply["module"], str(reply["folder"]), bool(call.get("is_python_module", True)))

    cpp_extension.load_inline = load_inline
