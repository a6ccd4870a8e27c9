"""How long the CUDA seed takes to build: load_inline from an empty cache, warm, and a harness run.

    python3 bench/build_times.py [--seed SEED.py] [--cold-pch] [--skip-pytest]

One GPU machine with nvcc (issue 32). Each step is a fresh process with TORCH_EXTENSIONS_DIR
set to a new temp dir (torch's extension cache), timed from outside by its wall clock:
(a) importing the seed, whose load_inline builds it from the empty cache; (b) the same import
again, with that cache warm (nothing rebuilt); (c) `pytest tasks/fp8_gemm --kernel SEED -q -p
no:cacheprovider` with another empty cache (the harness's own build of the seed, then its
checks and benchmarks). (a) and (b) also report the import's own time, measured in the child
around the module's execution (the rest is Python and torch starting up).
torch's precompiled header for the seed's C++ wrapper (use_pch) lives beside torch's headers,
not in the cache: the table says whether it existed before (a); --cold-pch removes it first so
(a) builds it too. --seed times another seed file (for instance an older one under its own
build name). Prints a table; quote it in notes/fp8_gemm_h200.md with the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
# The child: the seed run as the harness's worker loads a candidate, its own time on stdout.
IMPORT = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("ks_build_times_seed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
start = time.perf_counter()
spec.loader.exec_module(module)
print(json.dumps({"import_s": time.perf_counter() - start}))
"""


@dataclass
class Step:
    """One timed process: what it was, its wall time, exit code (124: timed out), the import's
    own time if it reported one, its output's last line and tail."""

    label: str
    wall_s: float
    returncode: int
    import_s: float | None = None
    last_line: str = ""
    tail: str = ""


def timed(label: str, command: list[str], extensions_dir: Path, timeout_s: float) -> Step:
    """``command`` run from the repository root with TORCH_EXTENSIONS_DIR=``extensions_dir``."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions_dir)}
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, _text(exc.stdout), _text(exc.stderr) + f"\n(timed out: {exc})"
    step = Step(label, time.perf_counter() - start, code, tail=(out + err)[-2000:])
    lines = out.strip().splitlines()
    if lines and lines[-1].startswith('{"import_s"'):
        step.import_s = json.loads(lines.pop())["import_s"]
    step.last_line = lines[-1].strip() if lines else ""
    return step


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def pch_path() -> Path:
    """Where torch's load_inline(use_pch=True) keeps its precompiled torch/extension.h."""
    from torch.utils.cpp_extension import include_paths

    return Path(include_paths()[0]) / "torch" / "extension.h.gch"


def table(steps: list[Step], pch_before: bool, seed: Path) -> str:
    """The steps as a markdown table, with the PCH's state before the first."""
    lines = [f"seed: {seed}; torch's PCH before (a): {'present' if pch_before else 'absent'}",
             "", "| step | wall s | import s | exit | last line |", "|---|---|---|---|---|"]
    for s in steps:
        own = f"{s.import_s:.1f}" if s.import_s is not None else "-"
        lines.append(f"| {s.label} | {s.wall_s:.1f} | {own} | {s.returncode} | {s.last_line} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=Path, default=SEED)
    parser.add_argument("--cold-pch", action="store_true",
                        help="remove torch's precompiled header first, so (a) builds it too")
    parser.add_argument("--skip-pytest", action="store_true", help="leave out step (c)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a step, at most")
    args = parser.parse_args(argv)
    seed = args.seed.resolve()
    if args.cold_pch:
        from torch.utils.cpp_extension import remove_extension_h_precompiler_headers

        remove_extension_h_precompiler_headers()
    pch_before = pch_path().exists()
    steps = []
    with tempfile.TemporaryDirectory(prefix="ks_build_times_") as tmp:
        cache, other = Path(tmp) / "import", Path(tmp) / "pytest"
        command = [sys.executable, "-c", IMPORT, str(seed)]
        steps.append(timed("(a) import, empty cache", command, cache, args.timeout))
        steps.append(timed("(b) import, warm cache", command, cache, args.timeout))
        if not args.skip_pytest:
            pytest = [sys.executable, "-m", "pytest", "tasks/fp8_gemm", "--kernel", str(seed),
                      "-q", "-p", "no:cacheprovider"]
            steps.append(timed("(c) pytest tasks/fp8_gemm, empty cache", pytest, other,
                               args.timeout))
    for step in steps:
        if step.returncode != 0:
            print(f"{step.label} exited {step.returncode}:\n{step.tail}\n", file=sys.stderr)
    print(table(steps, pch_before, seed))
    return max(s.returncode for s in steps)


if __name__ == "__main__":
    sys.exit(main())
