"""What candidate code must leave alone inside the worker: clocks, harness objects, torch settings.

``Tripwire`` is built by the runner before the candidate is imported. It records the identity of
the functions the timing and the checks rely on, the code objects of the harness's own functions,
the process-wide torch settings and the interpreter's trace/profile hooks; ``check()`` names the
first difference, which the runner turns into a verdict. It is one layer, not a wall: code in the
same process can undo a change before the check runs (README, "Threat model").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import FunctionType, ModuleType
from typing import Any

# Module attribute paths whose replacement would fake a clock, a synchronisation or a check.
WATCHED = {
    "time": [
        "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
        "process_time", "process_time_ns", "thread_time", "thread_time_ns",
    ],
    "builtins": ["type", "isinstance", "len", "id", "getattr", "callable"],
    "torch": ["equal", "empty", "empty_like", "frombuffer"],
    "torch.Tensor": [
        "clone", "copy_", "fill_", "contiguous", "view", "cpu", "detach", "data_ptr",
        "untyped_storage", "stride", "is_floating_point", "numel", "element_size",
    ],
    "torch.cuda": ["synchronize", "Event", "Stream", "current_stream", "set_device"],
    "torch.cuda.Event": ["record", "elapsed_time", "synchronize", "query", "wait"],
    "torch._C": ["_cuda_synchronize"],
    "json": ["dumps", "loads"],
    "hmac": ["new", "compare_digest"],
    "os": ["write", "read"],
}

# Process-wide settings a kernel could flip to change how the numbers come out.
SETTINGS: dict[str, Callable[[Any], Any]] = {
    "torch.get_default_dtype()": lambda t: t.get_default_dtype(),
    "torch.get_float32_matmul_precision()": lambda t: t.get_float32_matmul_precision(),
    "torch.backends.cuda.matmul.allow_tf32": lambda t: t.backends.cuda.matmul.allow_tf32,
    "torch.backends.cuda.matmul.fp32_precision": lambda t: t.backends.cuda.matmul.fp32_precision,
    "torch.backends.cudnn.allow_tf32": lambda t: t.backends.cudnn.allow_tf32,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
        lambda t: t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
        lambda t: t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
}

HARNESS_PACKAGE = "pytest_kscientist"


def _resolve(path: str) -> Any:
    head, *rest = path.split(".")
    obj: Any = sys.modules.get(head)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


def _setting(getter: Callable[[Any], Any], torch: Any) -> str:
    try:
        return repr(getter(torch))
    except Exception as exc:  # noqa: BLE001 - a setting missing from this torch build
        return f"<{type(exc).__name__}>"


def _code_of(value: Any) -> Any:
    func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    return func.__code__ if isinstance(func, FunctionType) else None


class Tripwire:
    """Snapshot now; ``check()`` later returns a one-line reason or None."""

    def __init__(self, objects: dict[str, tuple[Any, Iterable[str] | None]],
                 modules: Iterable[ModuleType] = (), package: str = HARNESS_PACKAGE) -> None:
        import torch

        self._torch = torch
        self._package = package
        self._sys_modules = sys.modules
        self._gettrace, self._getprofile = sys.gettrace, sys.getprofile
        self._threading = sys.modules.get("threading")
        self._attrs: list[tuple[str, Any, str, Any]] = []
        for owner_path, names in WATCHED.items():
            owner = _resolve(owner_path)
            for name in names:
                if owner is not None and hasattr(owner, name):
                    self._attrs.append((owner_path, owner, name, getattr(owner, name)))
        for label, (obj, chosen) in objects.items():
            self._watch_object(label, obj, chosen)
        for module in modules:
            for name, value in vars(module).items():
                if not name.startswith("__"):
                    self._attrs.append((module.__name__, module, name, value))
        self._codes = [(label, value, _code_of(value)) for label, _, _, value in
                       self._code_carriers() if _code_of(value) is not None]
        self._settings = {k: _setting(g, torch) for k, g in SETTINGS.items()}

    def _watch_object(self, label: str, obj: Any, names: Iterable[str] | None) -> None:
        attrs = vars(obj) if names is None else {n: getattr(obj, n) for n in names}
        for name, value in attrs.items():
            self._attrs.append((label, obj, name, value))
        for cls in type(obj).__mro__[:-1]:
            for name, value in vars(cls).items():
                if _code_of(value) is not None:
                    self._attrs.append((cls.__name__, cls, name, value))

    def _code_carriers(self) -> Iterable[tuple[str, Any, str, Any]]:
        for owner_path, owner, name, value in self._attrs:
            yield f"{owner_path}.{name}", owner, name, value

    def check(self) -> str | None:
        """The first thing found changed since the snapshot, as a verdict; None if none."""
        for owner_path, owner, name, value in self._attrs:
            if getattr(owner, name, None) is not value:
                return (f"replaced {owner_path}.{name}; clocks, synchronisation and the "
                        "harness's own objects must not be patched")
        for label, func, code in self._codes:
            if _code_of(func) is not code:
                return f"rewrote the code of {label}; the harness's functions must not be patched"
        hooks = [("sys.settrace", self._gettrace()), ("sys.setprofile", self._getprofile())]
        if self._threading is not None:
            hooks.append(("threading.settrace", getattr(self._threading, "_trace_hook", None)))
            hooks.append(("threading.setprofile", getattr(self._threading, "_profile_hook", None)))
        for name, hook in hooks:
            if hook is not None:
                return f"left a {name} hook installed; kernels must not trace the harness"
        for key, before in self._settings.items():
            now = _setting(SETTINGS[key], self._torch)
            if now != before:
                return (f"changed the process-wide setting {key} from {before} to {now}; "
                        "restore global settings before returning")
        # Importing any harness submodule imports the package first, so one look is enough.
        if self._package in self._sys_modules:
            return (f"imported the harness's own package {self._package}; it is not part of "
                    "a kernel's API")
        return None
