"""CUDA seed for Hopper (sm_90a, issue 15): fp16 wgmma of e4m3 values, warp-specialised.

A first launch upcasts B to an fp16 K-major copy (exact: every e4m3 value is an fp16 value; K
padded with zeros to whole 128-wide scale blocks). The GEMM's CTA owns a 128 x BLOCK_N tile of
C: a producer warp loads each 128-wide K step, A's fp8 tile straight from the task's column-
major layout and B's fp16 tile, through TMA into a ring of STAGES shared-memory stages (128-byte
swizzle, mbarriers). Two consumer warpgroups, one per 64-row half, read their A rows with
transposed ldmatrix and convert them to fp16 in registers (a fragment's rows g and g + 8 are
the tile's rows 2g and 2g + 1), issue the step's 8 wgmma.m64nNk16 (A from registers) into a
fresh fp32 product, wait for it, give the stage back and add product * a_scale[row] *
b_scale[block] to their fp32 accumulators. No CTA-wide barrier runs between the two consumers,
so one scales while the other's MMAs run. C is rounded once to bf16. SPLIT_K > 1 writes fp32
partials that a third kernel sums (0: `split_for`'s model); PERSISTENT: one CTA an SM walks
the tiles. The compile-time knobs (COMPILED) cost one nvcc build (about a minute) each.
"""

from __future__ import annotations

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"

TUNABLES = {
    "BLOCK_N": 128,
    "STAGES": 3,
    "GROUP_M": 8,
    "SPLIT_K": 0,
    "PERSISTENT": 1,
}
TUNABLE_SPACE = {
    "BLOCK_N": [64, 128],
    "STAGES": [2, 3, 4, 5],
    "GROUP_M": [1, 4, 8, 16],
    "SPLIT_K": [0, 1, 2, 3, 4],
    "PERSISTENT": [0, 1],
}
COMPILED = ("BLOCK_N", "STAGES", "GROUP_M")  # -D flags; the others are read at each call

BLOCK_M, BLOCK_K = 128, 128
SMEM_LIMIT = 227 * 1024  # sm_90's opt-in shared memory per block
# A 128 x 128 x 128 step of an SM: first estimated at 1.09 us; measured since, 721-739 us of GEMM
# over 733 steps an SM at m6144-n4608-k7168 (~1.0 us; H200, bench/cuda_sweep.py --parts)
STEP_US = 1.09
# The partials' write and sum, effective: at 3 TB/s the model split m1024-n4608-k7168 and
# m6144-n512-k7168 in two, 28% and 24% slower than one slice (H200, bench/cuda_sweep.py).
PARTIAL_TBPS = 1.0
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count if (
    torch.cuda.is_available()) else 132


def stages_that_fit(block_n: int, stages: int) -> int:
    """STAGES lowered until the ring (A's fp8 and B's fp16 tiles) fits, with 1 KB to align."""
    stage_bytes = (BLOCK_M + 2 * block_n) * BLOCK_K
    return max(2, min(stages, (SMEM_LIMIT - 1024 - 16 * stages) // stage_bytes))


def split_for(m: int, n: int, k: int, block_n: int, sms: int = NUM_SMS) -> int:
    """Slices of K minimising modelled time: whole waves of CTAs times their steps (STEP_US
    for a 128 x 128 x 128 step), plus the fp32 partials' round trip at PARTIAL_TBPS and a 3 us
    launch."""
    tiles = -(-m // BLOCK_M) * -(-n // block_n)
    steps = -(-k // BLOCK_K)
    step_us = STEP_US * block_n / 128

    def cost(split: int) -> float:
        rounds = -(-tiles * split // sms) * -(-steps // split) * step_us
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
torch::Tensor upcast(torch::Tensor b);
torch::Tensor gemm(torch::Tensor a, torch::Tensor b16, torch::Tensor as, torch::Tensor bs,
                   torch::Tensor c, int64_t split, int64_t persistent);
torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t split, int64_t persistent);
"""

# The kernels (nvcc alone builds them: tests/test_cuda_seed.py), then the torch wrapper.
KERNEL_SRC = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#if !defined(BLOCK_N) || !defined(STAGES) || !defined(GROUP_M)
#error "the COMPILED knobs come as -D flags"
#endif

constexpr int BM = 128, BK = 128, HK = 64;        // HK: K of one 128-byte swizzled row
constexpr int A_BYTES = BM * BK;                  // A's fp8 tile: 128 k rows of 128 m bytes
constexpr int B_HALF = BLOCK_N * HK * 2;          // one 64-wide K half of B's fp16 tile
constexpr int STAGE_BYTES = A_BYTES + 2 * B_HALF;
constexpr int NR = BLOCK_N / 2;                   // fp32 fragment registers per thread
constexpr int THREADS = 384;                      // producer + two consumer warpgroups
static_assert(BLOCK_N == 64 || BLOCK_N == 128, "BLOCK_N is 64 or 128 (one b_scale block)");

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
// Four 8x8 b16 matrices of A's M-major fp8 tile, transposed: lane i gets bytes (k, m), (k, m+1),
// (k+1, m), (k+1, m+1) of matrix i / 8's rows k = 2 * (i % 4), columns m = 2 * (i / 4) (rows 8q..).
__device__ __forceinline__ void ldsm_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// Bytes (k, m), (k+1, m) of such a register as an f16x2 (sel 0x20) or of m + 1 (sel 0x31).
__device__ __forceinline__ uint32_t f16x2_of(uint32_t r, uint32_t sel) {
    const uint32_t pair = __byte_perm(r, 0, sel);
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFF), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
@WGMMA@

// fp8 [k, mn] (the task's column-major B) -> fp16 [mn, kp], zero past k. A 64 x 64 tile
// through shared memory: 16-byte loads along mn when mn is contiguous and aligned (VEC),
// 32-byte stores along k.
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
    __shared__ __align__(16) __half tile[64][72];  // [k][mn]
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
    const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BLOCK_N - 1) / BLOCK_N;
    const int tile = w % (tiles_m * tiles_n), in_group = GROUP_M * tiles_n;
    const int first_m = (tile / in_group) * GROUP_M;
    const int group_m = min(tiles_m - first_m, GROUP_M);
    Work r;
    r.m0 = (first_m + (tile % in_group) % group_m) * BM;
    r.n0 = ((tile % in_group) / group_m) * BLOCK_N;
    r.split = w / (tiles_m * tiles_n);
    r.kb0 = r.split * per_split;
    r.kb1 = min(steps, r.kb0 + per_split);
    return r;
}

// The warp's A fragments for one stage, 8 k16 slices: 32 k rows a load (row k's 16-byte
// chunks swizzled by k % 8), converted to f16x2.
__device__ __forceinline__ void load_a(const uint8_t* st, int chunk, int lane,
                                       uint32_t (&frag)[BK / 16][4]) {
#pragma unroll
    for (int q = 0; q < BK / 32; ++q) {
        const int k = q * 32 + lane;
        uint32_t r[4];
        ldsm_t(smem_u32(st) + k * 128 + ((chunk ^ (k & 7)) << 4), r);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            frag[2 * q + j][0] = f16x2_of(r[2 * j], 0x20);
            frag[2 * q + j][1] = f16x2_of(r[2 * j], 0x31);
            frag[2 * q + j][2] = f16x2_of(r[2 * j + 1], 0x20);
            frag[2 * q + j][3] = f16x2_of(r[2 * j + 1], 0x31);
        }
    }
}

// Each CTA walks work items w = blockIdx.x, + gridDim.x, ... (one item each unless PERSISTENT:
// one CTA an SM); the producer's and the consumers' stage counter `it` runs on across items,
// so the ring does not drain between tiles and the next tile's loads overlap the epilogue.
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(
        const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
        const float* __restrict__ as, const float* __restrict__ bs, __nv_bfloat16* __restrict__ c,
        float* __restrict__ partial, int m, int n, int steps, int per_split, int work, long as0,
        long as1, long bs0, long bs1, long ldc, int pairs_ok) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE_BYTES);
    uint64_t* empty = full + STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(&full[s], 1);
            bar_init(&empty[s], 8);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int w = blockIdx.x; w < work; w += gridDim.x) {
                const Work wk = work_item(w, m, n, steps, per_split);
                for (int kb = wk.kb0; kb < wk.kb1; ++kb, ++it) {
                    const int s = it % STAGES;
                    bar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                    uint8_t* st = smem + s * STAGE_BYTES;
                    bar_expect(&full[s], STAGE_BYTES);
                    tma_load(st, &map_a, &full[s], wk.m0, kb * BK);
                    for (int h = 0; h < 2; ++h)
                        tma_load(st + A_BYTES + h * B_HALF, &map_b, &full[s], kb * BK + h * HK,
                                 wk.n0);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int half = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int chunk = half * 4 + warp;  // the warp's 16 m bytes in each 128-byte k row
    float acc[NR], part[NR];
    uint32_t frag[BK / 16][4];
#pragma unroll
    for (int i = 0; i < NR; ++i) part[i] = 0.f;
    int it = 0;
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
        const Work wk = work_item(w, m, n, steps, per_split);
        // The fragment's rows g and g + 8 (g = lane / 4) are the tile's rows 2g and 2g + 1 of
        // the warp's 16 (the transposed ldmatrix pairs neighbouring m); scales and C follow.
        const int row = wk.m0 + half * 64 + warp * 16 + 2 * (lane / 4);  // and row + 1
        const int nblk = wk.n0 / 128;
#pragma unroll
        for (int i = 0; i < NR; ++i) acc[i] = 0.f;
        for (int kb = wk.kb0; kb < wk.kb1; ++kb, ++it) {
            const int s = it % STAGES;
            const float sb = bs[nblk * bs0 + kb * bs1];
            const float sa0 = row < m ? as[row * as0 + kb * as1] : 0.f;
            const float sa1 = row + 1 < m ? as[(row + 1) * as0 + kb * as1] : 0.f;
            const uint8_t* st = smem + s * STAGE_BYTES;
            bar_wait(&full[s], (it / STAGES) & 1);
            load_a(st, chunk, lane, frag);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const int h = kk / 4, off = (kk % 4) * 32;
                wgmma_step(part, frag[kk], smem_desc(st + A_BYTES + h * B_HALF + off), kk > 0);
            }
            wgmma_commit();
            wgmma_wait();
            if (lane == 0) bar_arrive(&empty[s]);
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

static CUtensorMap tensor_map(CUtensorMapDataType type, void* base, int inner, int outer,
                              long row_bytes, int box_inner, int box_outer) {
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
    cuuint32_t box[2] = {(cuuint32_t)box_inner, (cuuint32_t)box_outer}, unit[2] = {1, 1};
    CUresult r = encode(&map, type, 2, base, dims, strides,
                        box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TORCH_CHECK(r == CUDA_SUCCESS, "cuda_wgmma: cuTensorMapEncodeTiled failed with ", (int)r,
                " for a [", outer, ", ", inner, "] operand");
    return map;
}

torch::Tensor upcast(torch::Tensor b) {
    TORCH_CHECK(b.scalar_type() == at::kFloat8_e4m3fn, "cuda_wgmma: b must be float8_e4m3fn, got ",
                b.dtype());
    const int n = b.size(0), k = b.size(1), kp = (k + BK - 1) / BK * BK;
    auto b16 = torch::empty({n, kp}, b.options().dtype(at::kHalf));
    if (n == 0 || k == 0) return b16;
    const bool vec = b.stride(0) == 1 && b.stride(1) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0;
    auto kernel = vec ? upcast_kernel<true> : upcast_kernel<false>;
    kernel<<<dim3(kp / 64, (n + 63) / 64), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const uint8_t*>(b.data_ptr()), reinterpret_cast<__half*>(b16.data_ptr()),
        n, k, kp, b.stride(0), b.stride(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return b16;
}

torch::Tensor gemm(torch::Tensor a, torch::Tensor b16, torch::Tensor as, torch::Tensor bs,
                   torch::Tensor c, int64_t split, int64_t persistent) {
    TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn, "cuda_wgmma: a must be float8_e4m3fn, got ",
                a.dtype());
    TORCH_CHECK(as.scalar_type() == at::kFloat && bs.scalar_type() == at::kFloat,
                "cuda_wgmma: a_scale and b_scale must be float32");
    TORCH_CHECK(c.scalar_type() == at::kBFloat16 && c.stride(1) == 1,
                "cuda_wgmma: c must be row-major bf16, got ", c.dtype(), " strides ", c.strides());
    const int m = a.size(0), k = a.size(1), kp = b16.size(1), n = b16.size(0), steps = kp / BK;
    if (m == 0 || n == 0) return c;
    if (k == 0) return c.zero_();
    // TMA reads A in the task's layout ([k][m], m contiguous) when its rows are 16-byte
    // aligned; otherwise from an m-padded copy.
    torch::Tensor at_ = a.t();
    if (a.stride(0) != 1 || a.stride(1) % 16 != 0 ||
            reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 != 0) {
        at_ = torch::zeros({k, (m + 15) / 16 * 16}, a.options());
        at_.narrow(1, 0, m).copy_(a.t());
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const CUtensorMap map_a = tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, at_.data_ptr(), m, k,
                                         at_.stride(0), BM, BK);
    const CUtensorMap map_b = tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, b16.data_ptr(), kp, n,
                                         (long)kp * 2, HK, BLOCK_N);
    split = std::max<int64_t>(1, std::min<int64_t>(split, steps));
    const int per_split = (steps + split - 1) / split;
    split = (steps + per_split - 1) / per_split;
    torch::Tensor partial;
    if (split > 1) partial = torch::empty({split, m, n}, c.options().dtype(at::kFloat));
    const int smem = STAGES * STAGE_BYTES + 16 * STAGES + 1024;
    cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const int work = ((m + BM - 1) / BM) * ((n + BLOCK_N - 1) / BLOCK_N) * split;
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    gemm_kernel<<<persistent ? std::min(work, sms) : work, THREADS, smem, stream>>>(
        map_a, map_b, as.data_ptr<float>(), bs.data_ptr<float>(),
        reinterpret_cast<__nv_bfloat16*>(c.data_ptr()),
        split > 1 ? partial.data_ptr<float>() : nullptr, m, n, steps, per_split, work,
        as.stride(0),
        as.stride(1), bs.stride(0), bs.stride(1), c.stride(0),
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

torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t split, int64_t persistent) {
    TORCH_CHECK(a.size(1) == b.size(1), "cuda_wgmma: a and b must share k, got ", a.sizes(),
                " and ", b.sizes());
    return gemm(a, upcast(b), as, bs, c, split, persistent);
}
"""

BUILT = {**TUNABLES, "STAGES": stages_that_fit(TUNABLES["BLOCK_N"], TUNABLES["STAGES"])}
module = load_inline(
    name="ks_cuda_wgmma_" + "_".join(str(BUILT[name]) for name in COMPILED),
    cpp_sources=[CPP_WRAPPER],
    cuda_sources=[KERNEL_SRC.replace("@WGMMA@", _wgmma(BUILT["BLOCK_N"])) + HOST_SRC],
    functions=["upcast", "gemm", "fp8_gemm"],  # upcast and gemm: timed apart by the bench
    extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O3",
                       *(f"-D{name}={BUILT[name]}" for name in COMPILED)],
)


def custom_kernel(data):
    """C = (A * a_scale) @ (B * b_scale)^T in bf16, written into ``c`` and returned."""
    a, b, a_scale, b_scale, c = data
    (m, k), n = a.shape, b.shape[0]
    split = TUNABLES["SPLIT_K"] or split_for(m, n, k, TUNABLES["BLOCK_N"])
    return module.fp8_gemm(a, b, a_scale, b_scale, c, split, TUNABLES["PERSISTENT"])
