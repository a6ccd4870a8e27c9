"""Where the CUDA seed's consumers spend their cycles: a clock-stamped build of cuda_wgmma.py.

    python3 bench/cuda_timeline.py [SHAPE ...] [--calls 20] [--set KNOB=VALUE ...]

One sm_90 GPU. The seed's kernel source is patched (PATCHES, below; the seed itself is not
changed) so that thread 0 of each consumer warpgroup adds the SM clock cycles between marks in
its K loop to one bucket each: waiting for the stage (`full`), A's fragments (`load_a`: the
conversion at the step's top, and the next step's ldmatrix issued under the MMAs), waiting
for its turn (`turn`, PINGPONG), issuing the step's MMAs (`issue`), waiting for them
(`mma_wait`), the scaling (`scale`), and between a tile's last step and the next tile's first:
up to the wait for the TMA store that last used C's buffer to have read it (`epi_wait`, with
the stream-K fixup), writing C's tile into it (`epi_write`), the fence and the store's issue
(`epi_store`), the rest (`setup`: the next tile's walk, or the whole epilogue when C is stored
from registers); the producer thread adds its waits for a free stage (`empty`). Sums over the
launch's CTAs come back through a `__device__` array read by a host function the patch adds
(`ks_timeline`).

Per shape (SHAPE: a benchmark of the task, as m6144-n7168-k256; default: the short-K and
long-K shapes profiled in notes/fp8_gemm_h200.md), after warm-up calls, `--calls` calls are
stamped; printed: each bucket's share of the consumers' cycles, cycles a K step and a tile, the
producer's share waiting for a free stage, and both builds' event times (the stamps' cost). The
marks are volatile asm: the compiler keeps them in order with the barriers and MMAs, but may
move plain arithmetic (the scaling's FMAs) across one, so neighbouring buckets can trade cycles.
--set KNOB=VALUE replaces the seed's knobs for every shape (its shape rules cleared).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
SHAPES = ["m6144-n7168-k256", "m6144-n4096-k512", "m1024-n1536-k7168", "m6144-n4608-k7168"]
# bucket -> its slot (the K step's first, then the tile's); TOTAL, STEPS, TILES: slots beside
BUCKETS = {"full": 0, "load_a": 1, "turn": 2, "issue": 3, "mma_wait": 4, "scale": 5,
           "epi_wait": 10, "epi_write": 11, "epi_store": 12, "setup": 6}
TILE_BUCKETS = ["epi_wait", "epi_write", "epi_store", "setup"]
TOTAL, STEPS, TILES, EVENTS = 7, 8, 9, 13  # EVENTS: slots a role
ROLES = ["consumer 0", "consumer 1", "producer"]
CTAS = 1024  # slots a role; a launch of more CTAs folds them (sums are what is read)

DEVICE = r"""
#define KS_TL_CTAS @CTAS@
#define KS_TL_EVENTS @EVENTS@
__device__ unsigned long long ks_tl[KS_TL_CTAS * 3 * KS_TL_EVENTS];
__device__ __forceinline__ uint32_t ks_clk() {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c) :: "memory");
    return c;
}
__device__ __forceinline__ void ks_put(int role, int event, uint32_t cycles) {
    atomicAdd(&ks_tl[((blockIdx.x % KS_TL_CTAS) * 3 + role) * KS_TL_EVENTS + event],
              (unsigned long long)cycles);
}
#define KS_MARK(ev) do { ks_u = ks_clk(); ks_acc[ev] += ks_u - ks_t; ks_t = ks_u; } while (0)
""".replace("@CTAS@", str(CTAS)).replace("@EVENTS@", str(EVENTS))

# The seed's cuda.cu includes no torch header (issue 32): it copies the stamps out (and zeroes
# them), its main.cpp makes the tensor.
HOST_CU = r"""
const char* ks_timeline_copy(void* out, bool reset) {
    static unsigned long long zeros[sizeof(ks_tl) / 8] = {};
    cudaError_t e = cudaMemcpyFromSymbol(out, ks_tl, sizeof(ks_tl));
    if (e == cudaSuccess && reset) e = cudaMemcpyToSymbol(ks_tl, zeros, sizeof(ks_tl));
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
"""
HOST_CPP = r"""
const char* ks_timeline_copy(void* out, bool reset);
// ks_timeline(out, reset): the stamps copied to the host buffer at address `out`
static PyObject* ks_timeline(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "ks_timeline(out, reset)");
    void* out = PyLong_AsVoidPtr(args[0]);
    const int reset = PyObject_IsTrue(args[1]);
    if (PyErr_Occurred()) return nullptr;
    const char* why = ks_timeline_copy(out, reset != 0);
    if (why != nullptr) return PyErr_Format(PyExc_RuntimeError, "ks_timeline: %s", why);
    Py_RETURN_NONE;
}
"""
SLOTS = CTAS * 3 * EVENTS

# (old, new): every old must occur exactly once in the seed's source.
PATCHES = [
    ('name="ks_cuda_wgmma', 'name="ks_timeline_cuda_wgmma'),
    ("static PyMethodDef METHODS[] = {\n",
     HOST_CPP + "static PyMethodDef METHODS[] = {\n"
     '    {"ks_timeline", (PyCFunction)(void (*)(void))ks_timeline, METH_FASTCALL, "stamps"},\n'),
    ("template <int BN>\n__device__ __forceinline__ void wgmma_step(",
     DEVICE + "template <int BN>\n__device__ __forceinline__ void wgmma_step("),
    # the producer: its waits for a free stage
    ("        if (threadIdx.x == 0) {\n            while (walk.next(sched, g)) {",
     "        if (threadIdx.x == 0) {\n            uint32_t ks_pw = 0, ks_ps = 0;\n"
     "            const uint32_t ks_p0 = ks_clk();\n            while (walk.next(sched, g)) {"),
    ("                    bar_wait(&empty[s], phase ^ 1);\n",
     "                    const uint32_t ks_p = ks_clk();\n"
     "                    bar_wait(&empty[s], phase ^ 1);\n"
     "                    ks_pw += ks_clk() - ks_p, ++ks_ps;\n"),
    ("                    if (++s == stages) s = 0, phase ^= 1;\n                }\n            }\n"
     "        }\n        return;",
     "                    if (++s == stages) s = 0, phase ^= 1;\n                }\n            }\n"
     "            ks_put(2, 0, ks_pw), ks_put(2, 8, ks_ps), ks_put(2, 7, ks_clk() - ks_p0);\n"
     "        }\n        return;"),
    # the consumers: thread 0 of each warpgroup
    ('    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");\n',
     '    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");\n'
     "    uint32_t ks_acc[KS_TL_EVENTS] = {};\n"
     "    const uint32_t ks_t0 = ks_clk();\n    uint32_t ks_t = ks_t0, ks_u;\n"),
    ("        bar_wait(&full[s], phase);\n        fetch(s);\n"
     "        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {\n",
     "        KS_MARK(6);\n        ++ks_acc[9];\n"
     "        bar_wait(&full[s], phase);\n        KS_MARK(0);\n        fetch(s);\n"
     "        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {\n            ++ks_acc[8];\n"),
    ("            if (pingpong) named_sync(3 + half, 256);  // my turn\n",
     "            KS_MARK(1);\n"
     "            if (pingpong) named_sync(3 + half, 256);  // my turn\n            KS_MARK(2);\n"),
    ("            if (pingpong) named_arrive(4 - half, 256);  // the other's turn\n"
     "            if (++s == stages) s = 0, phase ^= 1;\n"
     "            if (all_(kb + 1 < g.kb1)) {\n"
     "                bar_wait(&full[s], phase);\n"
     "                fetch(s);\n"
     "            }\n"
     "            wgmma_wait();\n",
     "            if (pingpong) named_arrive(4 - half, 256);  // the other's turn\n"
     "            KS_MARK(3);\n"
     "            if (++s == stages) s = 0, phase ^= 1;\n"
     "            if (all_(kb + 1 < g.kb1)) {\n"
     "                bar_wait(&full[s], phase);\n"
     "                KS_MARK(0);\n"
     "                fetch(s);\n"
     "                KS_MARK(1);\n"
     "            }\n"
     "            wgmma_wait();\n            KS_MARK(4);\n"),
    ("                acc[4 * j + 3] += part[4 * j + 3] * s1;\n            }\n",
     "                acc[4 * j + 3] += part[4 * j + 3] * s1;\n            }\n"
     "            KS_MARK(5);\n"),
    # the epilogue through shared memory and TMA
    ("            named_sync(1 + half, 128);  // the store that used the buffer has read it\n",
     "            named_sync(1 + half, 128);  // the store that used the buffer has read it\n"
     "            KS_MARK(10);\n"),
    ('            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n',
     '            KS_MARK(11);\n'
     '            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n'),
    ('                asm volatile("cp.async.bulk.commit_group;" ::: "memory");\n'
     "            }\n            continue;\n",
     '                asm volatile("cp.async.bulk.commit_group;" ::: "memory");\n'
     "            }\n            KS_MARK(12);\n            continue;\n"),
    ("    if (pingpong && half == 0) named_sync(3, 256);  // the other's last turn\n",
     "    KS_MARK(6);\n"
     "    if (pingpong && half == 0) named_sync(3, 256);  // the other's last turn\n"
     "    ks_acc[7] = ks_clk() - ks_t0;\n"
     "    if (t == 0)\n"
     "        for (int e = 0; e < KS_TL_EVENTS; ++e) ks_put(half, e, ks_acc[e]);\n"),
    ("cuda_sources=[kernel_source() + LAUNCH_SRC]",
     "cuda_sources=[kernel_source() + LAUNCH_SRC + KS_HOST_CU]"),
]


def patched(source: str) -> str:
    """The seed's source with the stamps; SystemExit naming the first anchor it lacks."""
    for old, new in PATCHES:
        if source.count(old) != 1:
            raise SystemExit(f"cuda_timeline: the seed holds {source.count(old)} copies of "
                             f"{old!r}, not one; update PATCHES to the seed's source")
        source = source.replace(old, new)
    if source.count("\ndef _build(") != 1:
        raise SystemExit("cuda_timeline: the seed has no one `def _build(` to put the stamps' "
                         "host code before; update patched() to the seed's source")
    return source.replace("\ndef _build(", f"\nKS_HOST_CU = r'''{HOST_CU}'''\n\n\ndef _build(")


def stamps(seed, reset: bool):
    """The stamped build's slots, copied to the host (and zeroed on the device when ``reset``)."""
    import torch

    out = torch.empty(SLOTS, dtype=torch.long)
    seed.module.ks_timeline(out.data_ptr(), reset)
    return out


def summary(raw: list[int]) -> dict[str, dict[str, float]]:
    """Per role, the sums over CTAs of ``raw`` (``ks_timeline``'s slots): each bucket's share of
    the role's cycles, cycles a step and a tile (consumers), the steps and tiles counted."""
    out: dict[str, dict[str, float]] = {}
    for role, name in enumerate(ROLES):
        sums = [sum(raw[(cta * 3 + role) * EVENTS + e] for cta in range(CTAS))
                for e in range(EVENTS)]
        total, steps, tiles = sums[TOTAL], sums[STEPS], sums[TILES]
        if total == 0:
            continue
        row: dict[str, float] = {"cycles": float(total), "steps": float(steps)}
        if role == 2:
            row["empty"] = sums[0] / total
        else:
            row |= {b: sums[i] / total for b, i in BUCKETS.items()}
            tile = sum(sums[BUCKETS[b]] for b in TILE_BUCKETS)
            row["tiles"] = float(tiles)
            row["cycles/step"] = (total - tile) / steps if steps else 0.0
            row["epilogue/tile"] = tile / tiles if tiles else 0.0
        out[name] = row
    return out


def table(label: str, rows: dict[str, dict[str, float]], plain_us: float, stamped_us: float) -> str:
    """One shape's summary as markdown."""
    lines = [f"### {label}: {plain_us:.1f} us as committed, {stamped_us:.1f} us stamped (events)",
             "", "| role | " + " | ".join(BUCKETS) + " | cycles/step | epilogue/tile |",
             "|---" * (len(BUCKETS) + 3) + "|"]
    for name, row in rows.items():
        if name == "producer":
            continue
        lines.append(f"| {name} | " + " | ".join(f"{100 * row[b]:.1f}%" for b in BUCKETS)
                     + f" | {row['cycles/step']:.0f} | {row['epilogue/tile']:.0f} |")
    if "producer" in rows:
        lines.append(f"\nproducer: {100 * rows['producer']['empty']:.1f}% of its cycles waiting "
                     "for a free stage")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--set", nargs="*", default=[], metavar="KNOB=VALUE")
    args = parser.parse_args()
    import torch
    from cuda_sweep import benchmark_cases, one_point, set_knobs
    from fused_sweep import load

    task = ROOT / "tasks" / "fp8_gemm"
    cases = benchmark_cases(args.shapes)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cuda_wgmma_timeline.py"
        path.write_text(patched(SEED.read_text()))
        stamped = load("cuda_wgmma_timeline", path)
        plain = load("cuda_wgmma", SEED)
    knobs = one_point(args.set, plain.TUNABLE_SPACE)
    for module in (plain, stamped):
        set_knobs(module, (module.TUNABLES, module.TUNABLES_BY_SHAPE), knobs or None)
    reference = load("fp8_reference", task / "reference.py")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def event_us(module, data) -> float:
        times = []
        for _ in range(args.calls):
            start.record()
            module.custom_kernel(data)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return sorted(times)[len(times) // 2]

    for label in args.shapes:
        case = cases[label]
        data = reference.generate_input(case["m"], case["n"], case["k"], case["seed"],
                                        device="cuda")
        for module in (plain, stamped):
            module.custom_kernel(data)  # warm-up (and the stamps of it, reset below)
        torch.cuda.synchronize()
        stamps(stamped, True)
        plain_us, stamped_us = event_us(plain, data), event_us(stamped, data)
        torch.cuda.synchronize()
        print(table(label, summary(stamps(stamped, False).tolist()), plain_us,
                    stamped_us), flush=True)
        print()


if __name__ == "__main__":
    main()
