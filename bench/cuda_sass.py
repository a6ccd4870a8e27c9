"""The CUDA seed's kernels as nvcc builds them for sm_90a, read on the CPU (no GPU needed): per
GEMM kernel its registers, spilled bytes and ptxas remarks (C75xx: wgmma serialised, a
warpgroup.arrive injected), and its main loop's SASS by kind of instruction.

    python3 bench/cuda_sass.py [FILE ...] [--variants NAME ...] [--dump DIR]

FILE: kernel files that build as the seed does (default: the seed); --variants: cuda_sweep.py's
VARIANTS of the seed, each patched as the sweep patches it. The main loop is the one that holds
the HGMMA: from the target of the first backward branch past the last HGMMA to that branch,
less any block a forward branch skips that packs C to bf16 (a previous tile's epilogue run in
a tile's first step only, as notes/patches/cuda_wgmma_epi_defer.diff places it), so its count
is the instructions one K step issues; `loop at` gives its first address and that address's
offset in a 128-byte line (where it sits in the code); `after the loop` counts what every tile
runs between the loop's last step and the first branch after it, with the register moves
among them (a copied accumulator shows as 64 moves at BLOCK_N 128). --dump DIR keeps each
file's SASS.
Needs nvcc, cuobjdump and nvdisasm: CUDA's own, or PyPI's `nvidia-cuda-cuobjdump` and
`nvidia-cuda-nvdisasm` wheels (`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`,
found in the installed `nvidia/*/bin`). Used for issue 33's instruction counts
(notes/fp8_gemm_h200.md, "Instructions on the consumers' path").
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
KINDS = ["HGMMA", "WARPGROUP.DEPBAR", "R2UR", "PRMT", "F2FP", "FFMA", "LDSM", "LDS", "BAR"]
ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
BRANCH = re.compile(r"\bBRA (?:`\()?0x([0-9a-f]+)")
COPY = re.compile(r"\b(?:MOV R\d+, R\d+|IMAD\.MOV\.U32 R\d+, RZ, RZ, R\d+)\b")  # reg to reg


def tool_path() -> str:
    """PATH with cuobjdump and nvdisasm on it; SystemExit naming the wheels when neither CUDA's
    own nor PyPI's are found."""
    folders = []
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        folders += sorted(str(p.parent) for p in Path(base).glob("*/bin/cuobjdump"))
        folders += sorted(str(p.parent) for p in Path(base).glob("*/bin/nvdisasm"))
    path = os.pathsep.join([*dict.fromkeys(folders), os.environ.get("PATH", "")])
    missing = [t for t in ("nvcc", "cuobjdump", "nvdisasm") if not shutil.which(t, path=path)]
    if missing:
        raise SystemExit(f"cuda_sass: {', '.join(missing)} not found; nvcc comes with CUDA, the "
                         "others with it or from PyPI: pip install nvidia-cuda-cuobjdump "
                         "nvidia-cuda-nvdisasm")
    return path


def build_of(path: Path) -> dict:
    """The load_inline call that kernel file ``path`` makes when it is imported (nothing is
    built: the call is caught)."""
    import torch.utils.cpp_extension as extension

    calls: list[dict] = []
    real = extension.load_inline
    extension.load_inline = lambda **kw: calls.append(kw) or types.SimpleNamespace()
    try:
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "cuda_sass_target"})
    finally:
        extension.load_inline = real
    if not calls or not calls[0].get("cuda_sources"):
        raise SystemExit(f"cuda_sass: {path} made no load_inline call with cuda_sources")
    return calls[0]


def compile_sass(path: Path, folder: Path, tools: str) -> tuple[str, str]:
    """(ptxas's report, cuobjdump's SASS) of ``path``'s CUDA part, built with its own flags."""
    import torch.utils.cpp_extension as extension

    build = build_of(path)
    source, obj = folder / f"{path.stem}.cu", folder / f"{path.stem}.o"
    source.write_text("\n".join(build["cuda_sources"]))
    env = {**os.environ, "PATH": tools}
    proc = subprocess.run(
        ["nvcc", "-c", "-o", str(obj), str(source), *extension.COMMON_NVCC_FLAGS,
         "-Xcompiler", "-fPIC", *build.get("extra_cuda_cflags", []), "-std=c++20",
         "-Xptxas", "-v"], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise SystemExit(f"cuda_sass: nvcc failed on {path}:\n{proc.stderr[-4000:]}")
    sass = subprocess.run(["cuobjdump", "-sass", str(obj)], capture_output=True, text=True,
                          env=env, timeout=300, check=True).stdout
    return proc.stdout + proc.stderr, sass


def label(mangled: str) -> str:
    """``_Z11gemm_kernelILi128ELi1EEv...`` -> ``gemm_kernel<128, 1>`` (int and bool template
    arguments; the name alone where there are none)."""
    match = re.match(r"_Z(\d+)", mangled)
    if not match:
        return mangled
    start = match.end()
    name = mangled[start:start + int(match.group(1))]
    rest = mangled[start + len(name):]
    if not rest.startswith("I"):
        return name
    args = re.findall(r"L([ib])(\d+)E", rest.split("EEv")[0] + "E")  # up to the arguments' end
    shown = [v if kind == "i" else ("true" if v == "1" else "false") for kind, v in args]
    return f"{name}<{', '.join(shown)}>"


def kernels(sass: str) -> dict[str, list[str]]:
    """Each function's instruction lines, by its mangled name."""
    found: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = block.partition("\n")
        found[name.strip()] = [line for line in body.splitlines() if ADDRESS.search(line)]
    return found


def loop_bounds(lines: list[str]) -> tuple[int, int] | None:
    """The indices of the first and last instruction (its backward branch) of the loop that
    holds the HGMMA; None where the function has none."""
    at = [int(ADDRESS.search(line).group(1), 16) for line in lines]
    mma = [i for i, line in enumerate(lines) if "HGMMA" in line]
    if not mma:
        return None
    for i in range(mma[-1], len(lines)):
        branch = BRANCH.search(lines[i])
        if branch and int(branch.group(1), 16) <= at[mma[0]]:
            return at.index(int(branch.group(1), 16)), i
    return None


def main_loop(lines: list[str]) -> list[str]:
    """The instructions of the loop that holds the HGMMA (see the module's docstring); [] where
    the function has none."""
    bounds = loop_bounds(lines)
    return once_a_tile_dropped(lines[bounds[0]:bounds[1] + 1]) if bounds else []


def after_loop(lines: list[str]) -> list[str]:
    """What every tile runs once its last K step is done, up to the first branch (the seed's
    test for a cut tile): the instructions after the main loop's backward branch, that branch
    included. Register moves here are a whole accumulator copied (the seed's fixup copy made
    64 of 69, issue 33)."""
    bounds = loop_bounds(lines)
    if not bounds:
        return []
    for j in range(bounds[1] + 1, len(lines)):
        if opcode(lines[j]) == "BRA":  # with a predicate operand too (BRA P3, 0x...)
            return lines[bounds[1] + 1:j + 1]
    return lines[bounds[1] + 1:]


def moves(lines: list[str]) -> int:
    """Register-to-register moves among ``lines`` (MOV, IMAD.MOV.U32 ..., RZ, RZ, Rn)."""
    return sum(1 for line in lines if COPY.search(line))


def once_a_tile_dropped(loop: list[str]) -> list[str]:
    """``loop`` without the blocks a forward branch skips that pack C to bf16 (``F2FP.BF16``):
    a tile's epilogue run inside the next tile's first K step only (as
    notes/patches/cuda_wgmma_epi_defer.diff does; the seed has none in its loop)."""
    at = [int(ADDRESS.search(line).group(1), 16) for line in loop]
    kept, i = [], 0
    while i < len(loop):
        kept.append(loop[i])
        branch = BRANCH.search(loop[i])
        target = int(branch.group(1), 16) if branch else -1
        if target > at[i] and target in at:
            end = at.index(target)
            if any("F2FP.BF16" in line for line in loop[i + 1:end]):
                i = end
                continue
        i += 1
    return kept


def loop_at(loop: list[str]) -> str:
    """The loop's first address and its byte offset in a 128-byte line ('-' for no loop). The
    offset alone moved nothing beyond the noise (cuda_sweep.py's pad variants, one H100)."""
    if not loop:
        return "-"
    top = int(ADDRESS.search(loop[0]).group(1), 16)
    return f"{top:#x} (+{top % 128})"


def opcode(line: str) -> str:
    text = line.split("*/", 1)[1].strip() if "*/" in line else line.strip()
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split(" ", 1)[0].rstrip(";")


def census(loop: list[str]) -> Counter:
    """Instructions of ``loop`` by the KINDS above (a kind counts every opcode it begins)."""
    counts: Counter = Counter()
    for line in loop:
        op = opcode(line)
        for kind in KINDS:
            if op == kind or op.startswith(kind + "."):
                counts[kind] += 1
    return counts


def ptxas_rows(report: str) -> dict[str, dict]:
    """Per mangled kernel: registers, spilled bytes (stores + loads) and its C75xx remarks."""
    rows: dict[str, dict] = {}

    def row(kernel: str) -> dict:
        return rows.setdefault(kernel, {"registers": None, "spills": 0, "remarks": set()})

    current = None
    for line in report.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'", line)
        if entry:
            current = row(entry.group(1))
            continue
        remark = re.search(r"\((C75\d\d)\).*function '(\w+)", line)
        if remark:
            row(remark.group(2))["remarks"].add(remark.group(1))
        if current is None:
            continue
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            current["spills"] = int(spill.group(1)) + int(spill.group(2))
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current["registers"] = int(used.group(1))
    return rows


def table(name: str, report: str, sass: str) -> list[str]:
    rows = ptxas_rows(report)
    out = [f"{name}:", "| kernel | registers | spilled bytes | remarks | instructions a step | "
           "loop at | after the loop (moves) | " + " | ".join(KINDS) + " |",
           "|---" * (7 + len(KINDS)) + "|"]
    for mangled, lines in sorted(kernels(sass).items(), key=lambda kv: label(kv[0])):
        if "gemm" not in mangled:
            continue
        loop, row, after = main_loop(lines), rows.get(mangled, {}), after_loop(lines)
        counts = census(loop)
        out.append(f"| {label(mangled)} | {row.get('registers')} | {row.get('spills', 0)} | "
                   f"{' '.join(sorted(row.get('remarks', ()))) or '-'} | {len(loop)} | "
                   f"{loop_at(loop)} | {len(after)} ({moves(after)}) | "
                   + " | ".join(str(counts[k]) for k in KINDS) + " |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="kernel files (default: the seed)")
    parser.add_argument("--variants", nargs="*", default=[],
                        help="bench/cuda_sweep.py's VARIANTS of the seed, patched as it does")
    parser.add_argument("--dump", type=Path, help="a folder for each file's SASS")
    args = parser.parse_args()
    import cuda_sweep

    why = cuda_sweep.unknown_variants(args.variants)
    if why:
        parser.error(why)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    tools = tool_path()
    folder = Path(tempfile.mkdtemp(prefix="ks-sass-"))
    targets = [*args.files] or ([] if args.variants else [SEED])
    targets += [cuda_sweep.probe_file(v, folder) for v in args.variants]
    for path in targets:
        report, sass = compile_sass(path, folder, tools)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{path.stem}.sass").write_text(sass)
        print("\n".join(table(path.name, report, sass)), flush=True)


if __name__ == "__main__":
    main()
