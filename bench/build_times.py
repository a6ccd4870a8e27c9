"""How long the CUDA seed takes to build and to evaluate (issue 32), as one table.

    python3 bench/build_times.py [--seed SEED.py] [--skip-pytest] [--skip-evolve]

One GPU machine with nvcc. Each step is a fresh process with TORCH_EXTENSIONS_DIR set to a new
temp dir (torch's extension cache), timed from outside by its wall clock:
(a) importing the seed, whose load_inline builds it from the empty cache, with the build split
    as ninja logged it (each object file and the link, its .ninja_log);
(b) the same import again, the cache warm (nothing rebuilt);
(c) the seed's first evaluation alone: `pytest tasks/fp8_gemm --kernel SEED --ks-baselines none
    --ks-skip-reference` with another empty cache;
(d) the default run, `pytest tasks/fp8_gemm --kernel SEED` (the reference and the task's
    baselines timed beside it), again from an empty cache;
(e) `pytest --evolve 1 tasks/fp8_gemm` in a fresh population and cache: each generation's
    evaluation as the loop reports it ("evaluate: done in N s").
(a) and (b) also report the import's own time, measured in the child around the module's
execution (the rest is Python and torch starting up). --seed times another seed file (for
instance an older one under its own build name). Prints a table; quote it in
notes/fp8_gemm_h200.md with the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    output: str = ""


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
    step = Step(label, time.perf_counter() - start, code, tail=(out + err)[-2000:],
                output=out + err)
    lines = out.strip().splitlines()
    if lines and lines[-1].startswith('{"import_s"'):
        step.import_s = json.loads(lines.pop())["import_s"]
    step.last_line = lines[-1].strip() if lines else ""
    return step


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def ninja_split(extensions_dir: Path) -> list[tuple[str, float]]:
    """Each target ninja built under ``extensions_dir`` and its seconds, from .ninja_log
    (start and end in ms): the object files compile in parallel, then the link."""
    split = []
    for log in sorted(extensions_dir.glob("*/.ninja_log")):
        for line in log.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 4 and fields[0].isdigit():
                split.append((fields[3], (int(fields[1]) - int(fields[0])) / 1000))
    return split


def generations(output: str) -> list[float]:
    """The evaluation time of each generation an --evolve run printed."""
    return [float(x) for x in re.findall(r"\| evaluate \| done in ([\d.]+) s", output)]


def table(steps: list[Step], seed: Path, split: list[tuple[str, float]],
          gens: list[float]) -> str:
    """The steps as a markdown table, then the build's split and the generations."""
    lines = [f"seed: {seed}", "", "| step | wall s | import s | exit | last line |",
             "|---|---|---|---|---|"]
    for s in steps:
        own = f"{s.import_s:.1f}" if s.import_s is not None else "-"
        lines.append(f"| {s.label} | {s.wall_s:.1f} | {own} | {s.returncode} | {s.last_line} |")
    if split:
        lines.append("\n(a)'s build as ninja logged it: " + ", ".join(
            f"{target} {seconds:.1f} s" for target, seconds in split))
    if gens:
        lines.append("(e)'s generations, evaluation: " + ", ".join(
            f"gen {g} {seconds:.1f} s" for g, seconds in enumerate(gens)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=Path, default=SEED)
    parser.add_argument("--skip-pytest", action="store_true", help="leave out (c) and (d)")
    parser.add_argument("--skip-evolve", action="store_true", help="leave out (e)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a step, at most")
    args = parser.parse_args(argv)
    seed = args.seed.resolve()
    steps, gens = [], []
    with tempfile.TemporaryDirectory(prefix="ks_build_times_") as tmp:
        caches = {name: Path(tmp) / name for name in ("import", "alone", "default", "evolve")}
        command = [sys.executable, "-c", IMPORT, str(seed)]
        steps.append(timed("(a) import, empty cache", command, caches["import"], args.timeout))
        split = ninja_split(caches["import"])
        steps.append(timed("(b) import, warm cache", command, caches["import"], args.timeout))
        pytest = [sys.executable, "-m", "pytest", "tasks/fp8_gemm", "--kernel", str(seed),
                  "-q", "-p", "no:cacheprovider"]
        if not args.skip_pytest:
            steps.append(timed("(c) the seed alone, empty cache",
                               [*pytest, "--ks-baselines", "none", "--ks-skip-reference"],
                               caches["alone"], args.timeout))
            steps.append(timed("(d) the default run, empty cache", pytest, caches["default"],
                               args.timeout))
        if not args.skip_evolve:
            evolve = [sys.executable, "-m", "pytest", "--evolve", "1", "tasks/fp8_gemm",
                      "-p", "no:cacheprovider", "--ks-population", str(Path(tmp) / "population")]
            step = timed("(e) --evolve 1, empty cache", evolve, caches["evolve"], args.timeout)
            steps.append(step)
            gens = generations(step.output)
    for step in steps:
        if step.returncode != 0:
            print(f"{step.label} exited {step.returncode}:\n{step.tail}\n", file=sys.stderr)
    print(table(steps, seed, split, gens))
    return max(s.returncode for s in steps)


if __name__ == "__main__":
    sys.exit(main())
