"""Kernel attribution (issue 30 point 4): where a candidate's time goes, kernel by kernel.

A candidate may define and compile a Triton or CUDA kernel on a branch that never runs while
torch's own ops do all the work; its check and timing then pass as a "kernel" with torch's
time. So, with ``--ks-attribution`` (or when the task sets ``[kernel] min_own_share``), the
first check of each candidate makes one extra untimed call under ``torch.profiler`` in the
candidate's worker (``op_attribute`` in ``worker/runner.py``), which reports what ran:

- on a GPU (CUDA, or ROCm through the same profiler), every device kernel, copy and fill with
  its device time. A kernel is the candidate's own when its name is one the candidate's file
  declares: a ``@triton.jit`` function, or a ``__global__`` function in the CUDA/HIP source it
  compiles. Everything else (``at::native``, cuBLAS, Inductor's generated kernels, copies) is
  library time.
- on a CPU, where Triton's interpreter runs a kernel's Python body, the wall time spent inside
  the declared Triton functions of the candidate's file is its own time; the outermost torch
  ops are listed beside it. A CPU extension's C++ functions are not seen (they read as 0%).

The names are judged here, in the pytest process, from the candidate's file; the worker only
reports. A candidate that notices the profiler and changes what it runs is not caught by this
(the check of its outputs still is); the numbers are advice unless the task sets a minimum.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

# Namespaces of torch and the libraries it launches: a kernel named there is never the
# candidate's, whatever the candidate's file declares.
LIBRARY_NAMESPACES = ("at", "c10", "cub", "thrust", "cutlass", "cublas", "cublasLt", "cudnn",
                      "flash", "pytorch_flash", "fmha", "mem_eff_attention")
# Calls of the attribute chain's last name that make a function a Triton kernel.
_TRITON_DECORATORS = {"jit", "autotune", "heuristics"}
_GLOBAL = re.compile(r"__global__\b")
_CALLED = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;{}]*>)?\s*\(")
_NOT_THE_NAME = {"__launch_bounds__", "__cluster_dims__", "__attribute__", "alignas",
                 "__maxnreg__", "__declspec"}


class KernelTime(BaseModel):
    """One kernel (GPU), or one declared function or outermost torch op (CPU), of the call."""

    name: str
    us: float
    calls: int = 1
    own: bool = False


class Attribution(BaseModel):
    """What one profiled call of a candidate ran, and the share that is its own."""

    device: Literal["gpu", "cpu"]
    wall_us: float
    total_us: float  # GPU: the kernels' device time; CPU: the call's wall time
    own_us: float
    own_share: float = Field(ge=0.0, le=1.0)
    declared: list[str] = Field(default_factory=list)  # kernel names the file declares
    kernels: list[KernelTime] = Field(default_factory=list)  # the longest first

    def line(self, top: int = 3) -> str:
        """One line: the own share and the longest kernels of each side."""
        own = [k for k in self.kernels if k.own]
        library = [k for k in self.kernels if not k.own]
        where = "device time" if self.device == "gpu" else "call time"
        text = f"own {_pct(self.own_share)} of {where} "
        text += f"({_names(own, self.total_us, top)})" if own else "(no kernel it declares ran)"
        if library:
            # GPU: every other kernel, copy and fill; CPU: the outermost torch ops (the rest
            # of the call is its Python around them)
            share = sum(k.us for k in library) / self.total_us if self.total_us else 0.0
            side = "library" if self.device == "gpu" else "torch ops"
            text += f"; {side} {_pct(share)} ({_names(library, self.total_us, top)})"
        return text


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _names(kernels: list[KernelTime], total: float, top: int) -> str:
    shown = [f"{_short(k.name)} {_pct(k.us / total if total else 0)}" for k in kernels[:top]]
    if len(kernels) > top:
        shown.append(f"{len(kernels) - top} more")
    return ", ".join(shown)


def _short(name: str, width: int = 48) -> str:
    name = qualified_name(name) or name
    return name if len(name) <= width else name[: width - 3] + "..."


def declared_kernels(source: str) -> list[str]:
    """The kernel names a candidate's file declares: its Triton functions (decorated with
    ``triton.jit``, ``triton.autotune`` or ``triton.heuristics``, under any import name) and the
    ``__global__`` functions of any CUDA or HIP source text in it."""
    names: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    _decorator_name(d) in _TRITON_DECORATORS for d in node.decorator_list):
                names.add(node.name)
    for found in _GLOBAL.finditer(source):
        head = re.split(r"[{;]", source[found.end():], maxsplit=1)[0]
        for name in _CALLED.findall(head):
            if name not in _NOT_THE_NAME:
                names.add(name)
                break
    return sorted(names)


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def qualified_name(kernel: str) -> str:
    """A profiler's kernel name without its return type, template arguments and parameters
    (``void at::native::elementwise_kernel<128, 4, F>(int, F)`` ->
    ``at::native::elementwise_kernel``); a Triton kernel's name is already plain."""
    depth, out = 0, []
    for ch in kernel:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    words = "".join(out).split()
    return words[-1].replace("(anonymous namespace)::", "") if words else ""


def is_own(kernel: str, declared: set[str]) -> bool:
    """Whether a device kernel is one the candidate declares: its name, without namespaces of
    torch or its libraries, is a declared name."""
    name = qualified_name(kernel)
    if not name:
        return False
    parts = name.split("::")
    if any(p in LIBRARY_NAMESPACES for p in parts[:-1]):
        return False
    return parts[-1] in declared


def judge(report: dict[str, Any], declared: list[str]) -> Attribution:
    """The attribution of one profiled call from the worker's report and the kernel names the
    candidate's file declares. The report: ``{"device": "gpu"|"cpu", "wall_us": float,
    "kernels": [[name, us, calls], ...], "own": [[name, us, calls], ...]}``; ``kernels`` are
    device kernels (GPU) or outermost torch ops (CPU), ``own`` (CPU) the time inside the
    declared functions."""
    known = set(declared)
    device = "gpu" if report["device"] == "gpu" else "cpu"
    wall = float(report["wall_us"])
    kernels = [KernelTime(name=str(n), us=float(us), calls=int(c),
                          own=device == "gpu" and is_own(str(n), known))
               for n, us, c in report["kernels"]]
    if device == "cpu":
        kernels += [KernelTime(name=str(n), us=float(us), calls=int(c), own=True)
                    for n, us, c in report.get("own", []) if str(n) in known]
    kernels.sort(key=lambda k: -k.us)
    own = sum(k.us for k in kernels if k.own)
    total = sum(k.us for k in kernels) if device == "gpu" else wall
    share = own / total if total > 0 else 0.0
    return Attribution(device=device, wall_us=wall, total_us=total, own_us=own,
                       own_share=min(1.0, max(0.0, share)), declared=declared, kernels=kernels)


def refusal(att: Attribution, minimum: float, source: str) -> str | None:
    """Why a candidate whose own share is under ``minimum`` is refused, or None; ``source``
    names where the minimum was set."""
    if att.own_share >= minimum:
        return None
    side = "device time" if att.device == "gpu" else "call time"
    declared = ", ".join(att.declared) or "none"
    return (f"kernel attribution: {_pct(att.own_share)} of its {side} in kernels its file "
            f"declares, expected at least {_pct(minimum)} ({source}); "
            f"what ran: {att.line()}; declared: {declared}. Do the work in a kernel of the "
            f"candidate's own (@triton.jit or __global__); torch ops and libraries do not count")
