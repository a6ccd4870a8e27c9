"""The candidate worker process: ``python -m pytest_kscientist.worker.runner REQ RES``.

Everything here runs beside untrusted candidate code. The reference kernel is never loaded
here (only the task's ``generate_input``); outputs go back to the pytest process, which computes
the reference from pristine inputs and judges. Functions the checks rely on are captured, a
tripwire is set (``integrity.py``), and the harness modules are dropped from ``sys.modules``,
before the candidate is imported.

The pytest process drives every call: ``check`` then ``recheck`` (the same tensors with a few
elements changed, or for GPU MODE every tensor drawn again), and for benchmarks one ``call``
request per call, each carrying only its own seed, so no future input exists in this process
before its call starts. It decides after each call, out of reach of candidate code, which
outputs to ``fetch`` for verification. Outputs go back whole: in the answer's frame, or above
``handover.SHARED_ABOVE`` bytes through memory sealed or exported after the call
(``protocol/handover.py``), held until the next request.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import sys
import threading
import time
import traceback
from typing import Any

from pytest_kscientist.formats import forms
from pytest_kscientist.formats.forms import leaves
from pytest_kscientist.protocol import channel, cuda_share, handover, perturb
from pytest_kscientist.worker import inline_builds, threads
from pytest_kscientist.worker.integrity import Tripwire
from pytest_kscientist.worker.threads import ThreadWatch
from pytest_kscientist.worker.timing import make_timer

_type = type
_isinstance = isinstance
_len = len
_zip = zip
_enumerate = enumerate

# The worker side of the process boundary: the only harness modules that may be loaded beside
# candidate code (standard library and torch besides) are the package's root and errors, the
# worker package, the protocol both processes speak and the formats that draw a case's inputs.
# Each imports nothing heavy; Runner() refuses to start if any other pytest_kscientist module
# got loaded, says which it loaded in its hello (the pytest side checks it too: spawn.py), and
# the harness modules are dropped from sys.modules before the candidate is imported.
WORKER_PACKAGES = ("pytest_kscientist.worker", "pytest_kscientist.protocol",
                   "pytest_kscientist.formats")
WORKER_MODULES = frozenset({"pytest_kscientist", "pytest_kscientist.errors",
                            "pytest_kscientist.formats.forms", *WORKER_PACKAGES})


def outside_worker_side(modules: Any) -> list[str]:
    """The package modules among ``modules`` that the worker side may not load."""
    return sorted(
        m for m in modules if m.split(".")[0] == "pytest_kscientist" and m not in WORKER_MODULES
        and not any(m.startswith(p + ".") for p in WORKER_PACKAGES[:2]))


# Attributes of the runner that hold captured functions; replacing one is tampering.
CAPTURED = ("torch", "Tensor", "clone", "equal", "ne", "any", "stack", "item", "fill_",
            "set_versions", "generate", "timer", "key", "apply_changes", "refill", "profile",
            "activity", "clock", "set_profile")


def extension_dir(torch: Any, key: str) -> str:
    """The torch extension build root of the file whose SHA-256 is ``key``: one per source, so
    two different files that name their ``load_inline`` module alike (two variants of one seed)
    never build into one folder at once (a worker importing the other's half-written ``.so``),
    and an unchanged file finds its build from an earlier session. The pytest process computes
    the same folder (mounts.build_folder) to leave only it writable in the worker's sandbox."""
    root = inline_builds.extensions_base()
    accel = (f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip else
             f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(root, f"{tag}_{accel}", f"ks-{key[:16]}")


def guard_pch(cpp_extension: Any, folder: str) -> None:
    """Make ``load_inline(use_pch=True)``'s check-and-build of torch's precompiled header take
    an exclusive lock (``folder``/pch.lock) first. torch writes that header into its own
    include folder unlocked, so workers loading together on a fresh machine built it at once
    and their compilers read each other's half-written file (cc1plus killed, on the H200).

    In the sandbox torch's folder is read-only (mounts.installed_code): there the header is not
    built (the compiler then reads torch/extension.h itself: slower, the same result), and
    load_inline's removal of it when ``use_pch`` is off is skipped."""
    import fcntl

    build = getattr(cpp_extension, "_check_and_build_extension_h_precompiler_headers", None)
    remove = getattr(cpp_extension, "remove_extension_h_precompiler_headers", None)

    def read_only() -> bool:
        where = getattr(cpp_extension, "__file__", None)
        return where is not None and not os.access(os.path.dirname(where), os.W_OK)

    def serialized(*args: Any, **kwargs: Any) -> Any:
        if read_only():
            return None
        path = os.path.join(folder, "pch.lock")
        try:
            os.makedirs(folder, exist_ok=True)
            lock = open(path, "a")  # noqa: SIM115
        except OSError:
            # In the sandbox the extension root is read-only (mounts.build_folder): the pytest
            # process made the lock file, and a lock needs no write access.
            lock = open(path)  # noqa: SIM115
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return build(*args, **kwargs)

    def removed(*args: Any, **kwargs: Any) -> Any:
        return None if read_only() else remove(*args, **kwargs)

    serialized.ks_serialized = removed.ks_serialized = True  # type: ignore[attr-defined]
    if build is not None and not getattr(build, "ks_serialized", False):
        cpp_extension._check_and_build_extension_h_precompiler_headers = serialized
    if remove is not None and not getattr(remove, "ks_serialized", False):
        cpp_extension.remove_extension_h_precompiler_headers = removed


def _load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Said after a write the sandbox refused (harness/mounts.py, harness/worker_folders.py).
READ_ONLY_HINT = ("; the worker sandbox keeps the project, the installed code, the builds and "
                  "the caches of other workers read-only: write under the temporary directory, "
                  "and let compiler caches go where TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, "
                  "CUDA_CACHE_PATH and CUPY_CACHE_DIR point")


def _refused_write(exc: BaseException) -> bool:
    """Whether the failure is a write the sandbox refused, itself or what it was raised from
    (Inductor wraps the OSError in its own error); eight links at most."""
    found: BaseException | None = exc
    for _ in range(8):
        if found is None:
            return False
        if getattr(found, "errno", None) == errno.EROFS:
            return True
        found = found.__cause__ or found.__context__
    return False


def _one_line(exc: BaseException) -> str:
    """The failure in one line: its first line and, for a message of several lines, its last
    (a Triton CompilationError starts "at 3:4:" and ends with the actual cause: issue 13); a
    write the sandbox refused says where a candidate may write."""
    if _type(exc) is forms.TaskMismatch:
        return str(exc)
    lines = [ln.strip() for ln in f"{_type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    hint = READ_ONLY_HINT if _refused_write(exc) else ""
    if not lines:
        return _type(exc).__name__ + hint
    if _len(lines) == 1:
        return lines[0][:300] + hint
    return f"{lines[0][:150]} ... {lines[-1][:250]}{hint}"


# The package's root folder: frames under it are the harness's, not the candidate's.
_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(channel.__file__)))


def _their_traceback(exc: BaseException) -> str:
    """The traceback without the harness's and importlib's frames: the candidate's own."""
    found = traceback.TracebackException.from_exception(exc)
    found.stack = traceback.StackSummary.from_list([
        frame for frame in found.stack
        if not (os.path.abspath(frame.filename).startswith(_HARNESS_DIR + os.sep)
                or frame.filename.startswith("<frozen importlib"))
    ])
    return "".join(found.format())


def _takes_one_argument(kernel: Any, entry: str) -> str | None:
    """Why ``kernel(data)`` cannot bind its one argument, or None (also where the callable has
    no signature Python can read, such as an extension's function)."""
    import inspect

    try:
        signature = inspect.signature(kernel)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None)
    except TypeError as exc:
        return (f"{entry}{signature} cannot be called as {entry}(data): {exc}; the harness "
                f"calls it with one argument, what generate_input returns: define "
                f"def {entry}(data)")
    return None


def _fail(reason: str) -> tuple[dict[str, Any], bytes]:
    return {"ok": False, "reason": reason}, b""


class Runner:
    """Serves requests from the pytest process for one candidate."""

    def __init__(self, req_fd: int, res_fd: int) -> None:
        import torch

        self.req_fd, self.res_fd = req_fd, res_fd
        self.seq_out = 0
        hello, _ = channel.read_frame(req_fd, b"", 0)
        self.seq_in = 1
        self.key = bytes.fromhex(hello["key"])
        self.device = hello["device"]
        self.output_index = hello.get("output_index")
        self.torch = torch
        self.Tensor = torch.Tensor
        self.clone = torch.Tensor.clone
        self.equal = torch.equal
        self.ne, self.any, self.stack = torch.ne, torch.Tensor.any, torch.stack
        self.item = torch.Tensor.item
        self.fill_ = torch.Tensor.fill_
        self.detach = torch.Tensor.detach  # the poison below writes into a leaf needing grad
        # The device ran out of memory (told apart so the pytest process can retire the extra
        # workers it started for the rounds, harness/rounds.py, before it blames the kernel).
        self.out_of_memory = getattr(torch, "OutOfMemoryError", MemoryError)
        self.set_versions = torch._C._autograd._unsafe_set_version_counter
        self.apply_changes = perturb.apply
        self.refill = perturb.refill
        # torch imports its profiler with itself; taken before any candidate code runs.
        self.profile = torch.profiler.profile
        self.activity = torch.profiler.ProfilerActivity
        self.clock = time.perf_counter
        self.set_profile = sys.setprofile
        self.kernel_path = ""
        self.loading = 0  # the thread importing the candidate, during a load request
        if self.device.startswith("cuda"):
            self._on_the_machine(lambda: torch.cuda.set_device(self.device))
        self.problem = hello["problem"]
        # GPU MODE problems pass preallocated outputs among the inputs without saying which
        # (fp8-mm's c): writing into an input, or returning one, is allowed there; its verdicts
        # use the pytest process's own inputs.
        self.inputs_may_be_outputs = self.problem["form"] == "gpumode"
        # Only the functions are kept, never the module object: a candidate searching the
        # live objects for a module with ref_kernel finds none (adversarial frame_snoop).
        try:
            module = forms.load_problem(self.problem)
            self.generate = forms.input_maker(self.problem, module)
        except Exception as exc:  # noqa: BLE001 - the task's code: its failure is the answer
            self.send({"op": "hello", "ok": False, "reason": (
                f"the task's own code failed in the worker, before any candidate code ran: "
                f"{_one_line(exc)}; fix the task (its task::validate item tells more)")})
            raise _NotStarted from None
        self.init_inputs = getattr(module, "get_init_inputs", None)  # KernelBench
        del module
        self.threads = ThreadWatch()
        self.timer = self._on_the_machine(lambda: make_timer(self.device, self.threads.after))
        self.kernel: Any = None
        self.prepare: Any = None
        self.held: Any = None  # (pristine, given, versions) of the last check, for the re-run
        self.last: Any = None  # output snapshot of the last call, until fetched or replaced
        self.offers = handover.Offers()  # outputs handed over, kept until the next request
        self.out_like: Any = None  # (shape, dtype) of the last call's output, for probes
        self.tripwire = Tripwire(
            {"runner": (self, CAPTURED), "timer": (self.timer, None),
             "threads": (self.threads, threads.CAPTURED)},
            modules=[sys.modules[__name__], channel, cuda_share, forms, handover, perturb,
                     threads],
        )
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "pytest_kscientist")
        if outside_worker_side(loaded):
            raise RuntimeError(
                f"harness modules {outside_worker_side(loaded)} are loaded in the worker, "
                "outside the worker side (runner.WORKER_MODULES); keep the worker side small")
        for name in loaded:
            del sys.modules[name]
        self.send({"op": "hello", "ok": True, "overhead_us": self.timer.overhead_us,
                   "modules": loaded})

    def _on_the_machine(self, step: Any) -> Any:
        """``step()`` (the device's context, the timer's scratch and calibration); its failure
        is the machine's, before any candidate code ran: the hello says so."""
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - any failure here is the machine's answer
            oom = isinstance(exc, self.out_of_memory) or "out of memory" in str(exc).lower()
            self.send({"op": "hello", "ok": False, "machine": True, "out_of_memory": oom,
                       "reason": f"{self.device}: {_one_line(exc)}"})
            raise _NotStarted from None

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        channel.send(self.res_fd, self.key, self.seq_out, header, payload)
        self.seq_out += 1

    def ask_build(self, call: dict[str, Any]) -> dict[str, Any]:
        """The pytest process's answer to a load_inline call (worker/inline_builds.py): asked
        while the load request is open, answered before its reply; a call made later (a
        kernel that builds at its first call) or from another thread builds on its own."""
        if threading.get_ident() != self.loading:  # 0 outside a load: no thread has it
            return {"declined": True}
        self.send({"op": "build", **call})
        reply, _ = channel.read_frame(self.req_fd, b"", self.seq_in)
        self.seq_in += 1
        if reply.get("op") != "built":
            raise RuntimeError(f"the pytest process answered '{reply.get('op')}' to a build")
        return reply

    def serve(self) -> None:
        while True:
            try:
                req, _ = channel.read_frame(self.req_fd, b"", self.seq_in)
            except EOFError:
                return
            self.seq_in += 1
            self.offers.release()  # the pytest process took them before it asked again
            op = req["op"]
            if op == "exit":
                return
            handler = getattr(self, "op_" + op)
            try:
                header, payload = handler(req)
            except BaseException as exc:  # noqa: BLE001 - isolation boundary: candidate code
                header = {"ok": False, "reason": _one_line(exc), "detail": _their_traceback(exc),
                          "out_of_memory": _isinstance(exc, self.out_of_memory)}
                payload = b""
            header["op"] = op
            self.send(header, payload)

    # -- requests ---------------------------------------------------------------------------

    def op_load(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        # Workers load together (starts.start_workers): each file builds its extensions in
        # its own folder, and takes turns at torch's precompiled header.
        with open(req["path"], "rb") as file:
            source = file.read()
        folder = extension_dir(self.torch, hashlib.sha256(source).hexdigest())
        os.environ["TORCH_EXTENSIONS_DIR"] = folder
        if inline_builds.builds_extensions(source):
            from torch.utils import cpp_extension

            guard_pch(cpp_extension, os.path.dirname(folder))
            if req.get("shared"):
                inline_builds.install(cpp_extension, self.torch, self.ask_build)
        self.loading = threading.get_ident()  # ask_build's: the thread of this load
        try:
            module = _load_module(req["path"], "_ks_candidate")
        except ModuleNotFoundError as exc:
            beside = os.path.join(os.path.dirname(req["path"]), (exc.name or "?").split(".")[0])
            if not (os.path.isfile(beside + ".py") or os.path.isdir(beside)):
                raise
            raise ModuleNotFoundError(
                f"{exc}: {beside}(.py) beside the candidate is not importable in its worker; a "
                "candidate is one file (its bytes are what is cached, stored and compared): "
                "put that code into it", name=exc.name) from None
        finally:
            self.loading = 0
        self.kernel_path = req["path"]
        problem = self.tripwire.check()
        if problem:
            return _fail(f"while importing: {problem}")
        entry = req.get("entry", "custom_kernel")
        kernel = getattr(module, entry, None)
        if self.problem["form"] == "kernelbench":
            if not _isinstance(kernel, _type):
                found = "nothing" if kernel is None else _type(kernel).__name__
                return _fail(f"defines no class {entry} (found {found}); a KernelBench "
                             f"solution defines {entry}(nn.Module) with Model's constructor")
            self.torch.set_grad_enabled(False)  # as KernelBench runs models: under no_grad
            model = forms.build_model(kernel, self.init_inputs, int(req["init_seed"]),
                                      self.device)
            kernel = forms.model_kernel(model)
        elif not callable(kernel):
            found = "nothing" if kernel is None else _type(kernel).__name__
            return _fail(f"defines no callable {entry}(data) "
                         f"(found {found}); expose it at module level")
        elif (problem := _takes_one_argument(kernel, entry)) is not None:
            return _fail(problem)
        self.kernel = kernel
        label = f"{entry}.forward" if self.problem["form"] == "kernelbench" else entry
        self.threads.watch(req["path"], vars(module), label)
        # Only a task's declared baselines are loaded with a prepare entry (a trusted layout
        # conversion, run before each call and left out of its time); candidates never are.
        prepare = req.get("prepare")
        self.prepare = getattr(module, prepare, None) if prepare else None
        if prepare and not callable(self.prepare):
            return _fail(f"defines no callable {prepare}(data) (declared prepare = true); "
                         "expose it at module level")
        return {"ok": True}, b""

    def op_check(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        pristine, given = self._inputs(req["case"], req["seed"])
        versions = [t._version for t in leaves(given) if _isinstance(t, self.Tensor)]
        snap, _, _, problem = self._run(self.kernel, pristine, given)
        if problem:
            return _fail(problem)
        self.held = (pristine, given, versions)
        return self._checked(snap, req)

    def op_recheck(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """The last check's tensors again, identity and versions kept, a few elements changed
        or (``redraw``: a seed) all of them refilled with the case drawn with that seed."""
        if self.held is None:
            return _fail("re-run requested without a check before it")
        pristine, given, versions = self.held
        self.held = None
        if "redraw" in req:
            fresh = self.generate(req["case"], int(req["redraw"]), self.device)
            self.refill(pristine, fresh)
            self.refill(given, fresh)
            del fresh
        else:
            self.apply_changes(pristine, req["changes"])
            self.apply_changes(given, req["changes"])
        self._clear_output(given)
        self.set_versions(tuple(t for t in leaves(given) if _isinstance(t, self.Tensor)),
                          versions)
        snap, _, _, problem = self._run(self.kernel, pristine, given)
        if problem:
            return _fail(problem)
        return self._checked(snap, req)

    def _checked(self, snap: Any, req: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """A checked output, whole, handed over as the request's ``handover`` allows."""
        meta, payload = _serialise(snap, req.get("handover"), self.offers)
        return {"ok": True, "output": meta}, payload

    def op_call(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """One benchmark call (or, for ``probe``, the same path with a trusted busy kernel of
        ``busy_us`` on the GPU, nothing on the CPU, in place of the candidate)."""
        self.last = None
        pristine, given = self._inputs(req["case"], req["seed"])
        if req.get("probe"):
            busy = self.timer.busy(float(req.get("busy_us", 0.0)))
            _, raw, outside, problem = self._run(busy, pristine, given, probe=True)
            if self.out_like is not None:
                # The untimed work a call's output costs (its allocation, snapshot and poison:
                # ~4 ms per call for a 1 GB KernelBench output, measured), done for the probe
                # too, so the outside check compares like with like.
                for shape, dtype in self.out_like:
                    out = self.torch.empty(shape, dtype=dtype, device=self.device)
                    self.clone(out)
                    if out.is_floating_point():
                        self.fill_(out, float("nan"))
        else:
            self.last, raw, outside, problem = self._run(self.kernel, pristine, given)
            if self.last is not None:
                parts = [self.last] if _type(self.last) is self.Tensor else self.last
                self.out_like = [(t.shape, t.dtype) for t in parts]
        if problem:
            return _fail(problem)
        return {"ok": True, "raw_us": raw, "outside_us": outside}, b""

    def op_attribute(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """One untimed call, profiled (harness/attribution.py judges it). On a GPU, through
        torch's profiler: every device kernel, copy and fill with its device time. On a CPU,
        where Triton's interpreter runs a kernel's Python body: the wall time spent inside the
        functions of the candidate's file named in ``own`` (the pytest process read them from
        it), and the outermost torch ops. Its output is not judged; the checks around it are."""
        _, given = self._inputs(req["case"], req["seed"])
        prepared = given if self.prepare is None else self.prepare(given)
        gpu = self.device.startswith("cuda")
        activities = [self.activity.CPU, *([self.activity.CUDA] if gpu else [])]
        inside = _Inside(set(req.get("own", ())), self.kernel_path, self.clock)
        if gpu:
            self.torch.cuda.synchronize()
        with self.profile(activities=activities) as prof:
            began = self.clock()
            if not gpu:
                self.set_profile(inside.hook)
            try:
                self.kernel(prepared)
            finally:
                self.set_profile(None)
            if gpu:
                self.torch.cuda.synchronize()
            wall_us = (self.clock() - began) * 1e6
        problem = self.threads.found or self.tripwire.check()
        if problem:
            return _fail(problem)
        totals: dict[str, list[float]] = {}
        for event in prof.events():
            kind = str(event.device_type).rpartition(".")[2]
            if gpu and kind == "CUDA":
                us = event.time_range.elapsed_us()
            elif not gpu and kind == "CPU" and _outermost_op(event):
                us = event.cpu_time_total
            else:
                continue
            entry = totals.setdefault(event.name, [0.0, 0])
            entry[0] += float(us)
            entry[1] += 1
        return {"ok": True, "device": "gpu" if gpu else "cpu", "wall_us": wall_us,
                "kernels": [[name, us, calls] for name, (us, calls) in totals.items()],
                "own": [[name, us, calls] for name, (us, calls) in inside.spent.items()]}, b""

    def op_fetch(self, req: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """The last call's output, whole (the pytest process asks for it after the call)."""
        if self.last is None:
            return _fail("fetch requested without a call before it")
        snap, self.last = self.last, None
        return self._checked(snap, req)

    # -- one call ---------------------------------------------------------------------------

    def _inputs(self, case: dict[str, int], seed: int) -> tuple[Any, Any]:
        pristine = self.generate(case, seed, self.device)
        clone, tensor = self.clone, self.Tensor
        given = forms.rebuild(pristine, lambda t: clone(t) if _isinstance(t, tensor) else t)
        self._clear_output(given)
        return pristine, given

    def _clear_output(self, given: Any) -> None:
        out_idx = self.output_index
        if out_idx is None:
            return
        found = leaves(given)
        if out_idx >= _len(found) or not _isinstance(found[out_idx], self.Tensor):
            raise forms.TaskMismatch(forms.output_problem(given, out_idx))
        if found[out_idx].is_floating_point():
            self.fill_(found[out_idx], float("nan"))

    def _run(self, fn: Any, pristine: Any, given: Any,
             probe: bool = False) -> tuple[Any, float, float, str | None]:
        """Time ``fn(given)``, snapshot its output at once, check:
        (snapshot, raw_us, outside_us, problem)."""
        prepared = given if self.prepare is None else self.prepare(given)
        out, raw, outside = self.timer.time_call(fn, given if probe else prepared)
        parts = self._parts(out)
        snap = None
        if parts is not None:
            clones = [self.clone(t) for t in parts]
            snap = clones[0] if _type(out) is self.Tensor else (
                clones if _isinstance(out, list) else named_like(out, clones))
        # A thread the call left running its code (threads.py) comes first: the output that
        # was copied may not be the one the thread goes on to write.
        problem = None if probe else (self.threads.found
                                      or self._check_output(out, parts, given))
        problem = self._check_inputs(pristine, given) or problem
        problem = problem or self.tripwire.check()
        if problem is None and not probe:
            for t in parts or ():
                if t.is_floating_point():
                    # Poison what was returned: a later torch.empty_like() that lands on this
                    # memory must not find a finished result there. A tensor that requires
                    # grad refuses the in-place write; its detached view shares its memory.
                    self.fill_(self.detach(t) if t.requires_grad else t, float("nan"))
        return snap, raw, outside, problem

    def _parts(self, out: Any) -> list[Any] | None:
        """The tensors of an output: one plain tensor, or a tuple or list of them (GPU MODE
        and KernelBench outputs may be several); None for anything else."""
        if _type(out) is self.Tensor:
            return [out]
        if _isinstance(out, (tuple, list)) and out and all(
                _type(t) is self.Tensor for t in out):
            return list(out)
        return None

    def _check_output(self, out: Any, parts: list[Any] | None, given: Any) -> str | None:
        """Structural checks the worker can make; returns a failure reason or None."""
        if parts is None:
            kind = f"{_type(out).__module__}.{_type(out).__qualname__}"
            if _isinstance(out, (tuple, list)) and out:
                i, odd = next((i, t) for i, t in _enumerate(out) if _type(t) is not self.Tensor)
                kind += (f" whose part {i} is {_type(odd).__module__}."
                         f"{_type(odd).__qualname__}")
            elif _isinstance(out, (tuple, list)):
                kind = f"an empty {kind}"
            return f"returned {kind}, expected a plain torch.Tensor (or a tuple of them)"
        for i, part in _enumerate(parts):
            problem = self._check_part(part, given)
            if problem:
                return problem if _len(parts) == 1 else f"output {i}: {problem}"
        return None

    def _check_part(self, out: Any, given: Any) -> str | None:
        return part_problem(out, given, tensor=self.Tensor, device=self.device,
                            output_index=self.output_index,
                            inputs_may_be_outputs=self.inputs_may_be_outputs)

    def _check_inputs(self, pristine: Any, given: Any) -> str | None:
        """Whether every input still holds its bits. On a GPU one synchronisation for all of
        them: an equality test each (a synchronisation each, on a contiguous copy of a
        transposed input) was ~15% of the worker's time in a profile of a short benchmark's
        rounds on the H200 (notes/timing.md, "The per-call path")."""
        if self.inputs_may_be_outputs:
            return None
        on_device: list[tuple[int, Any, Any]] = []
        for i, (p, g) in _enumerate(_zip(leaves(pristine), leaves(given))):
            if i == self.output_index or not _isinstance(p, self.Tensor):
                continue
            if p.shape != g.shape or p.dtype != g.dtype:
                return self._modified(i)
            if p.is_cuda:  # ``g`` is its clone: on the same device
                on_device.append((i, _bits(p), _bits(g)))
            elif not self.equal(_bits(p), _bits(g)):
                return self._modified(i)
        if not on_device:
            return None
        changed = self.stack([self.any(self.ne(p, g)) for _, p, g in on_device])
        if not self.item(self.any(changed)):
            return None
        flags = changed.tolist()
        return self._modified(next(i for (i, _, _), flag in _zip(on_device, flags) if flag))

    def _modified(self, index: int) -> str:
        hint = "" if self.output_index is not None or self.problem["form"] != "native" else (
            f" (if input {index} is a preallocated output the kernel writes, the task's "
            f"task.toml sets output_index = {index})")
        return f"modified input {index} in place; inputs must be left unchanged{hint}"


class _Inside:
    """A profile hook (``sys.setprofile``) adding up the wall time spent in the functions
    named ``names`` of the file ``path``: their own frames, and the launches of them through
    Triton's interpreter (its ``run``/``__call__`` frames whose ``self.fn`` is one: argument
    copies and grid included). Outermost calls only."""

    def __init__(self, names: set[str], path: str, clock: Any) -> None:
        self.names, self.path, self.clock = names, path, clock
        self.spent: dict[str, list[float]] = {}
        self.open: list[tuple[Any, str, float]] = []

    def _declared(self, code: Any) -> bool:
        return code.co_name in self.names and code.co_filename == self.path

    def hook(self, frame: Any, event: str, _arg: Any) -> None:
        code = frame.f_code
        if event == "call":
            name = None
            if self._declared(code):
                name = code.co_name
            elif code.co_name in ("run", "__call__") and "triton" in code.co_filename:
                fn = getattr(frame.f_locals.get("self"), "fn", None)
                inner = getattr(fn, "__code__", None)
                if inner is not None and self._declared(inner):
                    name = inner.co_name
            if name is not None:
                self.open.append((frame, name, self.clock()))
        elif event == "return" and self.open and self.open[-1][0] is frame:
            _, name, began = self.open.pop()
            if not self.open:
                entry = self.spent.setdefault(name, [0.0, 0])
                entry[0] += (self.clock() - began) * 1e6
                entry[1] += 1


def _outermost_op(event: Any) -> bool:
    """A torch op (``aten::``) that no other torch op called."""
    if not event.name.startswith("aten::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def part_problem(out: Any, given: Any, *, tensor: type, device: Any, output_index: int | None,
                 inputs_may_be_outputs: bool) -> str | None:
    """Why one returned tensor cannot be judged as a kernel's own output (on another device than
    its inputs, expanded, sharing memory with an input other than the preallocated output), or
    None. The worker's check of every call; task validation's of the reference's output."""
    first = next((t for t in leaves(given) if _isinstance(t, tensor)), None)
    expected = first.device if first is not None else device
    if str(out.device) != str(expected):
        return f"returned a tensor on {out.device}, expected {expected}"
    for size, stride in _zip(out.shape, out.stride()):
        if stride == 0 and size > 1:
            return (f"returned an expanded tensor (stride 0, strides {tuple(out.stride())}); "
                    "write every element")
    if inputs_may_be_outputs or out.numel() == 0:  # no element to share
        return None
    lo, hi = _extent(out)
    for i, t in _enumerate(leaves(given)):
        if i == output_index or not _isinstance(t, tensor) or t.numel() == 0:
            continue
        t_lo, t_hi = _extent(t)
        if lo < t_hi and t_lo < hi:
            return f"returned a tensor sharing memory with input {i}; write a separate output"
    return None


def _extent(t: Any) -> tuple[int, int]:
    """The byte range of ``t``'s storage (a view's covers its base)."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + max(storage.nbytes(), 1)


def _bytes_view(t: Any) -> Any:
    import torch

    return t.detach().contiguous().view(-1).view(torch.uint8)


_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(t: Any) -> Any:
    """``t``'s elements as integers of their size, in place (so NaN equals NaN and -0 is not 0),
    without the copy a non-contiguous tensor's bytes would cost; its bytes where no integer
    type has its element size."""
    import torch

    name = _SAME_SIZE_INT.get(t.element_size())
    if name is not None:
        try:
            return t.detach().view(getattr(torch, name))
        except RuntimeError:
            pass  # a dtype that cannot be viewed so
    return _bytes_view(t)


def named_like(out: Any, parts: list[Any]) -> tuple[Any, ...]:
    """``parts`` as a tuple named like ``out`` where ``out`` is a named tuple or one of torch's
    (``torch.topk``'s values and indices): a problem's own check reads them by name."""
    fields = getattr(_type(out), "__match_args__", None) if _type(out) is not tuple else None
    if (_isinstance(fields, tuple) and _len(fields) == _len(parts)
            and all(_isinstance(f, str) for f in fields)):
        try:
            return forms.named_tuple(_type(out).__name__, fields)(*parts)
        except ValueError:  # a name namedtuple refuses: the plain tuple
            pass
    return tuple(parts)


def _serialise(out: Any, spec: Any, offers: handover.Offers) -> tuple[dict[str, Any], Any]:
    """An output's header and the bytes that go in the frame; several tensors (a tuple or list)
    as ``parts``. ``spec`` (the request's ``handover``): the kinds the pytest process takes and
    the size above which a tensor goes that way instead of into the frame."""
    if _isinstance(out, (tuple, list)):
        metas, payloads = [], []
        for part in out:
            meta, payload = _serialise(part, spec, offers)
            metas.append(meta)
            payloads.append(payload)
        whole = b"".join(payloads)
        meta = {"parts": metas, "container": "list" if _isinstance(out, list) else "tuple",
                "nbytes": _len(whole)}
        if _isinstance(getattr(_type(out), "_fields", None), tuple):  # named_like's
            meta["named"] = [_type(out).__name__, [str(f) for f in _type(out)._fields]]
        return meta, whole
    flat = _bytes_view(out)
    meta: dict[str, Any] = {"shape": list(out.shape),
                            "dtype": str(out.dtype).removeprefix("torch."),
                            "nbytes": flat.numel()}
    if spec and flat.numel() > int(spec.get("above", 0)):
        shared = handover.offer(flat, list(spec.get("kinds", [])), offers)
        if shared is not None:
            meta["shared"] = shared
            return meta, b""
    # A view of the bytes, not a copy (ctypes.string_at took the size as a C int: an output
    # over 2 GiB failed with "Negative size passed to PyBytes_FromStringAndSize").
    return meta, handover.host_bytes(flat.cpu())


class _NotStarted(Exception):
    """The worker did not start (the task's reference or the machine failed); the hello said
    so."""


def main(argv: list[str]) -> int:
    try:
        runner = Runner(int(argv[1]), int(argv[2]))
    except _NotStarted:
        return 3
    runner.serve()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()  # the candidate's prints, for its log
    sys.stderr.flush()
    # Skip the interpreter's finalisation: with torch imported it takes 0.42 s (2-core CPU),
    # and the pytest process waits for every worker it closes; nothing of a worker is left to
    # save once it was told to exit (a candidate's leftover children die with its group).
    os._exit(code)
