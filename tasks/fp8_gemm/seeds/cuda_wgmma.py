"""CUDA seed for Hopper (sm_90a, issue 15): fp16 wgmma of e4m3 values, warp-specialised.

One launch upcasts A and B to fp16 K-major copies (exact: every e4m3 value is an fp16 value;
K padded with zeros to whole 128-wide scale blocks). The GEMM's CTA owns a 128 x BLOCK_N tile
of C: a producer warpgroup loads 128-wide K steps of both copies through TMA into a ring of
STAGES shared-memory stages (128-byte swizzle, mbarriers); two consumer warpgroups, one per
64-row half, each issue a step's 8 wgmma.m64nNk16 into a fresh fp32 product, wait for it, give
the stage back and add product * a_scale[row] * b_scale[block] to their fp32 accumulators. No
CTA-wide barrier runs between the two consumers, so one scales while the other's MMAs run.
C is rounded once to bf16. SPLIT_K > 1 writes fp32 partials that a third kernel sums
(0: the split from `split_for`, a count of waves and steps).
"""

from __future__ import annotations

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"

TUNABLES = {
    "LOAD_STAGES": 3,
    "CONV_STAGES": 3,
    "GROUP_M": 8,
    "B_PATH": "upcast",
    "SPLIT_K": 0,
    "PERSISTENT": 1,
}
TUNABLE_SPACE = {
    "LOAD_STAGES": [2, 3, 4, 5],
    "CONV_STAGES": [2, 3],
    "GROUP_M": [1, 4, 8, 16],
    "B_PATH": ["upcast", "convert"],
    "SPLIT_K": [0, 1, 2, 3, 4],
    "PERSISTENT": [0, 1],
}
COMPILED = ("LOAD_STAGES", "CONV_STAGES", "GROUP_M", "B_PATH")  # -D flags; others: per call

# The first rule whose bounds hold for the shape sets its knobs (evolve/compose.py).
SHAPE_KEYS = ["m", "n", "k"]
TUNABLES_BY_SHAPE = [  # the knobs that differ from TUNABLES
    # m < 3072: B's upcast pass costs more than converting it in the kernel (H200)
    {'when': {'m': [None, 3072]},
     'knobs': {'LOAD_STAGES': 4, 'CONV_STAGES': 2, 'B_PATH': 'convert'}},
]


def tunables_for(**shape):
    """TUNABLES with the first rule that holds for ``shape``."""
    for rule in TUNABLES_BY_SHAPE:
        if all((lo is None or lo <= shape[key]) and (hi is None or shape[key] < hi)
               for key, (lo, hi) in rule["when"].items()):
            return {**TUNABLES, **rule["knobs"]}
    return TUNABLES

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 128
SMEM_LIMIT = 227 * 1024  # sm_90's opt-in shared memory per block
STEP_US = 1.09  # m6144-n4608-k7168: ~800 us over 733 steps an SM (H200)
# The partials' write and sum, effective: at 3 TB/s the model split m1024-n4608-k7168 and
# m6144-n512-k7168 in two, 28% and 24% slower than one slice (H200, bench/cuda_sweep.py).
PARTIAL_TBPS = 1.0
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count if (
    torch.cuda.is_available()) else 132


def rings_that_fit(load: int, conv: int) -> tuple[int, int]:
    """LOAD_STAGES, then CONV_STAGES, lowered (to 2 at least) until both rings fit: a load
    slot holds A's and B's fp8 tiles, a converted slot B's fp16 tile; 1 KB to align them."""
    def size(ld: int, cv: int) -> int:
        return (ld * (BLOCK_M + BLOCK_N) + cv * 2 * BLOCK_N) * BLOCK_K + 16 * (ld + cv) + 1024

    while load > 2 and size(load, conv) > SMEM_LIMIT:
        load -= 1
    while conv > 2 and size(load, conv) > SMEM_LIMIT:
        conv -= 1
    return load, conv


def split_for(m: int, n: int, k: int, sms: int = NUM_SMS) -> int:
    """Slices of K minimising modelled time: whole waves of CTAs times their steps (STEP_US
    for a 128 x 128 x 128 step), plus the fp32 partials' round trip at PARTIAL_TBPS and a 3 us
    launch."""
    tiles = -(-m // BLOCK_M) * -(-n // BLOCK_N)
    steps = -(-k // BLOCK_K)

    def cost(split: int) -> float:
        rounds = -(-tiles * split // sms) * -(-steps // split) * STEP_US
        return rounds + (8 * split * m * n / (PARTIAL_TBPS * 1e6) + 3 if split > 1 else 0)

    return min(range(1, min(8, steps) + 1), key=cost)


def _wgmma(block_n: int) -> str:
    """The m64nNk16 fp16 wgmma, A from registers, with its fp32 fragment as N/2 operands."""
    regs = block_n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    binds = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    return (
        "__device__ __forceinline__ void wgmma_step(float* d, const uint32_t* a, uint64_t db, "
        "int accumulate) {\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.f16.f16 {{{outs}}}, '
        f'{{{a}}}, %{regs + 4}, p, 1, 1, 0;\\n}}\\n"\n'
        f'        : {binds}\n'
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate)\n'
        '        : "memory");\n'
        "}\n"
    )


CPP_WRAPPER = """
torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t split, int64_t persistent);
"""

# The kernels (nvcc alone compiles them: tests/test_cuda_seed.py), then the torch wrapper.
KERNEL_SRC = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#if !defined(LOAD_STAGES) || !defined(CONV_STAGES) || !defined(GROUP_M) || !defined(B_PATH)
#error "the compiled TUNABLES come as -D flags (COMPILED)"
#endif

constexpr int BM = 128, BN = 128, BK = 128, HK = 64;  // HK: K of one 128-byte swizzled row
constexpr int A8 = 0, B8 = BM * BK, LOAD_BYTES = B8 + BN * BK;  // a load slot: fp8 A, B
constexpr int B_HALF = BN * HK * 2;  // one 64-wide K half of B's fp16 tile
constexpr int CONV_BYTES = 2 * B_HALF;  // a converted slot: B's fp16 tile
constexpr int NR = BN / 2;                                // fp32 fragment registers a thread
constexpr int THREADS = 512;  // warpgroups 0 (TMA: warp 0) and 3: B's converters; 1, 2: MMA
constexpr int CONVERTERS = 7;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar,
                                         int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)),
                    "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
}
// K-major operand, 128-byte rows swizzled in groups of 8 rows (1024 bytes apart).
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Four 8x8 b16 matrices of an MN-major fp8 tile (rows k of 128 bytes, 16-byte chunks swizzled
// by k % 8), transposed: lane i supplies row k = 32q + i of chunk `chunk` and gets, from matrix
// j, bytes (k, x), (k, x + 1), (k + 1, x), (k + 1, x + 1) with k = 32q + 8j + 2(i % 4) and
// x = 2(i / 4) the chunk's byte.
__device__ __forceinline__ void ldsm_t(const uint8_t* tile, int q, int chunk, int lane,
                                       uint32_t (&r)[4]) {
    const int k = q * 32 + lane;
    const uint32_t addr = smem_u32(tile) + k * 128 + ((chunk ^ (k & 7)) << 4);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// Bytes (k, x), (k + 1, x) of such a register as an f16x2 (sel 0x20), or of x + 1 (sel 0x31).
__device__ __forceinline__ uint32_t f16x2_of(uint32_t r, uint32_t sel) {
    const uint32_t pair = __byte_perm(r, 0, sel);
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFF), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
@WGMMA@

// B_PATH 0: fp8 [k, n] (the task's column-major B) -> fp16 [n, kp], zero past k, before the
// GEMM. A 64 x 64 tile through shared memory: 16-byte loads along n when n is contiguous and
// aligned (VEC), 32-byte stores along k.
__device__ __forceinline__ void put8(__half* dst, uint64_t bytes) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            (__nv_fp8x2_storage_t)((bytes >> (16 * i)) & 0xFFFF), __NV_E4M3);
        reinterpret_cast<__half2_raw*>(dst)[i] = h;
    }
}

template <bool VEC>
__global__ void __launch_bounds__(256) upcast_kernel(
        const uint8_t* __restrict__ src, __half* __restrict__ dst, int rows, int k, int kp,
        long s0, long s1) {
    const int r0 = blockIdx.y * 64, k0 = blockIdx.x * 64;
    __shared__ __align__(16) __half tile[64][72];  // [k][n]
    {
        const int kk = threadIdx.x / 4, c = (threadIdx.x % 4) * 16, kg = k0 + kk;
        uint64_t lo = 0, hi = 0;
        if (VEC && kg < k && r0 + c + 16 <= rows) {
            const uint4 x = *reinterpret_cast<const uint4*>(src + kg * s1 + r0 + c);
            lo = x.x | ((uint64_t)x.y << 32);
            hi = x.z | ((uint64_t)x.w << 32);
        } else if (kg < k) {
            for (int i = 0; i < 16; ++i) {
                const int r = r0 + c + i;
                const uint64_t v = r < rows ? src[r * s0 + kg * s1] : 0;
                if (i < 8) lo |= v << (8 * i); else hi |= v << (8 * (i - 8));
            }
        }
        put8(&tile[kk][c], lo);
        put8(&tile[kk][c + 8], hi);
    }
    __syncthreads();
    const int rr = threadIdx.x % 64, ks = (threadIdx.x / 64) * 16;
    if (r0 + rr < rows) {
        __align__(16) __half out[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) out[j] = tile[ks + j][rr];
        uint4* q = reinterpret_cast<uint4*>(dst + (long)(r0 + rr) * kp + k0 + ks);
        q[0] = reinterpret_cast<const uint4*>(out)[0];
        q[1] = reinterpret_cast<const uint4*>(out)[1];
    }
}

struct Work {
    int m0, n0, kb0, kb1, split;
};

// Work item w: tile w % tiles (grouped GROUP_M tiles along M), K slice w / tiles.
__device__ __forceinline__ Work work_item(int w, int m, int n, int steps, int per_split) {
    const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    const int tile = w % (tiles_m * tiles_n), in_group = GROUP_M * tiles_n;
    const int first_m = (tile / in_group) * GROUP_M;
    const int group_m = min(tiles_m - first_m, GROUP_M);
    Work r;
    r.m0 = (first_m + (tile % in_group) % group_m) * BM;
    r.n0 = ((tile % in_group) / group_m) * BN;
    r.split = w / (tiles_m * tiles_n);
    r.kb0 = r.split * per_split;
    r.kb1 = min(steps, r.kb0 + per_split);
    return r;
}

// The warp's A fragments for one stage (8 k16 slices, the warp's 16 m bytes `chunk`), f16x2.
// The fragment's rows g and g + 8 (g = lane / 4) are the tile's rows 2g and 2g + 1.
__device__ __forceinline__ void load_a(const uint8_t* tile, int chunk, int lane,
                                       uint32_t (&frag)[BK / 16][4]) {
#pragma unroll
    for (int q = 0; q < BK / 32; ++q) {
        uint32_t r[4];
        ldsm_t(tile, q, chunk, lane, r);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            frag[2 * q + j][0] = f16x2_of(r[2 * j], 0x20);
            frag[2 * q + j][1] = f16x2_of(r[2 * j], 0x31);
            frag[2 * q + j][2] = f16x2_of(r[2 * j + 1], 0x20);
            frag[2 * q + j][3] = f16x2_of(r[2 * j + 1], 0x31);
        }
    }
}

// B's fp8 tile ([k][n] rows, as TMA left it) -> fp16 K-major halves for the wgmma, 128-byte
// swizzled. Unit u: 32 k rows x 16 n, read with one transposed ldmatrix and written as eight
// 8 (n) x 8 (k) fp16 matrices with two stmatrix: matrix (j, x) holds n = 16 chunk + 2g + x
// (g its row) and k = 32q + 8j..+7. Converter warp `cw` of CONVERTERS takes every CONVERTERS-th.
__device__ __forceinline__ void convert_b(const uint8_t* b8, uint8_t* b16, int cw, int lane) {
    for (int u = cw; u < (BK / 32) * (BN / 16); u += CONVERTERS) {
        const int q = u % (BK / 32), chunk = u / (BK / 32);
        uint32_t r[4];
        ldsm_t(b8, q, chunk, lane, r);
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
            const int mi = lane / 8, j = 2 * s2 + mi / 2, x = mi % 2;
            const int n = chunk * 16 + 2 * (lane % 8) + x, k = q * 32 + 8 * j;
            const uint32_t addr = smem_u32(b16) + (k / HK) * B_HALF + n * 128 +
                                  ((((k % HK) / 8) ^ (n & 7)) << 4);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                         :: "r"(addr), "r"(f16x2_of(r[2 * s2], 0x20)),
                            "r"(f16x2_of(r[2 * s2], 0x31)), "r"(f16x2_of(r[2 * s2 + 1], 0x20)),
                            "r"(f16x2_of(r[2 * s2 + 1], 0x31)) : "memory");
        }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // seen by the wgmma
    __syncwarp();
}

// Each CTA walks work items w = blockIdx.x, + gridDim.x, ... (one item each unless PERSISTENT:
// one CTA an SM); every role's stage counter `it` runs on across items, so the ring does not
// drain between tiles and the next tile's loads overlap the epilogue.
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(
        const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
        const float* __restrict__ as, const float* __restrict__ bs, __nv_bfloat16* __restrict__ c,
        float* __restrict__ partial, int m, int n, int steps, int per_split, int work, long as0,
        long as1, long bs0, long bs1, long ldc, int pairs_ok) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint8_t* const cring = smem + LOAD_STAGES * LOAD_BYTES;
    uint64_t* full = reinterpret_cast<uint64_t*>(cring + CONV_STAGES * CONV_BYTES);
    uint64_t* lempty = full + LOAD_STAGES;
    uint64_t* conv = lempty + LOAD_STAGES;
    uint64_t* cempty = conv + CONV_STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < LOAD_STAGES; ++s) {
            bar_init(&full[s], 1);
            bar_init(&lempty[s], B_PATH ? CONVERTERS + 8 : 8);  // B's converters, MMA warps
        }
        for (int s = 0; s < CONV_STAGES; ++s) {
            bar_init(&conv[s], B_PATH ? CONVERTERS : 1);  // converters, or TMA of fp16 B
            bar_init(&cempty[s], 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // Step `it` (counted across work items by every role) uses load slot it % LOAD_STAGES and
    // converted slot it % CONV_STAGES; a slot's n-th use waits for phase n of its barrier.
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    if (wg == 0 || wg == 3) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (!B_PATH && !(wg == 0 && warp == 0)) return;  // nothing to convert
        int it = 0;
        for (int w = blockIdx.x; w < work; w += gridDim.x) {
            const Work wk = work_item(w, m, n, steps, per_split);
            for (int kb = wk.kb0; kb < wk.kb1; ++kb, ++it) {
                const int ls = it % LOAD_STAGES, cs = it % CONV_STAGES;
                uint8_t* ld = smem + ls * LOAD_BYTES;
                if (wg == 0 && warp == 0) {
                    if (lane == 0) {  // TMA: A's (and B's) fp8 tiles in the task's layout
                        bar_wait(&lempty[ls], ((it / LOAD_STAGES) & 1) ^ 1);
                        bar_expect(&full[ls], B_PATH ? LOAD_BYTES : B8);
                        tma_load(ld + A8, &map_a, &full[ls], wk.m0, kb * BK);
                        if (B_PATH) {
                            tma_load(ld + B8, &map_b, &full[ls], wk.n0, kb * BK);
                        } else {  // B's fp16 copy, straight into the converted ring
                            bar_wait(&cempty[cs], ((it / CONV_STAGES) & 1) ^ 1);
                            bar_expect(&conv[cs], CONV_BYTES);
                            for (int h = 0; h < 2; ++h)
                                tma_load(cring + cs * CONV_BYTES + h * B_HALF, &map_b, &conv[cs],
                                         kb * BK + h * HK, wk.n0);
                        }
                    }
                } else {
                    bar_wait(&full[ls], (it / LOAD_STAGES) & 1);
                    bar_wait(&cempty[cs], ((it / CONV_STAGES) & 1) ^ 1);
                    convert_b(ld + B8, cring + cs * CONV_BYTES, wg == 0 ? warp - 1 : 3 + warp,
                              lane);
                    if (lane == 0) {
                        bar_arrive(&conv[cs]);
                        bar_arrive(&lempty[ls]);
                    }
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;");
    const int half = wg - 1;
    const int chunk = half * 4 + warp;  // the warp's 16 m bytes in each 128-byte k row
    float acc[NR], part[NR];
    uint32_t frag[BK / 16][4];
#pragma unroll
    for (int i = 0; i < NR; ++i) part[i] = 0.f;
    int it = 0;
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
        const Work wk = work_item(w, m, n, steps, per_split);
        const int row = wk.m0 + half * 64 + warp * 16 + 2 * (lane / 4);  // and row + 1
        const int nblk = wk.n0 / 128;
#pragma unroll
        for (int i = 0; i < NR; ++i) acc[i] = 0.f;
        for (int kb = wk.kb0; kb < wk.kb1; ++kb, ++it) {
            const int ls = it % LOAD_STAGES, cs = it % CONV_STAGES;
            const float sb = bs[nblk * bs0 + kb * bs1];
            const float sa0 = row < m ? as[row * as0 + kb * as1] : 0.f;
            const float sa1 = row + 1 < m ? as[(row + 1) * as0 + kb * as1] : 0.f;
            bar_wait(&full[ls], (it / LOAD_STAGES) & 1);
            load_a(smem + ls * LOAD_BYTES + A8, chunk, lane, frag);
            bar_wait(&conv[cs], (it / CONV_STAGES) & 1);
            const uint8_t* b16 = cring + cs * CONV_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const int h = kk / 4, off = (kk % 4) * 32;
                wgmma_step(part, frag[kk], smem_desc(b16 + h * B_HALF + off), kk > 0);
            }
            wgmma_commit();
            // A's slot is free once the wgmmas have its fragments (not right after ldmatrix:
            // the H200 check failed 1813 elements at m6144-n4608-k7168 with that release)
            if (lane == 0) bar_arrive(&lempty[ls]);
            wgmma_wait();
            if (lane == 0) bar_arrive(&cempty[cs]);
            const float s0 = sa0 * sb, s1 = sa1 * sb;
#pragma unroll
            for (int j = 0; j < NR / 4; ++j) {
                acc[4 * j] += part[4 * j] * s0;
                acc[4 * j + 1] += part[4 * j + 1] * s0;
                acc[4 * j + 2] += part[4 * j + 2] * s1;
                acc[4 * j + 3] += part[4 * j + 3] * s1;
            }
        }

#pragma unroll
        for (int j = 0; j < NR / 4; ++j) {
            const int col = wk.n0 + j * 8 + (lane % 4) * 2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row + h;
                if (r >= m || col >= n) continue;
                const float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
                if (partial != nullptr) {
                    float* p = partial + ((long)wk.split * m + r) * n + col;
                    p[0] = x;
                    if (col + 1 < n) p[1] = y;
                } else if (pairs_ok && col + 1 < n) {
                    *reinterpret_cast<__nv_bfloat162*>(c + r * ldc + col) =
                        __floats2bfloat162_rn(x, y);
                } else {
                    c[r * ldc + col] = __float2bfloat16_rn(x);
                    if (col + 1 < n) c[r * ldc + col + 1] = __float2bfloat16_rn(y);
                }
            }
        }
    }
}

__global__ void sum_splits(const float* __restrict__ partial, __nv_bfloat16* __restrict__ c,
                           int m, int n, int split, long ldc) {
    const long numel = (long)m * n;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < numel;
         i += (long)gridDim.x * blockDim.x) {
        float sum = 0.f;
        for (int s = 0; s < split; ++s) sum += partial[s * numel + i];
        c[(i / n) * ldc + i % n] = __float2bfloat16_rn(sum);
    }
}

"""

HOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

// A 2-D tensor map with 128 x 128-byte boxes ({128, 128} fp8, {64, 128} fp16), 128-byte swizzle.
static CUtensorMap tensor_map(bool fp16, void* base, int inner, int outer, long row_bytes) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        cudaDriverEntryPointQueryResult found;
        void* fn = nullptr;
        TORCH_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &found) == cudaSuccess
                        && found == cudaDriverEntryPointSuccess,
                    "cuda_wgmma: the driver has no cuTensorMapEncodeTiled (CUDA 12+ needed)");
        encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {fp16 ? 64u : 128u, 128}, unit[2] = {1, 1};
    const auto type = fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    CUresult r = encode(&map, type, 2, base, dims, strides, box, unit,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TORCH_CHECK(r == CUDA_SUCCESS, "cuda_wgmma: cuTensorMapEncodeTiled failed with ", (int)r,
                " for a [", outer, ", ", inner, "] operand");
    return map;
}

// The task's [rows, k] column-major operand as TMA reads it: its [k][rows] storage when rows
// are 16-byte aligned, else an aligned zero-padded copy.
static torch::Tensor tma_source(const torch::Tensor& x) {
    if (x.stride(0) == 1 && x.stride(1) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0)
        return x.t();
    auto copy = torch::zeros({x.size(1), (x.size(0) + 15) / 16 * 16}, x.options());
    copy.narrow(1, 0, x.size(0)).copy_(x.t());
    return copy;
}

torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t split, int64_t persistent) {
    TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
                "cuda_wgmma: a and b must be float8_e4m3fn, got ", a.dtype(), " and ", b.dtype());
    TORCH_CHECK(a.size(1) == b.size(1), "cuda_wgmma: a and b must share k, got ", a.sizes(),
                " and ", b.sizes());
    TORCH_CHECK(as.scalar_type() == at::kFloat && bs.scalar_type() == at::kFloat,
                "cuda_wgmma: a_scale and b_scale must be float32");
    TORCH_CHECK(c.scalar_type() == at::kBFloat16 && c.stride(1) == 1,
                "cuda_wgmma: c must be row-major bf16, got ", c.dtype(), " strides ", c.strides());
    const int m = a.size(0), k = a.size(1), n = b.size(0), steps = (k + BK - 1) / BK;
    if (m == 0 || n == 0) return c;
    if (k == 0) return c.zero_();
    const torch::Tensor at_ = tma_source(a);
    const CUtensorMap map_a = tensor_map(false, at_.data_ptr(), m, k, at_.stride(0));
    torch::Tensor bt;  // B_PATH 1: the fp8 operand as TMA reads it; 0: its fp16 K-major copy
    CUtensorMap map_b;
    if (B_PATH) {
        bt = tma_source(b);
        map_b = tensor_map(false, bt.data_ptr(), n, k, bt.stride(0));
    } else {
        const int kp = steps * BK;
        bt = torch::empty({n, kp}, b.options().dtype(at::kHalf));
        const bool vec = b.stride(0) == 1 && b.stride(1) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0;
        auto upcast = vec ? upcast_kernel<true> : upcast_kernel<false>;
        upcast<<<dim3(kp / 64, (n + 63) / 64), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
            reinterpret_cast<const uint8_t*>(b.data_ptr()),
            reinterpret_cast<__half*>(bt.data_ptr()), n, k, kp, b.stride(0), b.stride(1));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        map_b = tensor_map(true, bt.data_ptr(), kp, n, (long)kp * 2);
    }
    split = std::max<int64_t>(1, std::min<int64_t>(split, steps));
    const int per_split = (steps + split - 1) / split;
    split = (steps + per_split - 1) / per_split;
    torch::Tensor partial;
    if (split > 1) partial = torch::empty({split, m, n}, c.options().dtype(at::kFloat));
    const int smem = LOAD_STAGES * LOAD_BYTES + CONV_STAGES * CONV_BYTES +
                     16 * (LOAD_STAGES + CONV_STAGES) + 1024;
    cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const int work = ((m + BM - 1) / BM) * ((n + BN - 1) / BN) * split;
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    gemm_kernel<<<persistent ? std::min(work, sms) : work, THREADS, smem, stream>>>(
        map_a, map_b, as.data_ptr<float>(), bs.data_ptr<float>(),
        reinterpret_cast<__nv_bfloat16*>(c.data_ptr()),
        split > 1 ? partial.data_ptr<float>() : nullptr, m, n, steps, per_split, work,
        as.stride(0), as.stride(1), bs.stride(0), bs.stride(1), c.stride(0),
        (c.stride(0) % 2 == 0 && (reinterpret_cast<uintptr_t>(c.data_ptr()) % 4) == 0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (split > 1) {
        sum_splits<<<264, 256, 0, stream>>>(partial.data_ptr<float>(),
                                            reinterpret_cast<__nv_bfloat16*>(c.data_ptr()), m, n,
                                            (int)split, c.stride(0));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return c;
}
"""


def _key(cfg: dict) -> tuple:
    return tuple(cfg[name] for name in COMPILED)


def _build(cfg: dict):
    """load_inline of one compile-time configuration (about a minute with nvcc)."""
    load, conv = rings_that_fit(cfg["LOAD_STAGES"], cfg["CONV_STAGES"])
    fitted = {**cfg, "LOAD_STAGES": load, "CONV_STAGES": conv,
              "B_PATH": int(cfg["B_PATH"] == "convert")}
    flags = [f"-D{name}={fitted[name]}" for name in COMPILED]
    return load_inline(
        name="ks_cuda_wgmma_" + "_".join(str(fitted[name]) for name in COMPILED),
        cpp_sources=[CPP_WRAPPER],
        cuda_sources=[KERNEL_SRC.replace("@WGMMA@", _wgmma(BLOCK_N)) + HOST_SRC],
        functions=["fp8_gemm"],
        extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O3", *flags],
    )


# One build per compile-time configuration that TUNABLES or a rule asks for, at import.
MODULES = {_key(cfg): _build(cfg) for cfg in
           [TUNABLES, *({**TUNABLES, **rule["knobs"]} for rule in TUNABLES_BY_SHAPE)]}


def custom_kernel(data):
    """C = (A * a_scale) @ (B * b_scale)^T in bf16, written into ``c`` and returned."""
    a, b, a_scale, b_scale, c = data
    (m, k), n = a.shape, b.shape[0]
    cfg = tunables_for(m=m, n=n, k=k)
    split = cfg["SPLIT_K"] or split_for(m, n, k)
    return MODULES[_key(cfg)].fp8_gemm(a, b, a_scale, b_scale, c, split, cfg["PERSISTENT"])
