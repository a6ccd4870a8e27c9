"""Task formats on both sides of the process boundary: drawing a case's inputs and building the
callable that is timed, the same way in the worker and in the pytest process.

Three formats (issue 12): ``native`` (``task.toml``: ``generate_input(**case, device=)`` in
``reference.py``), ``gpumode`` (a GPU MODE ``reference-kernels`` problem folder: its files,
``generate_input(**case)``) and ``kernelbench`` (one file with ``Model``, ``get_inputs()`` and
``get_init_inputs()``). A problem travels as a small dict (``describe`` in ``task.py``): the
worker gets file text or a path, never a reference output.

Also here: the structure of a case's data (a tensor, or tuples, lists and dicts of them), whose
tensor leaves the worker's checks and the re-run's changes address by position.
Imports the standard library only; torch inside the functions.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

FORMS = ("native", "gpumode", "kernelbench")
REFERENCE_MODULE = "_ks_task_inputs"  # the private name the worker loads a problem under

_type = type
_isinstance = isinstance


def leaves(data: Any) -> list[Any]:
    """The leaves of ``data`` in a fixed order: a tensor is one leaf; tuples, lists and dict
    values are walked; anything else is a leaf too (ints, floats, strings)."""
    if _isinstance(data, (tuple, list)):
        return [leaf for part in data for leaf in leaves(part)]
    if _isinstance(data, dict):
        return [leaf for part in data.values() for leaf in leaves(part)]
    return [data]


@functools.lru_cache(maxsize=64)
def named_tuple(name: str, fields: tuple[str, ...]) -> Any:
    """A named tuple class (one for each name and fields): an output's names across the
    worker's pipe (runner.named_like, received); ValueError for names namedtuple refuses."""
    return collections.namedtuple(name, fields)


class TaskMismatch(Exception):
    """The task's spec does not fit what its own code returns (a task error, reported whole
    and without a type name wherever it surfaces, a worker's reply included)."""


def output_problem(data: Any, index: int | None) -> str | None:
    """Why ``index`` (a task's ``output_index``) names no tensor of ``data``, or None."""
    if index is None:
        return None
    found = leaves(data)
    if index < len(found) and _isinstance(found[index], _tensor_type()):
        return None
    kinds = ", ".join(f"{i}: {_kind(leaf)}" for i, leaf in enumerate(found))
    if index >= len(found):
        what = f"is past the {len(found)} value(s)"
    else:
        kind = _kind(found[index])
        what = f"names {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a tensor, among the values"
    return (f"task.toml's output_index = {index} {what} generate_input returns ({kinds}); set "
            "it to the position of the preallocated output the kernel writes into, or leave "
            "it out when the kernel returns an output it makes itself")


def _kind(leaf: Any) -> str:
    shape = getattr(leaf, "shape", None)
    return f"tensor {tuple(shape)}" if shape is not None else type(leaf).__name__


def _tensor_type() -> Any:
    import torch

    return torch.Tensor


def same(a: Any, b: Any) -> bool:
    """Whether two outputs are identical, leaf by leaf (a tensor's shape, dtype and every
    element); for the pytest process (task validation, a re-run's hint)."""
    import torch

    left, right = leaves(a), leaves(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left, right, strict=True):
        if _isinstance(x, torch.Tensor) and _isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif _isinstance(x, torch.Tensor) or _isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def rebuild(data: Any, fn: Callable[[Any], Any]) -> Any:
    """``data`` with every leaf replaced by ``fn(leaf)``, its containers' types kept."""
    if _isinstance(data, dict):
        return _type(data)((k, rebuild(v, fn)) for k, v in data.items())
    if _isinstance(data, (tuple, list)):
        parts = [rebuild(part, fn) for part in data]
        if hasattr(data, "_fields"):  # a namedtuple
            return _type(data)(*parts)
        return _type(data)(parts)
    return fn(data)


def exec_source(name: str, source: str, filename: str) -> types.ModuleType:
    """A module made from ``source`` without a file, and in ``sys.modules`` only while it runs:
    ``@dataclass`` looks its class's module up there (amd/mla-decode's reference failed with
    "'NoneType' object has no attribute '__dict__'" without it)."""
    module = types.ModuleType(name)
    module.__file__ = filename
    before = sys.modules.get(name)
    sys.modules[name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - the task's file
    finally:
        if before is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = before
    return module


def input_maker(problem: dict[str, Any], module: Any) -> Callable[..., Any]:
    """``generate(case, seed, device)`` for a problem whose module is loaded."""
    form = problem["form"]
    if form == "native":
        native = module.generate_input
        return lambda case, seed, device: native(**dict(case, seed=seed), device=device)
    if form == "gpumode":
        return _gpumode_inputs(module.generate_input)
    if form == "kernelbench":
        return _kernelbench_inputs(module.get_inputs)
    raise ValueError(f"unknown task format {form!r}; expected one of {FORMS}")


def current(device: str) -> Any:
    """A context in which ``device`` is torch's current device (a GPU's; nothing on the CPU).
    GPU MODE problems draw and compute on "cuda" (``.cuda()``, ``device="cuda"``: the nvfp4
    references, amd/mla-decode's utils), which means the current device, cuda:0 unless set."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device)


def _gpumode_inputs(generate: Callable[..., Any]) -> Callable[..., Any]:
    def draw(case: dict[str, Any], seed: int, device: str) -> Any:
        with current(device):
            return _gpumode_draw(generate, case, seed)

    return draw


def _gpumode_draw(generate: Callable[..., Any], case: dict[str, Any], seed: int) -> Any:
    """``generate(**case)`` as GPU MODE's eval.py calls it, the case's seed replaced by ``seed``:
    lists become tuples (their parsers give nvfp4_group_gemm's ``m: [96, 128]`` as a tuple). A
    case without a seed draws from the global generators, seeded here with ``seed`` so that
    both processes draw the same inputs and each call new ones."""
    args = {k: tuple(v) if _isinstance(v, list) else v for k, v in case.items()}
    if "seed" in args:
        args["seed"] = seed
    else:
        import random

        import torch

        torch.manual_seed(seed)
        random.seed(seed)
        numpy = sys.modules.get("numpy")  # as GPU MODE's set_seed, where the problem uses it
        if numpy is not None:
            numpy.random.seed(seed % (1 << 32))
    return generate(**args)


def _kernelbench_inputs(get_inputs: Callable[[], Any]) -> Callable[..., Any]:
    def draw(case: dict[str, Any], seed: int, device: str) -> Any:
        import torch

        # Seeded as KernelBench seeds its trials; drawn on the run's device (19_ReLU's
        # 4096x393216 input took 17.7 s on a 2-core host CPU; every timed call draws afresh),
        # that GPU current for a get_inputs that says .cuda() or device="cuda".
        with current(device), torch.device(device):
            torch.manual_seed(seed)
            inputs = list(get_inputs())
        return [t.to(device) if _isinstance(t, torch.Tensor) else t for t in inputs]

    return draw


def build_model(cls: Any, get_init_inputs: Callable[[], Any], seed: int, device: str) -> Any:
    """A KernelBench model (``Model`` or ``ModelNew``) with the weights ``seed`` gives: the same
    weights on both sides when both classes create their parameters in the same order."""
    import torch

    with torch.device(device), torch.no_grad():
        torch.manual_seed(seed)
        init = list(get_init_inputs())
        torch.manual_seed(seed)
        model = cls(*init)
    to = getattr(model, "to", None)
    return to(device) if callable(to) else model


def model_kernel(model: Any) -> Callable[[Any], Any]:
    """The timed callable of a KernelBench model: ``forward`` on the case's inputs."""
    def run(data: Any) -> Any:
        return model(*data)

    return run


def load_problem(problem: dict[str, Any], name: str = REFERENCE_MODULE) -> Any:
    """Load the module a problem draws its inputs from (worker side).

    ``gpumode``: the problem's files (text, as the task listed them) are written into the
    working folder, which joins ``sys.path`` so a candidate's ``from task import input_t``
    works; the reference itself is executed from its text under a private name, never written
    there, so ``import reference`` finds nothing.
    """
    import importlib.util
    import os

    form = problem["form"]
    if form == "gpumode":
        for fname, text in problem["files"].items():
            with open(fname, "w", encoding="utf-8") as f:
                f.write(text)
        sys.path.insert(0, os.getcwd())
        return exec_source(name, problem["reference"], "reference.py")
    spec = importlib.util.spec_from_file_location(name, problem["path"])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {problem['path']}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
