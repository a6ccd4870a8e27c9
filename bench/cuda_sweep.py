"""Check and time compile-time variants of the CUDA seed (cuda_wgmma.py) beside the Triton seed.

    python3 bench/cuda_sweep.py OUT.json [--reps 30] [--variants NAME ...] [--splits 0 1]
        [--persistent 0 1] [--probes] [--parts] [--extra FILE ...]

One GPU, outside the harness (torch, triton, nvcc). Each variant is the seed's source with its
TUNABLES rewritten (evolve/knobs.py), written to a temporary file and compiled in a process of
its own, all variants at once (load_inline takes about a minute each); then, in this process,
each is checked on the task's 11 tests, the 18 benchmarks and odd shapes (the task's tolerance,
c filled with NaN first) and timed on the benchmarks with fused_sweep.py's loop (GPU MODE
protocol plus the harness's spin) for every --splits and --persistent value (read at each
call). The committed Triton seed, and any --extra kernel file, is timed in the same loop as rows
to compare with. OUT.json is rewritten after every row; the tables are printed last. Quote the
harness for seed figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

CUDA_SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
TRITON_SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "triton_fused.py"
# Compile-time knobs (COMPILED); SPLIT_K and PERSISTENT come from --splits and --persistent.
VARIANTS: dict[str, dict[str, object]] = {
    "n128_s3_g8": {"BLOCK_N": 128, "STAGES": 3, "GROUP_M": 8},
    "n128_s4_g8": {"BLOCK_N": 128, "STAGES": 4, "GROUP_M": 8},
    "n64_s4_g8": {"BLOCK_N": 64, "STAGES": 4, "GROUP_M": 8},
}
# Diagnostics of the first variant, timed but not checked (their results are wrong by design):
# the GEMM without its MMAs (the TMA ring, A's conversion and the scaling) and without its
# loads (the rest on whatever the stages hold).
PROBES = {
    "probe_no_mma": [("wgmma_step(part, frag[kk],", "if (false) wgmma_step(part, frag[kk],")],
    "probe_no_load": [("bar_expect(&full[s], STAGE_BYTES);",
                       "bar_arrive(&full[s]);\n                    continue;")],
}
ODD = [(1, 1, 1), (37, 70, 300), (200, 136, 640), (130, 260, 2000)]  # (m, n, k)


def variant_file(name: str, knobs: dict, folder: Path, patches=()) -> Path:
    from pytest_kscientist.evolve.knobs import rewrite_tunables

    path = folder / f"cuda_wgmma_{name}.py"
    source = rewrite_tunables(CUDA_SEED.read_text(), knobs)
    for old, new in [*patches, ('name="ks_cuda_wgmma_"', f'name="ks_{name}_"')] if patches else []:
        if old not in source:
            raise SystemExit(f"{name}: the seed no longer contains {old!r}; update PROBES")
        source = source.replace(old, new)
    path.write_text(source)
    return path


def compile_one(path: str) -> str:
    """Import (and so compile) one variant; '' or the error's text."""
    from fused_sweep import load

    try:
        load(Path(path).stem, Path(path))
        return ""
    except Exception:
        return traceback.format_exc()[-3000:]


def check(module, reference, cases, tolerance: dict) -> str:
    """'' when every case is within the task's tolerance (its [check]), else the first miss."""
    from pytest_kscientist.correctness import compare

    for m, n, k, seed in cases:
        data = reference.generate_input(m, n, k, seed, device="cuda")
        data[4].fill_(float("nan"))
        out = module.custom_kernel(data)
        miss = compare(out, reference.ref_kernel(data), tolerance["atol"], tolerance["rtol"])
        if miss:
            return f"m{m}-n{n}-k{k}: {miss}"
    return ""


def parts(module, labels, inputs, reps, flush) -> dict[str, dict[str, float]]:
    """B's upcast launch and the GEMM (the seed's split and PERSISTENT) timed apart."""
    from fused_sweep import gpumode_us

    out: dict[str, dict[str, float]] = {"upcast": {}, "gemm": {}, "split": {}}
    built, persistent = module.module, module.TUNABLES["PERSISTENT"]
    for label, data in zip(labels, inputs, strict=True):
        a, b = data[0], data[1]
        split = module.split_for(a.shape[0], b.shape[0], a.shape[1], module.TUNABLES["BLOCK_N"])
        b16 = built.upcast(b)
        out["upcast"][label] = gpumode_us(lambda d: built.upcast(d[1]), data, reps, flush)
        out["gemm"][label] = gpumode_us(
            lambda d, b16=b16, split=split: built.gemm(d[0], b16, d[2], d[3], d[4], split,
                                                       persistent),
            data, reps, flush)
        out["split"][label] = split
    return out


def main() -> None:
    import tomllib
    import torch
    from fused_sweep import gpumode_us, load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--splits", nargs="+", type=int, default=[0])
    parser.add_argument("--persistent", nargs="+", type=int, default=[0])
    parser.add_argument("--probes", action="store_true", help="time PROBES too")
    parser.add_argument("--parts", action="store_true",
                        help="time the seed's B upcast and GEMM apart, per shape")
    parser.add_argument("--extra", nargs="*", type=Path, default=[],
                        help="other kernel files to check and time beside (their defaults)")
    args = parser.parse_args()
    t0 = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="ks-cuda-"))
    paths = {v: variant_file(v, VARIANTS[v], folder) for v in args.variants}
    if args.probes:
        paths |= {p: variant_file(p, VARIANTS[args.variants[0]], folder, PROBES[p])
                  for p in PROBES}
    paths |= {f.stem: f.resolve() for f in args.extra}  # compiled with the variants
    with ProcessPoolExecutor(len(paths), mp_context=get_context("spawn")) as pool:
        errors = dict(zip(paths, pool.map(compile_one, map(str, paths.values())), strict=True))
    print(f"compiled {len(paths)} variants (+{time.monotonic() - t0:.0f}s)", flush=True)
    task = ROOT / "tasks" / "fp8_gemm"
    toml = tomllib.loads((task / "task.toml").read_text())
    spec = toml["profiles"]["full"]
    reference = load("fp8_reference", task / "reference.py")
    tests = [(c["m"], c["n"], c["k"], c["seed"]) for c in spec["tests"]]
    benches = [(c["m"], c["n"], c["k"], c["seed"]) for c in spec["benchmarks"]]
    labels = [f"m{m}-n{n}-k{k}" for m, n, k, _ in benches]
    inputs = [reference.generate_input(m, n, k, s, device="cuda") for m, n, k, s in benches]
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    rows: dict[str, dict] = {"_env": {"torch": torch.__version__,
                                      "device": torch.cuda.get_device_name()}}
    points = [("triton_fused", TRITON_SEED, None)] + [(f.stem, f, None) for f in args.extra] + [
        (f"{v}_split{s}_pers{p}", paths[v], {"SPLIT_K": s, "PERSISTENT": p})
        for v in args.variants for s in args.splits for p in args.persistent]
    points += [(p, paths[p], {"SPLIT_K": 1}) for p in PROBES if p in paths]
    for name, path, knobs in points:
        row: dict = {"us": {}, "failed": errors.get(name.rsplit("_split", 1)[0], "")}
        if not row["failed"]:
            try:
                module = load(path.stem, path)
                module.TUNABLES.update(knobs or {})
                if name not in PROBES:
                    row["failed"] = check(module, reference,
                                          tests + benches + [(*odd, 7) for odd in ODD],
                                          toml["check"])
                if not row["failed"]:
                    for label, data in zip(labels, inputs, strict=True):
                        row["us"][label] = gpumode_us(module.custom_kernel, data, args.reps,
                                                      flush)
                    row["geomean_us"] = math.exp(
                        sum(math.log(v) for v in row["us"].values()) / len(labels))
            except Exception:
                row["failed"] = traceback.format_exc()[-1500:]
        rows[name] = row
        args.out.write_text(json.dumps(rows, indent=1))
        print(f"{name}: {row.get('geomean_us') or row['failed']} (+{time.monotonic() - t0:.0f}s)",
              flush=True)
    if args.parts:
        module = load(CUDA_SEED.stem, CUDA_SEED)
        rows["_parts"] = parts(module, labels, inputs, args.reps, flush)
        args.out.write_text(json.dumps(rows, indent=1))
        print("\n| part | " + " | ".join(labels) + " |\n" + "|---" * (len(labels) + 1) + "|")
        for part, us in rows["_parts"].items():
            print(f"| {part} | " + " | ".join(f"{us[label]:.1f}" for label in labels) + " |")
    ok = {n: r for n, r in rows.items() if not n.startswith("_") and not r["failed"]}
    print("\n| point | geomean_us | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for name, r in sorted(ok.items(), key=lambda item: item[1]["geomean_us"]):
        print(f"| {name} | {r['geomean_us']:.1f} | "
              + " | ".join(f"{r['us'][label]:.1f}" for label in labels) + " |")
    for name, r in rows.items():
        if not name.startswith("_") and r["failed"]:
            print(f"| {name} | failed: {r['failed'][-400:]!r} |")


if __name__ == "__main__":
    main()
