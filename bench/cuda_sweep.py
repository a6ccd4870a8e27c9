"""Check and time knob points of the CUDA seed (cuda_wgmma.py) beside the Triton seed.

    python3 bench/cuda_sweep.py OUT.json [--reps 30] [--grid KNOB=V1,V2 ...] [--probes]
        [--variants [NAME ...]] [--kernels] [--extra FILE ...] [--seed FILE]

One GPU, outside the harness (torch, triton, nvcc). Every knob of the seed is read at each
call, so one build serves every point: the seed as committed (its shape rules) and each point of
the --grid product (TUNABLES with those values, rules cleared). The seed, --probes (its source
patched; timed, not checked), --variants (patched too, checked) and --extra kernel files are
compiled at once in processes of their own (load_inline takes about a minute each); then, in
this process, each point is checked on the task's 11 tests, the 18 benchmarks and odd shapes
(the task's tolerance, c filled with NaN first) and timed on the benchmarks with
fused_sweep.py's loop (GPU MODE protocol plus the harness's spin). The committed Triton seed
is timed in the same loop as a row to compare with.
--kernels: per shape, the GPU kernels' own durations (torch.profiler) of the seed as committed,
each --extra file and each variant.
--seed: a variant file in the seed's place (its grid, probes and variants), so a change can be
swept before it is written into the seed.
OUT.json is rewritten after every row; the tables are printed last, with the geomean of the
best point per shape (what shape rules could reach). Quote the harness for seed figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The plugin is imported where it is used, not here: bench/variants_device.sh and
# bench/cuda_sass.py read PROBES and VARIANTS before the device's wheels (pydantic) are in.
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

CUDA_SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
TRITON_SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "triton_fused.py"
# The fixup's texts that a probe and a variant patch: each thread's store of its partial made a
# no-op, and the fence between the stores and the barrier before thread 0's count taken away.
FIXUP_STORE = ("        __stcg(mine + j * 128,", "        if (false) __stcg(mine + j * 128,")
_STORED = "                                           acc[4 * j + 3]));\n"
FIXUP_UNFENCED = (_STORED + "    __threadfence();\n    named_sync(1 + half, 128);\n",
                  _STORED + "    named_sync(1 + half, 128);\n")
# Diagnostics of the seed as committed (its shape rules too), timed but not checked (their
# results are wrong by design): the GEMM without its MMAs (the TMA ring, A's conversion and the
# scaling), without writing C, without its loads (the rest on whatever the stages hold), and
# with half of B's bytes.
PROBES = {
    "probe_no_mma": [("wgmma_step<BN>(part,", "if (false) wgmma_step<BN>(part,")],
    "probe_no_store": [("continue;  // another CTA of this tile writes it",
                        "continue;  // another CTA of this tile writes it\n        continue;")],
    "probe_no_load": [("bar_expect(&full[s], STAGE_BYTES + a_bytes + 16);",
                       "bar_arrive(&full[s]);\n                    if (++s == stages) s = 0, "
                       "phase ^= 1;\n                    continue;")],
    # B's second K half never loaded (a third of a step's bytes less, the consumers' work the
    # same): how much of a step's time the bytes decide.
    "probe_half_b": [("bar_expect(&full[s], STAGE_BYTES + a_bytes + 16);",
                      "bar_expect(&full[s], STAGE_BYTES - B_HALF + a_bytes + 16);"),
                     ("for (int h = 0; h < 2; ++h)\n" + " " * 24 + "tma_load(st + A_BYTES",
                      "for (int h = 0; h < 1; ++h)\n" + " " * 24 + "tma_load(st + A_BYTES")],
    # Stream-K's fixup taken apart where tiles are cut (the seed's rules): none of it (each CTA
    # holding part of a tile writes C as if it held the tile whole), no partial stored or
    # fenced before the count, and no other CTA's partial read by the last to count. Their K
    # loops can differ from the seed's (`bench/cuda_sass.py`, gemm_kernel<128, 1>: 204, 198 and
    # 200 instructions a step against 194 when timed; on 321d20a's seed 204, 193 and 199
    # against 193), so read them where tiles are cut against their drift on the shapes where
    # none is (the k < 1792 shapes and m1024-n1536-k7168).
    "probe_fixup_free": [("    float4* mine = slot(blockIdx.x, g.first);\n",
                          "    if (true) return true;\n    float4* mine = slot(blockIdx.x, "
                          "g.first);\n")],
    "probe_fixup_no_store": [FIXUP_STORE, FIXUP_UNFENCED],
    "probe_fixup_no_read": [("        const long first_of = s.sk_units * cta / s.sk_ctas;\n",
                             "        return;\n"
                             "        const long first_of = s.sk_units * cta / s.sk_ctas;\n")],
}
ODD = [(1, 1, 1), (37, 70, 300), (200, 136, 640), (130, 260, 2000)]  # (m, n, k)
# Variants of the seed's kernel, checked like the seed and timed at its committed knobs: changes
# to try before one earns a knob. turns_lapse: PINGPONG's turn-taking
# holds inside each run of K steps of a tile but not across tiles: the first step of each is
# issued without waiting, so neither consumer waits through the other's epilogue to start the
# next tile. Per run of S steps, half 1 waits for half 0's step i (i >= 2) and half 0 for
# half 1's step i - 1: S - 1 arrivals and waits on each named barrier. Measured slower than the
# seed (harness 88.19 vs 85.29 us, notes/fp8_gemm_h200.md, "The consumers' cycles by bucket").
# setup_ahead: a consumer takes its next segment and that tile's origin (integer divisions by
# run-time values) while its first K step's MMAs run, between the commit and the wait, instead
# of between tiles (the timeline's `setup`, 12.5% of the consumers' cycles at short K; the
# SASS has the divisions between the HGMMA and its WARPGROUP.DEPBAR). Measured in one H200 call
# beside the seed: plain loop 83.8 vs 84.7 us, harness 85.73 vs 85.61: no gain the harness sees.
# bitcvt: A's e4m3 bytes become fp16 by integer ops instead of cvt (F2FP): a prmt that copies
# the byte and replicates its sign into the byte above, a shift by 7 and a mask put the sign in
# bit 15 and the exponent and mantissa in bits 13-7, which is the e4m3 value / 256 exactly
# (e4m3's subnormals become fp16 subnormals); the step's scales carry the 256. NaN bytes (0x7f,
# 0xff) would read 480 / -480. nozero: a tile's first K step writes the accumulator (acc = part
# * s) instead of zeroing it first and adding (the zeroing sat in the timeline's `setup`).
# Measured (one H100 call, --reps 30, checked): seed 84.5 us, bitcvt 86.4, bitcvt_nozero 86.5;
# the integer conversion is slower (notes/fp8_gemm_h200.md, "A's conversion by integer ops").
# turns_runs: a turn is a run of up to stages / 2 K steps of a tile (a k256 tile whole on four
# stages), so one consumer's epilogue can run under the other's MMAs on the shared tile. A turn
# of R steps finishes only if R <= stages (the one holding it needs R stages that the other has
# not yet given back) and overlaps only if 2R <= stages; a turn of a whole tile hung on the
# H100 at the first long-K shape (tests/test_bench_cuda_sweep.py models the ring). Measured
# (one H100, as PINGPONG 2 of a copy of the seed, bench/knob_probe.py): GEMM 57.3 against 58.4
# us at m6144-n7168-k256, 681.8 against 667.1 at m6144-n4608-k7168 (notes/fp8_gemm_h200.md,
# "Turns a run of steps long").
# In the seed since 2026-12-07 (measured as variants desc_ahead, cvt_h1, desc_cvt, desc_cvt_lo:
# 247 -> 209 SASS instructions a step, harness 83.62 against 86.73 us on one H100; notes/
# fp8_gemm_h200.md, "Instructions on the consumers' path"): B's descriptor made once a step
# and passed as its low word, and one byte permute per raw word of A.
PAIR_END = '        : "=r"(lo), "=r"(hi) : "r"(__byte_perm(r, 0, 0x3120)));\n}\n'
BITCVT = [
    (PAIR_END,
     PAIR_END + "template <uint32_t SEL>\n"
     "__device__ __forceinline__ uint32_t f16x2_div256(uint32_t r) {\n"
     "    uint32_t x;\n"
     "    asm(\"prmt.b32 %0, %1, 0, %2;\" : \"=r\"(x) : \"r\"(r), \"n\"(SEL));\n"
     "    return (x << 7) & 0xBF80BF80u;\n}\n"),
    ("            f16x2_pair(raw[q][2 * j], frag[2 * q + j][0], frag[2 * q + j][1]);\n"
     "            f16x2_pair(raw[q][2 * j + 1], frag[2 * q + j][2], frag[2 * q + j][3]);\n",
     "            frag[2 * q + j][0] = f16x2_div256<0xA280>(raw[q][2 * j]);\n"
     "            frag[2 * q + j][1] = f16x2_div256<0xB391>(raw[q][2 * j]);\n"
     "            frag[2 * q + j][2] = f16x2_div256<0xA280>(raw[q][2 * j + 1]);\n"
     "            frag[2 * q + j][3] = f16x2_div256<0xB391>(raw[q][2 * j + 1]);\n"),
    ("            const float s0 = sa0 * sb, s1 = sa1 * sb;\n",
     "            const float s0 = sa0 * sb * 256.f, s1 = sa1 * sb * 256.f;\n"),
]
NOZERO = [
    ("#pragma unroll\n        for (int i = 0; i < NR; ++i) acc[i] = 0.f;\n", ""),
    ("#pragma unroll\n            for (int j = 0; j < NR / 4; ++j) {\n"
     "                acc[4 * j] += part[4 * j] * s0;\n",
     "            if (kb == g.kb0) {\n#pragma unroll\n"
     "                for (int j = 0; j < NR / 4; ++j) {\n"
     "                    acc[4 * j] = part[4 * j] * s0, acc[4 * j + 1] = part[4 * j + 1] * s0;\n"
     "                    acc[4 * j + 2] = part[4 * j + 2] * s1,\n"
     "                    acc[4 * j + 3] = part[4 * j + 3] * s1;\n"
     "                }\n            } else\n#pragma unroll\n"
     "            for (int j = 0; j < NR / 4; ++j) {\n"
     "                acc[4 * j] += part[4 * j] * s0;\n"),
]
# a_ahead: the producer thread loads A's tiles and A's scales of the ring's first stages before
# it waits for the upcast (OVERLAP's griddepcontrol.wait): they need nothing the upcast writes.
# Where the upcast's grid leaves SMs free (m1024-n7168-k256: 56 blocks for 132 SMs) or drains,
# the GEMM's CTAs start early and sat idle at the wait; now A's first bytes come from HBM
# meanwhile. The consumers wait as before. Timed 2026-12-07 (one H100, two calls): 1.2 us less
# GEMM at m1024-n512-k7168, 5-8% more at m6144-n4608-k7168; rejected (notes/fp8_gemm_h200.md).
A_AHEAD = [
    ('    // OVERLAP: wait for the upcast\'s writes (B, its scales, the counters); else a no-op\n'
     '    asm volatile("griddepcontrol.wait;" ::: "memory");\n',
     '    // OVERLAP: wait for the upcast\'s writes (B, its scales, the counters); else a no-op.\n'
     '    // The producer thread loads A of the ring\'s first stages before it waits.\n'
     '    if (threadIdx.x != 0) asm volatile("griddepcontrol.wait;" ::: "memory");\n'),
    ("        if (threadIdx.x == 0) {\n            while (walk.next(sched, g)) {\n",
     "        if (threadIdx.x == 0) {\n"
     "            int ahead = 0;  // steps whose A (tile and scales) is loaded before the wait\n"
     "            {\n"
     "                Walk w = walk;\n"
     "                Seg g2;\n"
     "                while (ahead < stages && w.next(sched, g2)) {\n"
     "                    int m0, n0;\n"
     "                    tile_origin<BN>(sched, g2.tile, m0, n0);\n"
     "                    const uint32_t a_bytes = (min(BM, sched.m - m0) + 3) / 4 * 16;\n"
     "                    for (int kb = g2.kb0; kb < g2.kb1 && ahead < stages; ++kb, ++ahead) {\n"
     "                        bar_expect(&full[ahead], STAGE_BYTES + a_bytes + 16);\n"
     "                        tma_load(smem + ahead * STAGE_BYTES, &map_a, &full[ahead], m0,\n"
     "                                 kb * BK);\n"
     "                        bulk_load(scales + ahead * BM * 4, as + kb * lds + m0, a_bytes,\n"
     "                                  &full[ahead]);\n"
     "                    }\n"
     "                }\n"
     "            }\n"
     '            asm volatile("griddepcontrol.wait;" ::: "memory");\n'
     "            int issued = 0;\n"
     "            while (walk.next(sched, g)) {\n"),
    ("                    bar_expect(&full[s], STAGE_BYTES + a_bytes + 16);\n"
     "                    tma_load(st, &map_a, &full[s], m0, kb * BK);\n",
     "                    const bool early = issued++ < ahead;  // the ring's first pass\n"
     "                    if (!early) {\n"
     "                        bar_expect(&full[s], STAGE_BYTES + a_bytes + 16);\n"
     "                        tma_load(st, &map_a, &full[s], m0, kb * BK);\n"
     "                    }\n"),
    ("                    bulk_load(scales + s * BM * 4, as + kb * lds + m0, a_bytes, &full[s]);\n",
     "                    if (!early)\n"
     "                        bulk_load(scales + s * BM * 4, as + kb * lds + m0, a_bytes,"
     " &full[s]);\n"),
]
# stsm_epi: C's tile written into shared memory by stmatrix (four 8x8 bf16 matrices a warp
# instruction, one 16-byte row each lane: 8 a thread a tile) instead of 32 4-byte stores, the
# seed's row order (fragment row g is the warp's row 2g) kept by the rows' addresses. Short K is
# bound by the consumers' own instructions (notes/fp8_gemm_h200.md); the write takes 63 SASS
# instructions a thread a tile against the seed's 76. Measured level with the seed (one H100,
# harness 1.004x, 0.974-1.030; short K no faster): rejected.
STSM_EPI = [
    ("__device__ __forceinline__ void ldsm_t(uint32_t addr, uint32_t (&r)[4]) {",
     "__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,\n"
     "                                        uint32_t d) {\n"
     "    asm volatile(\"stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\"\n"
     "                 :: \"r\"(addr), \"r\"(a), \"r\"(b), \"r\"(c), \"r\"(d) : \"memory\");\n"
     "}\n"
     "__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {\n"
     "    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);\n"
     "    return *reinterpret_cast<const uint32_t*>(&v);\n"
     "}\n"
     "__device__ __forceinline__ void ldsm_t(uint32_t addr, uint32_t (&r)[4]) {"),
    ("""#pragma unroll
            for (int j = 0; j < NR / 4; ++j) {
                const int col = j * 8 + (lane % 4) * 2;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = row + h - m0 - half * 64;  // 0..63
                    *reinterpret_cast<__nv_bfloat162*>(
                        mine + (col / 64) * 8192 + r * 128 +
                        ((((col % 64) / 8) ^ (r & 7)) << 4) + (col % 8) * 2) =
                        __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
                }
            }
""", """#pragma unroll
            for (int j = 0; j < NR / 4; j += 2) {  // matrices (j, h 0), (j, h 1), (j + 1, h 0 / 1)
                const int q = lane / 8, col = (j + q / 2) * 8;
                const int r = warp * 16 + 2 * (lane % 8) + q % 2;  // row lane % 8 of matrix q
                stsm_x4(smem_u32(mine + (col / 64) * 8192 + r * 128 +
                                 ((((col % 64) / 8) ^ (r & 7)) << 4)),
                        bf16x2(acc[4 * j], acc[4 * j + 1]), bf16x2(acc[4 * j + 2], acc[4 * j + 3]),
                        bf16x2(acc[4 * j + 4], acc[4 * j + 5]),
                        bf16x2(acc[4 * j + 6], acc[4 * j + 7]));
            }
"""),
]
# The K loop's place in the code (pad48, pad80, pad128, a_ahead_pad): a_ahead changes only the
# producer's code, yet lost 5-8% at long K in two calls, where the seed's own source under
# another build name (`control`) read level (one H100 each, 2026-12-07, notes/fp8_gemm_h200.md).
# Its consumers' K loop begins 48 bytes into a 128-byte line, the seed's at a line's start (the
# split fixup patch's, 5% slower, at 80). pad(n) puts n one-instruction `nanosleep 0` (16 bytes
# each in SASS, run once by thread 0 at the CTA's start) ahead of the loop in the code, which
# moves the loop and leaves its instructions as they were (python3 bench/cuda_sass.py --dump, on
# the CPU): pad48 and pad80 are the seed's loop, byte for byte, at those offsets; pad128 at the
# seed's offset one line on (a control for the pads themselves); a_ahead_pad is a_ahead's loop
# back at a line's start. Measured (one H100, 2026-12-07): the pads level with the seed (every
# interval holding 1), a_ahead_pad as slow as a_ahead: the offset is not a factor.
PAD_AFTER = '        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");\n'
PAD_LINE = '        asm volatile("nanosleep.u32 0;");\n'


def pad(n: int) -> list[tuple[str, str]]:
    """The patch that puts ``n`` PAD_LINEs after the barriers' init fence."""
    return [(PAD_AFTER, PAD_AFTER + PAD_LINE * n)]


DESC64 = [
    # the descriptor a 64-bit operand ("l"), its high word joined once a step, instead of a 32-bit
    # low word joined in the asm (mov.b64 desc, {lo, hi}) for each of the step's 8 wgmma
    (r'.reg .pred p;\\n.reg .b32 hi;\\n.reg .b64 desc;\\n"', r'.reg .pred p;\\n"'),
    (r'0;\\nmov.b32 hi, %{regs + 6};\\n"', r'0;\\n"'),
    ("        f'        \"mov.b64 desc, {{%{regs + 4}, hi}};\\\\n\"\\n'\n", ""),
    ("{{{a}}}, desc, p", "{{{a}}}, %{regs + 4}, p"),
    ('"r"(db), "r"(accumulate),\\n\'\n        \'          "n"(DESC_HI)\\n\'',
     '"l"(db), "r"(accumulate)\\n\''),
    ('"const uint32_t* a, uint32_t db, int accumulate)',
     '"const uint32_t* a, uint64_t db, int accumulate)'),
    ("void wgmma_step(float* d, const uint32_t* a, uint32_t db, int acc);",
     "void wgmma_step(float* d, const uint32_t* a, uint64_t db, int acc);"),
    ("            const uint32_t db = smem_desc_lo(smem + here * STAGE_BYTES + A_BYTES);",
     "            const uint64_t db = smem_desc_lo(smem + here * STAGE_BYTES + A_BYTES) |\n"
     "                                ((uint64_t)DESC_HI << 32);"),
]

VOTE_ONCE = [
    # the K loop's condition a vote made once a step (`more`, the vote before the next step's
    # fetch) instead of twice (the loop's head asked the same question again)
    ("        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {\n",
     "        bool more = all_(g.kb0 < g.kb1);\n        for (int kb = g.kb0; more; ++kb) {\n"),
    ("            if (all_(kb + 1 < g.kb1)) {\n",
     "            more = all_(kb + 1 < g.kb1);\n            if (more) {\n"),
]

OFFSETS_KEPT = [
    # A's ldmatrix offset and the scales' offset within a stage depend on the thread alone:
    # made once and pinned in registers, where nvcc rebuilt them from the lane every step
    ("    while (all_(walk.next(sched, g))) {\n        int m0, n0;\n",
     "    uint32_t a_off = lane * 128 + ((chunk ^ (lane & 7)) << 4);  // + 4096 a 32-k quarter\n"
     "    uint32_t s_off = (half * 64 + warp * 16 + 2 * (lane / 4)) * 4;  // row - m0, in bytes\n"
     "    asm volatile(\"\" : \"+r\"(a_off), \"+r\"(s_off));\n"
     "    while (all_(walk.next(sched, g))) {\n        int m0, n0;\n"),
    ("            const float* sc = reinterpret_cast<const float*>(scales + st_i * BM * 4);\n",
     "            const uint8_t* sc = scales + st_i * BM * 4 + s_off;\n"),
    ("            sa0 = row < m ? sc[row - m0] : 0.f;\n",
     "            sa0 = row < m ? *reinterpret_cast<const float*>(sc) : 0.f;\n"),
    ("            sa1 = row + 1 < m ? sc[row + 1 - m0] : 0.f;\n",
     "            sa1 = row + 1 < m ? *reinterpret_cast<const float*>(sc + 4) : 0.f;\n"),
    ("            ldsm_a(smem + st_i * STAGE_BYTES, chunk, lane, raw);\n",
     "            const uint32_t a = smem_u32(smem + st_i * STAGE_BYTES) + a_off;\n"
     "#pragma unroll\n"
     "            for (int q = 0; q < BK / 32; ++q) ldsm_t(a + q * 4096, raw[q]);\n"),
]

DB_OPAQUE = [
    # (after DESC64) the step's descriptor hidden from nvcc's known-bits analysis: it then forms
    # all 8 MMAs' descriptors by 64-bit adds, where it had used ORs and re-set the high word
    ("            const uint64_t db = smem_desc_lo(smem + here * STAGE_BYTES + A_BYTES) |\n",
     "            uint64_t db = smem_desc_lo(smem + here * STAGE_BYTES + A_BYTES) |\n"),
    ("                                ((uint64_t)DESC_HI << 32);\n",
     "                                ((uint64_t)DESC_HI << 32);\n"
     "            asm volatile(\"\" : \"+l\"(db));\n"),
]

EPI_OFFSETS = [
    # (after OFFSETS_KEPT) C's swizzled offsets in the TMA epilogue's box, per thread: 4 pinned
    # registers instead of ~36 instructions of address arithmetic a tile (SASS: from the wait
    # for the box's last store to the fence before the TMA store, 70 instructions against 106)
    ('    asm volatile("" : "+r"(a_off), "+r"(s_off));\n',
     '    asm volatile("" : "+r"(a_off), "+r"(s_off));\n'
     "    // C's byte offset in a consumer's 64-row box of 8-column block j of its row r0 (even):\n"
     "    // c_off[j / 2] + (j % 2) * 16; row r0 + 1's block j is row r0's block j ^ 1, 128 on\n"
     "    uint32_t c_off[4];\n"
     "    {\n"
     "        const int r0 = warp * 16 + 2 * (lane / 4);\n"
     "#pragma unroll\n"
     "        for (int i = 0; i < 4; ++i)\n"
     "            c_off[i] = r0 * 128 + ((2 * i ^ (r0 & 7)) << 4) + (lane % 4) * 4;\n"
     "    }\n"
     '    asm volatile("" : "+r"(c_off[0]), "+r"(c_off[1]), "+r"(c_off[2]), "+r"(c_off[3]));\n'),
    ("                const int col = j * 8 + (lane % 4) * 2;\n#pragma unroll\n"
     "                for (int h = 0; h < 2; ++h) {\n"
     "                    const int r = row + h - m0 - half * 64;  // 0..63\n",
     "#pragma unroll\n                for (int h = 0; h < 2; ++h) {\n"
     "                    const int b = (j % 8) ^ h;  // the block's place in row r0's swizzle\n"),
    ("                        mine + (col / 64) * 8192 + r * 128 +\n"
     "                        ((((col % 64) / 8) ^ (r & 7)) << 4) + (col % 8) * 2) =\n",
     "                        mine + (j / 8) * 8192 + h * 128 + c_off[b / 2] + (b % 2) * 16) =\n"),
]

SKEW = [
    # PINGPONG 2 (the k < 640 rule's): no turns; the second consumer starts its first tile once
    # the first has finished that tile's K loop, so one's epilogue runs under the other's MMAs.
    # The kernel gets it as `skew` beside pingpong 0, so the K loop's code is the seed's (turns
    # tested as `pingpong == 1` there cost 6 instructions a step, an arrival counted in the loop
    # 11-23). Only where a tile's steps fit the ring and every CTA has work: else the launcher
    # takes PINGPONG 1.
    ('    "PINGPONG": [0, 1],\n', '    "PINGPONG": [0, 1, 2],\n'),
    ("    {'when': {'k': [None, 1792]}, 'knobs': {'STREAM_K': 0}},\n",
     "    {'when': {'k': [None, 640]}, 'knobs': {'STREAM_K': 0, 'PINGPONG': 2}},\n"
     "    {'when': {'k': [None, 1792]}, 'knobs': {'STREAM_K': 0}},\n"),
    ("        int pingpong, int tma_c, long ldc, int pairs_ok) {\n",
     "        int pingpong, int tma_c, long ldc, int pairs_ok, int skew) {\n"),
    ("first turn is the first half's\n",
     "first turn is the first half's\n"
     "    // skew: the first half arrives once it is a tile ahead, the second waits for that (the\n"
     "    // launcher sets it only where every CTA has a tile or a segment)\n"
     "    bool lead = skew && half == 0;\n"
     "    if (skew && half == 1) named_sync(5, 256);\n"),
    ("        if ((g.kb0 > 0 || g.kb1 < sched.steps) &&\n",
     "        if (all_(lead)) named_arrive(5, 256), lead = false;  // the second half may start\n"
     "        if ((g.kb0 > 0 || g.kb1 < sched.steps) &&\n"),
    ("    const int pairs_ok = x.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(x.c) % 4 == 0;\n",
     "    const int pairs_ok = x.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(x.c) % 4 == 0;\n"
     "    // skew where a tile fits the ring and every CTA has work (else a consumer would wait\n"
     "    // forever: for a stage the other holds, or for an arrival that never comes)\n"
     "    const int skew = pingpong == 2 && s.steps <= stages &&\n"
     "                     grid <= max(s.dp_tiles, s.sk_ctas);\n"
     "    pingpong = pingpong == 1 || (pingpong == 2 && !skew);\n"),
    ("        reinterpret_cast<float4*>(x.ws), x.counts, s, stages, pingpong, tma_c, x.ldc,\n"
     "        pairs_ok));\n",
     "        reinterpret_cast<float4*>(x.ws), x.counts, s, stages, pingpong, tma_c, x.ldc,\n"
     "        pairs_ok, skew));\n"),
]

# fixup_in_place (a cut tile's sum folded into `acc`, no copy back) and fastdiv (tile origins by
# magic numbers) went into the seed as in_place_fastdiv (harness 1.032x, 1.003-1.068, one H100,
# 2026-12-07; notes/fp8_gemm_h200.md, "The fixup folded in place and tile origins without
# division").
VARIANTS = {
    # control: the seed's own source under another build name, timed as a variant is: what the
    # build and the rows' order move alone (one H100: level with the seed, 1.002x, 0.971-1.032,
    # and within 0.3% at long K, where a_ahead lost 5% in the same call).
    "control": [],
    # fence_once: a cut tile's partial made visible as CUTLASS's stream-K does it: the
    # warpgroup's barrier after its stores, then thread 0 alone fences before its count (a
    # release: the barrier puts the other threads' stores before it) and after it (an acquire,
    # before the barrier that lets the others read), instead of a fence in each of the 128
    # threads on both sides. The K loop stays the seed's (SASS: 194 a step, at +0; 193 on
    # 321d20a's seed).
    "fence_once": [
        FIXUP_UNFENCED,
        ("        last[half] = atomicAdd(count, 1) == hi - lo;\n",
         "        __threadfence();\n        last[half] = atomicAdd(count, 1) == hi - lo;\n"
         "        __threadfence();\n"),
        ("    if (!last[half]) return false;\n    __threadfence();\n",
         "    if (!last[half]) return false;\n"),
    ],
    "a_ahead": A_AHEAD,
    "stsm_epi": STSM_EPI,
    "pad48": pad(3),
    "pad80": pad(5),
    "pad128": pad(8),
    "a_ahead_pad": A_AHEAD + pad(5),
    "bitcvt": BITCVT,
    "nozero": NOZERO,
    "bitcvt_nozero": BITCVT + NOZERO,
    "setup_ahead": [
        ("    while (all_(walk.next(sched, g))) {\n        int m0, n0;\n"
         "        tile_origin<BN>(sched, g.tile, m0, n0);\n        // The fragment's",
         "    Seg ahead;\n    int am0 = 0, an0 = 0;\n    bool more = walk.next(sched, ahead);\n"
         "    if (more) tile_origin<BN>(sched, ahead.tile, am0, an0);\n"
         "    while (all_(more)) {\n        g = ahead;\n        const int m0 = am0, n0 = an0;\n"
         "        bool taken = false;\n        // The fragment's"),
        ("            wgmma_wait();\n            if (lane == 0) bar_arrive(&empty[here]);",
         "            if (!taken) {  // the next segment, while this step's MMAs run\n"
         "                taken = true;\n                more = walk.next(sched, ahead);\n"
         "                if (more) tile_origin<BN>(sched, ahead.tile, am0, an0);\n"
         "            }\n"
         "            wgmma_wait();\n            if (lane == 0) bar_arrive(&empty[here]);"),
        ("        if ((g.kb0 > 0 || g.kb1 < sched.steps) &&",
         "        if (!taken) {  // a segment without steps (none is cut so)\n"
         "            more = walk.next(sched, ahead);\n"
         "            if (more) tile_origin<BN>(sched, ahead.tile, am0, an0);\n        }\n"
         "        if ((g.kb0 > 0 || g.kb1 < sched.steps) &&"),
    ],
    # desc64: B's wgmma descriptor passed as one 64-bit operand (SASS, gemm_kernel<128, 1>: the
    # K loop 189 a step against the seed's 193, <64, 1> 161 against 168; 168 registers, no
    # spill). Timed inside `lean` (below), which was level: rejected.
    "desc64": DESC64,
    # vote_once, offsets_kept, db_opaque: the K loop's bookkeeping (SASS, gemm_kernel<128, 1>:
    # vote_once 189 a step, with desc64 185, with offsets_kept too 179, with db_opaque 176,
    # against the seed's 193); `lean`, those four and epi_offsets: 177 a step (<64, 1> 146
    # against 168), the epilogue's 106 down to 70, 168 registers, no spill: a k256 tile ~599
    # instructions against ~667. One H100 (2026-12-08, variants_device.sh control vote_once
    # lean): both checked, both level in the harness (lean 1.013x the seed, 0.988-1.041; 1.008x
    # control), and the k256 GEMM launches level (47.2 against control's 47.1 us at
    # m6144-n7168-k256): 10% fewer instructions a short-K tile bought nothing. Rejected.
    "vote_once": VOTE_ONCE,
    "lean": DESC64 + VOTE_ONCE + OFFSETS_KEPT + DB_OPAQUE + EPI_OFFSETS,
    # skew: the two consumers a tile apart at short K, so their epilogues no longer coincide
    # (with turns both finish a tile together, and the tensor pipe idles through both epilogues:
    # busy 45.5% of the GEMM at m6144-n7168-k256, ncu on one H100). Owed to the device.
    "skew": SKEW,
    "turns_lapse": [
        ("    if (pingpong && half == 1) named_arrive(3, 256);  // the first turn is the first "
         "half's\n", ""),
        ("            if (pingpong) named_sync(3 + half, 256);  // my turn\n",
         "            if (pingpong && kb > g.kb0) named_sync(3 + half, 256);  // my turn\n"),
        ("            if (pingpong) named_arrive(4 - half, 256);  // the other's turn\n",
         "            if (pingpong && (half == 0 ? kb > g.kb0 : kb + 1 < g.kb1))\n"
         "                named_arrive(4 - half, 256);  // the other's turn\n"),
        ("    if (pingpong && half == 0) named_sync(3, 256);  // the other's last turn\n", ""),
    ],
    "turns_runs": [
        ("        fetch(s);\n        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {\n"
         "            const int here = s;\n",
         "        fetch(s);\n        const int run = max(1, stages / 2);\n"
         "        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {\n"
         "            const int here = s;\n            const int in_run = (kb - g.kb0) % run;\n"),
        ("            if (pingpong) named_sync(3 + half, 256);  // my turn\n",
         "            if (pingpong && in_run == 0) named_sync(3 + half, 256);  // my turn\n"),
        ("            if (pingpong) named_arrive(4 - half, 256);  // the other's turn\n",
         "            if (pingpong && (in_run == run - 1 || kb + 1 == g.kb1))\n"
         "                named_arrive(4 - half, 256);  // the other's turn\n"),
    ],
}


def use_seed(path: Path) -> None:
    """Sweep ``path`` in the seed's place: its grid, probes and variants (--seed)."""
    global CUDA_SEED
    CUDA_SEED = path


def unknown_variants(names: list[str]) -> str:
    """Why ``names`` cannot be built as VARIANTS ('' when every one is a variant): what
    cuda_sass.py and variants_device.sh say before they build or set up anything."""
    unknown = [name for name in names if name not in VARIANTS]
    return (f"{unknown} not in bench/cuda_sweep.py's VARIANTS: {sorted(VARIANTS)}"
            if unknown else "")


def probe_file(name: str, folder: Path) -> Path:
    """The seed's source with PROBES[name] or VARIANTS[name] applied (each old text exactly
    once), under a build name of its own."""
    source = CUDA_SEED.read_text()
    patches = PROBES[name] if name in PROBES else VARIANTS[name]
    for old, new in [*patches, ('name="ks_cuda_wgmma', f'name="ks_{name}')]:
        if source.count(old) != 1:
            raise SystemExit(f"{name}: the seed holds {source.count(old)} copies of {old!r}, "
                             "not one; update PROBES / VARIANTS")
        source = source.replace(old, new)
    path = folder / f"cuda_wgmma_{name}.py"
    path.write_text(source)
    return path


def grid_points(grid: list[str], space: dict) -> list[dict]:
    """The product of KNOB=V1,V2 items' values (parsed as the space's values are); [] for no
    items. Also bench/cuda_profile.py's KNOB=VALUE parser (one point)."""
    axes = []
    for item in grid:
        knob, _, values = item.partition("=")
        if knob not in space:
            raise SystemExit(f"{item}: the seed has no knob {knob!r}; it has {list(space)}")
        by_text = {str(v): v for v in space[knob]}
        unknown = [v for v in values.split(",") if v not in by_text]
        if unknown:
            raise SystemExit(f"{item}: {unknown} not in {knob}'s space {space[knob]}")
        axes.append([(knob, by_text[v]) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else []


def one_point(pairs: list[str], space: dict) -> dict:
    """KNOB=VALUE pairs as one knob point ({} for none); bench/cuda_profile.py and
    bench/cuda_timeline.py take theirs so."""
    points = grid_points(pairs, space) or [{}]
    if len(points) > 1:
        raise SystemExit(f"{pairs}: one value a knob (KNOB=VALUE), got {len(points)} points")
    return points[0]


def benchmark_cases(labels: list[str]) -> dict[str, dict]:
    """The task's full-profile benchmark cases by shape label (m6144-n7168-k256) for
    ``labels``; SystemExit naming any label that is not one."""
    import tomllib

    spec = tomllib.loads((ROOT / "tasks" / "fp8_gemm" / "task.toml").read_text())
    cases = {f"m{c['m']}-n{c['n']}-k{c['k']}": c for c in spec["profiles"]["full"]["benchmarks"]}
    unknown = [label for label in labels if label not in cases]
    if unknown:
        raise SystemExit(f"{unknown}: not benchmark shapes; one of {sorted(cases)}")
    return {label: cases[label] for label in labels}


def set_knobs(module, committed: tuple[dict, list], knobs: dict | None) -> None:
    """The module's knobs as committed (None), or TUNABLES with ``knobs`` and no shape rules."""
    tunables, rules = committed
    module.TUNABLES, module.TUNABLES_BY_SHAPE = (
        (tunables, rules) if knobs is None else ({**tunables, **knobs}, []))


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
    from pytest_kscientist.api import compare

    for m, n, k, seed in cases:
        data = reference.generate_input(m, n, k, seed, device="cuda")
        data[4].fill_(float("nan"))
        out = module.custom_kernel(data)
        miss = compare(out, reference.ref_kernel(data), tolerance["atol"], tolerance["rtol"])
        if miss:
            return f"m{m}-n{n}-k{k}: {miss}"
    return ""


def kernel_name(key: str) -> str:
    """A profiler key's function name: 'void gemm_kernel<128, 1>(CUtensorMap_st, ...)' is
    gemm_kernel."""
    return re.sub(r"^void |[<(].*$", "", key).strip()


def launch_us(fn, data, calls: int = 10) -> dict[str, float]:
    """Each GPU kernel ``fn(data)`` launches, by its function's name, with its device time per
    call over ``calls`` calls (torch.profiler's CUPTI times), in the order they first ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(data)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(data)
        torch.cuda.synchronize()
    return {kernel_name(e.key): e.device_time_total / calls for e in prof.key_averages()
            if e.device_time_total > 0}


def kernel_us(module, labels, inputs) -> dict[str, dict[str, float]]:
    """Per shape, ``launch_us`` of the module's custom_kernel, to set beside the loop's event
    times: what they miss is launch gaps and host time."""
    return {label: launch_us(module.custom_kernel, data)
            for label, data in zip(labels, inputs, strict=True)}


def label_of(knobs: dict) -> str:
    return "cuda " + " ".join(f"{k}={v}" for k, v in knobs.items())


def main() -> None:
    import tomllib
    import torch
    from fused_sweep import gpumode_us, load

    from pytest_kscientist import api

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--grid", nargs="*", default=[], metavar="KNOB=V1,V2",
                        help="knob values whose product is timed (rules cleared)")
    parser.add_argument("--probes", action="store_true", help="time PROBES too")
    parser.add_argument("--variants", nargs="*", choices=sorted(VARIANTS), default=None,
                        help="check and time these VARIANTS too (all when none is named)")
    parser.add_argument("--extra", nargs="*", type=Path, default=[],
                        help="other kernel files to check and time beside (their defaults)")
    parser.add_argument("--kernels", action="store_true",
                        help="per shape, the GPU kernels' own durations (torch.profiler) of the "
                             "seed, each --extra file and each variant")
    parser.add_argument("--seed", type=Path, default=CUDA_SEED,
                        help="the kernel file swept in the seed's place (default: the seed)")
    args = parser.parse_args()
    if not args.seed.is_file():
        parser.error(f"--seed {args.seed}: no such file")
    use_seed(args.seed)
    t0 = time.monotonic()
    points_knobs = grid_points(args.grid, api.read_space(CUDA_SEED.read_text()))
    folder = Path(tempfile.mkdtemp(prefix="ks-cuda-"))
    paths = {"cuda_wgmma": CUDA_SEED}
    if args.probes:
        paths |= {p: probe_file(p, folder) for p in PROBES}
    variants = [] if args.variants is None else (args.variants or sorted(VARIANTS))
    paths |= {v: probe_file(v, folder) for v in variants}
    paths |= {f.stem: f.resolve() for f in args.extra}  # compiled with the seed
    with ProcessPoolExecutor(len(paths), mp_context=get_context("spawn")) as pool:
        errors = dict(zip(paths, pool.map(compile_one, map(str, paths.values())), strict=True))
    print(f"compiled {len(paths)} modules (+{time.monotonic() - t0:.0f}s)", flush=True)
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
    # (row name, module key, path, knobs: None = as committed, else TUNABLES with them, no rules)
    points = [("triton_fused", "triton_fused", TRITON_SEED, None)]
    points += [(f.stem, f.stem, f, None) for f in args.extra]
    points += [("cuda_wgmma", "cuda_wgmma", CUDA_SEED, None)]
    points += [(label_of(kn), "cuda_wgmma", CUDA_SEED, kn) for kn in points_knobs]
    points += [(v, v, paths[v], None) for v in variants]  # as committed
    points += [(p, p, paths[p], None) for p in PROBES if p in paths]  # as committed
    modules: dict[str, object] = {}
    committed: dict[str, tuple[dict, list]] = {}  # module key -> its TUNABLES and rules
    for name, key, path, knobs in points:
        row: dict = {"us": {}, "failed": errors.get(key, ""), "knobs": knobs}
        if not row["failed"]:
            try:
                if key not in modules:
                    modules[key] = load(Path(path).stem + "_" + key.replace(" ", "_"), path)
                    if hasattr(modules[key], "TUNABLES"):
                        committed[key] = (dict(modules[key].TUNABLES),
                                          list(getattr(modules[key], "TUNABLES_BY_SHAPE", [])))
                module = modules[key]
                if key in committed:
                    set_knobs(module, committed[key], knobs)
                if key not in PROBES:
                    row["failed"] = check(module, reference,
                                          tests + benches + [(*odd, 7) for odd in ODD],
                                          toml["check"])
                if not row["failed"]:
                    for label, data in zip(labels, inputs, strict=True):
                        row["us"][label] = gpumode_us(module.custom_kernel, data, args.reps,
                                                      flush)
                    row["geomean_us"] = api.geomean(list(row["us"].values()))
            except Exception:
                row["failed"] = traceback.format_exc()[-1500:]
        rows[name] = row
        args.out.write_text(json.dumps(rows, indent=1))
        print(f"{name}: {row.get('geomean_us') or row['failed']} (+{time.monotonic() - t0:.0f}s)",
              flush=True)
    if args.kernels:  # the seed, each --extra file and each variant, as committed
        rows["_kernels"] = {}
        for key in ["cuda_wgmma", *(f.stem for f in args.extra), *variants]:
            if key not in modules or rows[key]["failed"]:
                continue
            if key in committed:
                set_knobs(modules[key], committed[key], None)
            rows["_kernels"][key] = kernel_us(modules[key], labels, inputs)
            args.out.write_text(json.dumps(rows, indent=1))
            for label, times in rows["_kernels"][key].items():
                print(f"{key} {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    report(rows, labels)


def report(rows: dict, labels: list[str]) -> None:
    """The points by geomean, then the fastest checked CUDA point per shape and their geomean."""
    from pytest_kscientist import api

    ok = {n: r for n, r in rows.items() if not n.startswith("_") and not r["failed"]}
    print("\n| point | geomean_us | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for name, r in sorted(ok.items(), key=lambda item: item[1]["geomean_us"]):
        print(f"| {name} | {r['geomean_us']:.1f} | "
              + " | ".join(f"{r['us'][label]:.1f}" for label in labels) + " |")
    for name, r in rows.items():
        if not name.startswith("_") and r["failed"]:
            print(f"| {name} | failed: {r['failed'][-400:]!r} |")
    cuda = {n: r for n, r in ok.items() if n.startswith("cuda")}
    if cuda:
        best = {label: min(cuda, key=lambda n: cuda[n]["us"][label]) for label in labels}
        composed = api.geomean([cuda[best[label]]["us"][label] for label in labels])
        print(f"\nthe fastest CUDA point per shape (their geomean {composed:.1f}):")
        for label in labels:
            print(f"  {label}: {cuda[best[label]]['us'][label]:.1f} {best[label]}")


if __name__ == "__main__":
    main()
