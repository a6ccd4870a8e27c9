"""Entry point of the candidate worker process: ``python -m pytest_kscientist.runner REQ RES``.

Everything here runs beside untrusted candidate code. The reference kernel is never loaded
here (only the task's ``generate_input``); outputs go back to the pytest process, which computes
the reference from pristine inputs and judges. Functions the checks rely on are captured, and the
harness modules dropped from ``sys.modules``, before the candidate is imported.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import traceback
from typing import Any

from pytest_kscientist import channel
from pytest_kscientist.timing import make_timer

_type = type
_isinstance = isinstance
_len = len


def _load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_line(exc: BaseException) -> str:
    text = f"{_type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else _type(exc).__name__


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
        self.fill_ = torch.Tensor.fill_
        self.rng = random.Random(os.urandom(16))
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        self.generate = _load_module(hello["reference"], "_ks_task_inputs").generate_input
        self.timer = make_timer(self.device)
        self.kernel: Any = None
        for name in [m for m in sys.modules if m.split(".")[0] == "pytest_kscientist"]:
            del sys.modules[name]
        self.send({"op": "hello", "ok": True, "overhead_us": self.timer.overhead_us})

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        channel.write_all(self.res_fd, channel.encode(self.key, self.seq_out, header, payload))
        self.seq_out += 1

    def serve(self) -> None:
        while True:
            try:
                req, _ = channel.read_frame(self.req_fd, b"", self.seq_in)
            except EOFError:
                return
            self.seq_in += 1
            op = req["op"]
            if op == "exit":
                return
            handler = getattr(self, "op_" + op)
            try:
                header, payload = handler(req)
            except BaseException as exc:  # noqa: BLE001 - isolation boundary: candidate code
                header = {"ok": False, "reason": _one_line(exc), "detail": traceback.format_exc()}
                payload = b""
            header["op"] = op
            self.send(header, payload)

    # -- requests ---------------------------------------------------------------------------

    def op_load(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        module = _load_module(req["path"], "_ks_candidate")
        kernel = getattr(module, req.get("entry", "custom_kernel"), None)
        if not callable(kernel):
            found = "nothing" if kernel is None else _type(kernel).__name__
            return {
                "ok": False,
                "reason": f"defines no callable {req.get('entry', 'custom_kernel')}(data) "
                f"(found {found}); expose it at module level",
            }, b""
        self.kernel = kernel
        return {"ok": True}, b""

    def _inputs(self, case: dict[str, int], seed: int) -> tuple[Any, Any]:
        kwargs = dict(case, seed=seed, device=self.device)
        pristine = self.generate(**kwargs)
        given = [self.clone(t) if _isinstance(t, self.Tensor) else t for t in pristine]
        out_idx = self.output_index
        if out_idx is not None and given[out_idx].is_floating_point():
            self.fill_(given[out_idx], float("nan"))
        return pristine, _type(pristine)(given)

    def _validate(self, out: Any, pristine: Any, given: Any) -> str | None:
        """Structural checks the worker can make; returns a failure reason or None."""
        if _type(out) is not self.Tensor:
            return f"returned {_type(out).__module__}.{_type(out).__qualname__}, expected a plain torch.Tensor"
        if str(out.device) != str(given[0].device):
            return f"returned a tensor on {out.device}, expected {given[0].device}"
        for size, stride in zip(out.shape, out.stride()):
            if stride == 0 and size > 1:
                return f"returned an expanded tensor (stride 0, strides {tuple(out.stride())}); write every element"
        lo = out.untyped_storage().data_ptr()
        for i, t in enumerate(given):
            if i == self.output_index or not _isinstance(t, self.Tensor):
                continue
            if t.untyped_storage().data_ptr() == lo:
                return f"returned a tensor sharing memory with input {i}; write a separate output"
        for i, (p, g) in enumerate(zip(pristine, given)):
            if i == self.output_index or not _isinstance(p, self.Tensor):
                continue
            if p.shape != g.shape or p.dtype != g.dtype or not self.equal(
                _bytes_view(p), _bytes_view(g)
            ):
                return f"modified input {i} in place; inputs must be left unchanged"
        return None

    def _call(self, given: Any) -> Any:
        return self.timer.time_call(self.kernel, given)

    def op_check(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        pristine, given = self._inputs(req["case"], req["seed"])
        out, _ = self._call(given)
        problem = self._validate(out, pristine, given)
        if problem:
            return {"ok": False, "reason": problem}, b""
        meta, payload = _serialise(out)
        return {"ok": True, "output": meta}, payload

    def op_bench(self, req: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        import time

        now = time.monotonic
        case, seeds = req["case"], req["seeds"]
        for seed in req["warmup_seeds"]:
            self._call(self._inputs(case, seed)[1])
        times: list[float] = []
        kept: list[tuple[int, Any]] = []
        k = req["sample"]
        t_start = now()
        for i, seed in enumerate(seeds):
            pristine, given = self._inputs(case, seed)
            out, elapsed = self._call(given)
            snapshot = self.clone(out) if _type(out) is self.Tensor else out
            problem = self._validate(out, pristine, given)
            if problem:
                return {"ok": False, "reason": f"timed call {i}: {problem}"}, b""
            times.append(elapsed)
            if _len(kept) < k:
                kept.append((i, snapshot))
            else:
                j = self.rng.randrange(i + 1)
                if j < k:
                    kept[j] = (i, snapshot)
            n = _len(times)
            if n >= req["min_runs"] and (now() - t_start > req["budget_s"] or _precise(times)):
                break
        metas, payloads = [], []
        for i, snap in sorted(kept, key=lambda x: x[0]):
            meta, payload = _serialise(snap)
            metas.append(dict(meta, index=i, seed=seeds[i]))
            payloads.append(payload)
        return {"ok": True, "times_us": times, "samples": metas}, b"".join(payloads)


def _precise(times: list[float]) -> bool:
    """Stop once the standard error is under 0.1% of the mean."""
    n = len(times)
    if n < 10:
        return False
    mean = sum(times) / n
    var = sum((t - mean) ** 2 for t in times) / (n - 1)
    return mean > 0 and (var / n) ** 0.5 < 1e-3 * mean


def _bytes_view(t: Any) -> Any:
    import torch

    return t.detach().contiguous().view(-1).view(torch.uint8)


def _serialise(out: Any) -> tuple[dict[str, Any], bytes]:
    import ctypes

    flat = _bytes_view(out).cpu()
    payload = ctypes.string_at(flat.data_ptr(), flat.numel()) if flat.numel() else b""
    return {
        "shape": list(out.shape),
        "dtype": str(out.dtype).removeprefix("torch."),
        "nbytes": len(payload),
    }, payload


def main(argv: list[str]) -> int:
    runner = Runner(int(argv[1]), int(argv[2]))
    runner.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
