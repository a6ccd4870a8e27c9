"""CUDA seed for Hopper (sm_90a, issue 15): fp16 wgmma of e4m3 values, warp-specialised, stream-K.

A first launch upcasts B to an fp16 K-major copy (exact for every e4m3 value; K zero-padded to
whole scale blocks) and writes B's scales into 16-byte slots. The GEMM's CTA computes 128 x
BLOCK_N tiles of C: a producer warp loads each 128-wide K step by TMA into a ring of stages (A's
fp8 tile from the task's column-major layout, B's fp16 tile, the step's scales); two consumer
warpgroups, a 64-row half each, convert their A rows to fp16 in registers (transposed
ldmatrix), issue 8 wgmma.m64nNk16 into a fresh fp32 product, read the next step's A bytes (its
ldmatrix) while they run, wait, give the stage back and add product * a_scale * b_scale to their
accumulators. PINGPONG: the consumers take turns at
issuing (named barriers 3 and 4), one converting and scaling while the other's MMAs run. C is
rounded once to bf16; TMA_STORE writes it through shared memory by TMA stores not waited for
(else from registers), C_BUFFERS 2 through two buffers a consumer taken in turn (a write waits
only for the store before last; a stage fewer fits). OVERLAP: the GEMM is the upcast's
programmatic dependent (its CTAs start as the upcast drains and load once it has finished).

Every knob is read at each call, so shape rules cost no build. PERSISTENT: one CTA an SM over
the tiles (else one a tile). STREAM_K cuts the K steps of the last, partial wave's tiles
evenly among sk_ctas_for's CTAs (2: and one full wave more; 0: whole tiles only); a CTA
holding part of a tile writes its fp32 partial to a slot of its own and counts itself in, and
the last to count adds the others' and writes C: no CTA waits for another.
"""

from __future__ import annotations

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"

TUNABLES = {  # the H200 sweeps' best (notes/fp8_gemm_h200.md)
    "BLOCK_N": 128,
    "STAGE_DROP": 0,
    "GROUP_M": 8,
    "STREAM_K": 1,
    "PERSISTENT": 1,
    "PINGPONG": 1,
    "TMA_STORE": 1,
    "OVERLAP": 1,
    "C_BUFFERS": 1,
}
TUNABLE_SPACE = {
    "BLOCK_N": [64, 128],
    "STAGE_DROP": [0, 1, 2],
    "GROUP_M": [1, 4, 8, 16],
    "STREAM_K": [0, 1, 2],
    "PERSISTENT": [0, 1],
    "PINGPONG": [0, 1],
    "TMA_STORE": [0, 1],
    "OVERLAP": [0, 1],
    "C_BUFFERS": [1, 2],
}

# The first rule whose bounds hold for the shape sets its knobs (evolve/compose.py).
SHAPE_KEYS = ["m", "n", "k"]
TUNABLES_BY_SHAPE = [  # the knobs that differ from TUNABLES
    # k < 1792: whole tiles (the H200 sweep: the fixups cost more than a short K saves)
    {'when': {'k': [None, 1792]}, 'knobs': {'STREAM_K': 0}},
    # any other shape: TUNABLES
]


def tunables_for(**shape):
    """TUNABLES with the first rule that holds for ``shape``."""
    for rule in TUNABLES_BY_SHAPE:
        if all((lo is None or lo <= shape[key]) and (hi is None or shape[key] < hi)
               for key, (lo, hi) in rule["when"].items()):
            return {**TUNABLES, **rule["knobs"]}
    return TUNABLES


BLOCK_M, BLOCK_K = 128, 128
SMEM_LIMIT = 227 * 1024  # sm_90's opt-in shared memory a block


def stages_for(block_n: int, drop: int, c_buffers: int = 1) -> int:
    """As many stages as fit beside C's tiles, less STAGE_DROP (at least 1): relative to what
    fits, each value is another kernel, so no move of it is a no-op."""
    stage_bytes = (BLOCK_M + 2 * block_n) * BLOCK_K + BLOCK_M * 4 + 16 + 16
    room = SMEM_LIMIT - 16 - BLOCK_M * block_n * 2 * c_buffers
    return max(1, room // stage_bytes - drop)


def _wgmma(block_n: int) -> str:
    """The m64nNk16 fp16 wgmma, A from registers, with its fp32 fragment as N/2 operands and
    B's descriptor as its low word (smem_desc_lo)."""
    regs = block_n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    binds = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    return (
        f"template <> __device__ __forceinline__ void wgmma_step<{block_n}>(float* d, "
        "const uint32_t* a, uint32_t db, int accumulate) {\n"
        f'    asm volatile("{{\\n.reg .pred p;\\n.reg .b32 hi;\\n.reg .b64 desc;\\n"\n'
        f'        "setp.ne.b32 p, %{regs + 5}, 0;\\nmov.b32 hi, %{regs + 6};\\n"\n'
        f'        "mov.b64 desc, {{%{regs + 4}, hi}};\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.f16.f16 {{{outs}}}, '
        f'{{{a}}}, desc, p, 1, 1, 0;\\n}}\\n"\n'
        f'        : {binds}\n'
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db), "r"(accumulate),\n'
        '          "n"(DESC_HI)\n'
        '        : "memory");\n'
        "}\n"
    )


def kernel_source() -> str:
    """The kernels for both N tiles (what nvcc alone builds: tests/test_cuda_seed.py)."""
    return API_SRC + KERNEL_SRC.replace("@WGMMA@", _wgmma(64) + _wgmma(128))


# What cuda.cu's launchers (nvcc) and main.cpp's wrapper (the host compiler) both begin with.
API_SRC = r"""
#include <cuda_runtime_api.h>

constexpr int BM = 128, BK = 128;  // C's tile rows; a K step (one scale block)

// Which CTAs do what (producer and consumers alike): tiles along GROUP_M-tall bands; tiles
// [0, dp_tiles) go whole to CTAs b, b + grid, ...; the rest's K steps are cut into sk_ctas
// even ranges, one a CTA. x / d (0 <= x < 2^31) without a division: (x * mul) >> (32 + shift).
struct Div {
    unsigned mul, shift;
};
struct Sched {
    int m, n, steps, tiles_m, tiles_n, group_m, dp_tiles, sk_ctas;
    long sk_units;
    Div band, rows, rows_last;
};
// A call's buffers, strides in elements (the wrapper allocates them all)
struct Operands {
    const void* b; long b0, b1;              // B [n, k] fp8
    const float* bs; long bs0, bs1; int nb;  // B's scales [nb, steps]
    void* b16; float* bsq;                   // B in fp16 [n, steps * BK], its scales' slots
    float* ws; int* counts;                  // stream-K's (null when no tile is cut)
    const void* at; long lda; int k;         // A as TMA reads it, [k][m]
    const float* as; long lds;               // A's scales, a step's rows lds apart
    void* c; long ldc;                       // C [m, n] bf16
};
// B's upcast, then the GEMM, queued on `stream`: nullptr, or why not.
const char* ks_wgmma_fp8_gemm(const Operands& x, const Sched& s, int grid, int block_n,
                              int stages, int pingpong, int tma_store, int overlap,
                              int c_buffers, cudaStream_t stream);
"""

# The kernels, then their launchers.
KERNEL_SRC = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

constexpr int HK = 64;                            // K of one 128-byte swizzled row
constexpr int A_BYTES = BM * BK;                  // A's fp8 tile: 128 k rows of 128 m bytes
constexpr int THREADS = 384;                      // producer + two consumer warpgroups
constexpr int SCALE_BYTES = BM * 4 + 16;          // a K step's scales: A's 128 rows, B's block

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
// A plain copy of `bytes` (16-byte multiple and alignment) into shared memory, counted on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes),
                    "r"(smem_u32(bar)) : "memory");
}
// A K-major wgmma descriptor (128-byte swizzle, 8-row groups 1024 bytes apart) as its low word;
// the high word DESC_HI is the same for all, joined in wgmma_step (smem < 256 KB: no carry).
constexpr uint32_t DESC_HI = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t smem_desc_lo(const void* p) {
    return ((smem_u32(p) & 0x3FFFF) >> 4) | (1u << 16);
}
// C's tile out of shared memory: a 64 x 64 bf16 box (128-byte rows, swizzled as loaded).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                 :: "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(src)), "r"(c0), "r"(c1)
                 : "memory");
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
// Bytes (k, m), (k+1, m) of such a register as an f16x2 (`lo`), those of m + 1 (`hi`): one
// permute (bytes 0 2 1 3), then each half converted.
__device__ __forceinline__ void f16x2_pair(uint32_t r, uint32_t& lo, uint32_t& hi) {
    asm("{.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h;}"
        : "=r"(lo), "=r"(hi) : "r"(__byte_perm(r, 0, 0x3120)));
}
template <int BN>
__device__ __forceinline__ void wgmma_step(float* d, const uint32_t* a, uint32_t db, int acc);
@WGMMA@
__device__ __forceinline__ bool all_(bool p) { return __all_sync(~0u, p); }
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Four e4m3 bytes -> four fp16 values (two f16x2 words), lowest byte first.
__device__ __forceinline__ uint2 f16x4_of(uint32_t w) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFF),
                                                      __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16),
                                                      __NV_E4M3);
    return make_uint2((uint32_t)lo.x | ((uint32_t)lo.y << 16),
                      (uint32_t)hi.x | ((uint32_t)hi.y << 16));
}
// Rows r[0..3] hold four bytes each (4 rows x 4 columns); out[j] gets column j's four bytes,
// row 0 lowest.
__device__ __forceinline__ void transpose4x4(const uint32_t (&r)[4], uint32_t (&out)[4]) {
    const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140), t1 = __byte_perm(r[0], r[1], 0x7362);
    const uint32_t t2 = __byte_perm(r[2], r[3], 0x5140), t3 = __byte_perm(r[2], r[3], 0x7362);
    out[0] = __byte_perm(t0, t2, 0x5410), out[1] = __byte_perm(t0, t2, 0x7632);
    out[2] = __byte_perm(t1, t3, 0x5410), out[3] = __byte_perm(t1, t3, 0x7632);
}

// fp8 [k, mn] -> fp16 [mn, kp], zero past k: a thread transposes 8 k rows of 16 mn bytes
// (16-byte loads if VEC) by byte permutes. A block: 256 mn x 128 k; block (0, 0) also zeroes
// `zero` and writes B's scales into `bsq[kb * nb + j].x`.
template <bool VEC>
__global__ void __launch_bounds__(256) upcast_kernel(
        const uint8_t* __restrict__ src, __half* __restrict__ dst, int rows, int k, int kp,
        long s0, long s1, int* __restrict__ zero, int zeros, const float* __restrict__ bs,
        long bs0, long bs1, int nb, int steps, float4* __restrict__ bsq) {
    // every block has started: the GEMM launched after it (OVERLAP) may start its CTAs
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (blockIdx.x == 0 && blockIdx.y == 0) {
        for (int i = threadIdx.x; i < zeros; i += blockDim.x) zero[i] = 0;
        for (int i = threadIdx.x; i < steps * nb; i += blockDim.x)
            bsq[i] = make_float4(bs[(i % nb) * bs0 + (i / nb) * bs1], 0.f, 0.f, 0.f);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int mn0 = blockIdx.y * 256 + (lane / 2) * 16;
    const int k0 = blockIdx.x * 128 + warp * 16 + (lane % 2) * 8;
    if (mn0 >= rows) return;
    uint32_t x[8][4];  // x[i]: k row k0 + i, mn0 .. mn0 + 15
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int kg = k0 + i;
        if (VEC && kg < k && mn0 + 16 <= rows) {
            const uint4 v = *reinterpret_cast<const uint4*>(src + kg * s1 + mn0);
            x[i][0] = v.x, x[i][1] = v.y, x[i][2] = v.z, x[i][3] = v.w;
        } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t w = 0;
                for (int j = 0; j < 4; ++j) {
                    const int r = mn0 + 4 * q + j;
                    if (kg < k && r < rows) w |= (uint32_t)src[r * s0 + kg * s1] << (8 * j);
                }
                x[i][q] = w;
            }
        }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint32_t rows_lo[4] = {x[0][q], x[1][q], x[2][q], x[3][q]};
        const uint32_t rows_hi[4] = {x[4][q], x[5][q], x[6][q], x[7][q]};
        uint32_t lo[4], hi[4];  // column j's k rows 0-3 and 4-7
        transpose4x4(rows_lo, lo);
        transpose4x4(rows_hi, hi);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = mn0 + 4 * q + j;
            if (r < rows) {
                const uint2 a = f16x4_of(lo[j]), b = f16x4_of(hi[j]);
                *reinterpret_cast<uint4*>(dst + (long)r * kp + k0) = make_uint4(a.x, a.y, b.x, b.y);
            }
        }
    }
}

struct Seg {
    int tile, kb0, kb1;
    bool first;  // the CTA's first stream-K range: its partial goes to slot 0, else slot 1
};
// The CTA whose stream-K range holds unit u (ranges start at floor(b * units / ctas)).
__device__ __forceinline__ int owner(const Sched& s, long u) {
    return (int)(((u + 1) * s.sk_ctas - 1) / s.sk_units);
}
struct Walk {
    int next_dp;
    long u, u1;
    bool first = true;
    __device__ explicit Walk(const Sched& s) : next_dp(blockIdx.x), u(0), u1(0) {
        if ((int)blockIdx.x < s.sk_ctas) {
            u = s.sk_units * blockIdx.x / s.sk_ctas;
            u1 = s.sk_units * (blockIdx.x + 1) / s.sk_ctas;
        }
    }
    __device__ bool next(const Sched& s, Seg& g) {
        if (next_dp < s.dp_tiles) {
            g = {next_dp, 0, s.steps, false};
            next_dp += gridDim.x;
            return true;
        }
        if (u >= u1) return false;
        const int t = (int)(u / s.steps);
        g.tile = s.dp_tiles + t;
        g.kb0 = (int)(u - (long)t * s.steps);
        g.kb1 = (int)min((long)s.steps, g.kb0 + (u1 - u));
        g.first = first;
        first = false;
        u += g.kb1 - g.kb0;
        return true;
    }
};
template <int BN>
__device__ __forceinline__ void tile_origin(const Sched& s, int tile, int& m0, int& n0) {
    const auto quot = [](Div d, int x) {
        return d.mul ? (int)(__umulhi((unsigned)x, d.mul) >> d.shift) : x;
    };
    const int band = quot(s.band, tile), r = tile - band * s.group_m * s.tiles_n;
    const int first_m = band * s.group_m;
    const bool last = first_m + s.group_m > s.tiles_m;
    const int rows = last ? s.tiles_m - first_m : s.group_m;
    const int col = quot(last ? s.rows_last : s.rows, r);
    m0 = (first_m + r - col * rows) * BM;
    n0 = col * BN;
}

// The warp's A bytes for one stage, 8 k16 slices: 32 k rows a transposed ldmatrix (row k's
// 16-byte chunks swizzled by k % 8); `convert_a` makes them the wgmma's f16x2 fragments.
__device__ __forceinline__ void ldsm_a(const uint8_t* st, int chunk, int lane,
                                       uint32_t (&raw)[BK / 32][4]) {
#pragma unroll
    for (int q = 0; q < BK / 32; ++q) {
        const int k = q * 32 + lane;
        ldsm_t(smem_u32(st) + k * 128 + ((chunk ^ (k & 7)) << 4), raw[q]);
    }
}
__device__ __forceinline__ void convert_a(const uint32_t (&raw)[BK / 32][4],
                                          uint32_t (&frag)[BK / 16][4]) {
#pragma unroll
    for (int q = 0; q < BK / 32; ++q) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            f16x2_pair(raw[q][2 * j], frag[2 * q + j][0], frag[2 * q + j][1]);
            f16x2_pair(raw[q][2 * j + 1], frag[2 * q + j][2], frag[2 * q + j][3]);
        }
    }
}

// A consumer warpgroup's part of a tile that several CTAs share: written to its slot of `ws`
// (thread-major), then counted in. True when it was the last of the tile's CTAs to count:
// `acc` then holds the tile's sum, in CTA order (in place: a copy cost every tile 64 moves).
template <int NR>
__device__ bool fixup(const Sched& s, const Seg& g, float (&acc)[NR], float (&sum)[NR],
                      float4* ws, int* counts, int half, int t, volatile int* last) {
    const auto slot = [&](int cta, bool first) {
        return ws + (long)((2 * cta + (first ? 0 : 1)) * 2 + half) * (NR / 4) * 128 + t;
    };
    float4* mine = slot(blockIdx.x, g.first);
#pragma unroll
    for (int j = 0; j < NR / 4; ++j)
        __stcg(mine + j * 128, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                                           acc[4 * j + 3]));
    __threadfence();
    named_sync(1 + half, 128);
    const long first_unit = (long)(g.tile - s.dp_tiles) * s.steps;
    const int lo = owner(s, first_unit), hi = owner(s, first_unit + s.steps - 1);
    if (t == 0) {
        int* const count = counts + 2 * g.tile + half;
        last[half] = atomicAdd(count, 1) == hi - lo;
    }
    named_sync(1 + half, 128);
    if (!last[half]) return false;
    __threadfence();
    const auto add = [&](int cta, float (&to)[NR]) {
        const long first_of = s.sk_units * cta / s.sk_ctas;
        const float4* p = slot(cta, first_of / s.steps == g.tile - s.dp_tiles);
#pragma unroll
        for (int j = 0; j < NR / 4; ++j) {
            const float4 v = __ldcg(p + j * 128);
            to[4 * j] += v.x;
            to[4 * j + 1] += v.y;
            to[4 * j + 2] += v.z;
            to[4 * j + 3] += v.w;
        }
    };
    const int me = blockIdx.x;
#pragma unroll
    for (int i = 0; i < NR; ++i) sum[i] = 0.f;
    for (int cta = lo; cta < me; ++cta) add(cta, sum);
#pragma unroll
    for (int i = 0; i < NR; ++i) acc[i] = sum[i] + acc[i];
    for (int cta = me + 1; cta <= hi; ++cta) add(cta, acc);
    return true;
}

// The stage index and phase run on across tiles: the next tile's loads overlap the epilogue.
// CB: C_BUFFERS.
template <int BN, int CB>
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(
        const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
        const __grid_constant__ CUtensorMap map_c, const float* __restrict__ as, long lds,
        const float4* __restrict__ bsq, int nb, __nv_bfloat16* __restrict__ c,
        float4* __restrict__ ws, int* __restrict__ counts, const Sched sched, int stages,
        int pingpong, int tma_c, long ldc, int pairs_ok) {
    constexpr int B_HALF = BN * HK * 2;            // one 64-wide K half of B's fp16 tile
    constexpr int STAGE_BYTES = A_BYTES + 2 * B_HALF;
    constexpr int NR = BN / 2;                     // fp32 fragment registers per thread
    // The ring (1024-byte aligned for the swizzle), CB C tiles a consumer (BN / 64 swizzled
    // 64 x 64 boxes), the stages' scales, the barriers.
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* c_tiles = smem + stages * STAGE_BYTES;
    uint8_t* scales = c_tiles + CB * 2 * 64 * BN * 2;
    uint64_t* full = reinterpret_cast<uint64_t*>(scales + stages * SCALE_BYTES);
    uint64_t* empty = full + stages;
    int* last = reinterpret_cast<int*>(empty + stages);  // the fixup's verdict, per half
    if ((smem_u32(smem) & 1023) != 0) __trap();  // the swizzled tiles would be misread
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            bar_init(&full[s], 1);
            bar_init(&empty[s], 8);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // OVERLAP: wait for the upcast's writes (B, its scales, the counters); else a no-op
    asm volatile("griddepcontrol.wait;" ::: "memory");

    const int wg = threadIdx.x / 128;
    Walk walk(sched);
    Seg g;
    int s = 0;
    uint32_t phase = 0;
    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            while (walk.next(sched, g)) {
                int m0, n0;
                tile_origin<BN>(sched, g.tile, m0, n0);
                for (int kb = g.kb0; kb < g.kb1; ++kb) {
                    bar_wait(&empty[s], phase ^ 1);
                    uint8_t* st = smem + s * STAGE_BYTES;
                    // A's scales of the tile's rows (whole 16-byte lines: `as` rows are
                    // readable up to m rounded up to 4)
                    const uint32_t a_bytes = (min(BM, sched.m - m0) + 3) / 4 * 16;
                    bar_expect(&full[s], STAGE_BYTES + a_bytes + 16);
                    tma_load(st, &map_a, &full[s], m0, kb * BK);
                    for (int h = 0; h < 2; ++h)
                        tma_load(st + A_BYTES + h * B_HALF, &map_b, &full[s], kb * BK + h * HK,
                                 n0);
                    bulk_load(scales + s * BM * 4, as + kb * lds + m0, a_bytes, &full[s]);
                    bulk_load(scales + stages * BM * 4 + s * 16, bsq + (long)kb * nb + n0 / 128,
                              16, &full[s]);
                    if (++s == stages) s = 0, phase ^= 1;
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int half = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int chunk = half * 4 + warp;  // the warp's 16 m bytes in each 128-byte k row
    const int m = sched.m, n = sched.n;
    float acc[NR], part[NR];
    uint32_t frag[BK / 16][4], raw[BK / 32][4];
    int c_buf = 0;  // CB 2: the buffer of this tile's C
#pragma unroll
    for (int i = 0; i < NR; ++i) part[i] = 0.f;
    if (pingpong && half == 1) named_arrive(3, 256);  // the first turn is the first half's
    // Warp votes make these branches uniform: the ring and B's descriptors stay in uniform
    // registers.
    while (all_(walk.next(sched, g))) {
        int m0, n0;
        tile_origin<BN>(sched, g.tile, m0, n0);
        // The fragment's rows g and g + 8 (g = lane / 4) are the tile's rows 2g and 2g + 1 of
        // the warp's 16 (the transposed ldmatrix pairs neighbouring m); scales and C follow.
        const int row = m0 + half * 64 + warp * 16 + 2 * (lane / 4);  // and row + 1
#pragma unroll
        for (int i = 0; i < NR; ++i) acc[i] = 0.f;
        // A step's scales (they came with its tiles) and A's bytes; the next step's are read
        // while this step's MMAs run, and converted once they are done.
        float sa0, sa1, sb;
        const auto fetch = [&](int st_i) {
            const float* sc = reinterpret_cast<const float*>(scales + st_i * BM * 4);
            sb = *reinterpret_cast<const float*>(scales + stages * BM * 4 + st_i * 16);
            sa0 = row < m ? sc[row - m0] : 0.f;
            sa1 = row + 1 < m ? sc[row + 1 - m0] : 0.f;
            ldsm_a(smem + st_i * STAGE_BYTES, chunk, lane, raw);
        };
        bar_wait(&full[s], phase);
        fetch(s);
        for (int kb = g.kb0; all_(kb < g.kb1); ++kb) {
            const int here = s;
            const float s0 = sa0 * sb, s1 = sa1 * sb;
            // B's descriptor once a step, each MMA's a constant offset from it
            const uint32_t db = smem_desc_lo(smem + here * STAGE_BYTES + A_BYTES);
            convert_a(raw, frag);
            // Pinned before the turn and the fence: else ptxas moves the conversions among the
            // wgmma, injecting a warpgroup.arrive before each (C7519; 3.5% slower).
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk)
                asm volatile("" : "+r"(frag[kk][0]), "+r"(frag[kk][1]), "+r"(frag[kk][2]),
                             "+r"(frag[kk][3]));
            if (pingpong) named_sync(3 + half, 256);  // my turn
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const int h = kk / 4, off = (kk % 4) * 32;
                wgmma_step<BN>(part, frag[kk], db + ((h * B_HALF + off) >> 4), kk > 0);
            }
            wgmma_commit();
            if (pingpong) named_arrive(4 - half, 256);  // the other's turn
            if (++s == stages) s = 0, phase ^= 1;
            if (all_(kb + 1 < g.kb1)) {
                bar_wait(&full[s], phase);
                fetch(s);
            }
            wgmma_wait();
            if (lane == 0) bar_arrive(&empty[here]);
#pragma unroll
            for (int j = 0; j < NR / 4; ++j) {
                acc[4 * j] += part[4 * j] * s0;
                acc[4 * j + 1] += part[4 * j + 1] * s0;
                acc[4 * j + 2] += part[4 * j + 2] * s1;
                acc[4 * j + 3] += part[4 * j + 3] * s1;
            }
        }
        if ((g.kb0 > 0 || g.kb1 < sched.steps) &&
                !fixup<NR>(sched, g, acc, part, ws, counts, half, t, last))
            continue;  // another CTA of this tile writes it
        if (tma_c) {  // through shared memory and TMA: whole lines, not waited for
            uint8_t* mine = c_tiles + ((CB == 2 ? 2 * c_buf : 0) + half) * 64 * BN * 2;
            if constexpr (CB == 2) {
                c_buf ^= 1;
                if (t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            } else {
                if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            }
            named_sync(1 + half, 128);  // the store that used the buffer has read it
#pragma unroll
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
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            named_sync(1 + half, 128);
            if (t == 0) {
                for (int b = 0; b < BN / 64; ++b)
                    tma_store(&map_c, mine + b * 8192, n0 + b * 64, m0 + half * 64);
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
            continue;
        }

#pragma unroll
        for (int j = 0; j < NR / 4; ++j) {
            const int col = n0 + j * 8 + (lane % 4) * 2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row + h;
                if (r >= m || col >= n) continue;
                const float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
                if (pairs_ok && col + 1 < n) {
                    *reinterpret_cast<__nv_bfloat162*>(c + r * ldc + col) =
                        __floats2bfloat162_rn(x, y);
                } else {
                    c[r * ldc + col] = __float2bfloat16_rn(x);
                    if (col + 1 < n) c[r * ldc + col + 1] = __float2bfloat16_rn(y);
                }
            }
        }
    }
    if (pingpong && half == 0) named_sync(3, 256);  // the other's last turn
    if (tma_c && t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Taking their addresses builds every GEMM and upcast.
void* const KERNELS[6] = {(void*)gemm_kernel<64, 1>, (void*)gemm_kernel<128, 1>,
                          (void*)gemm_kernel<64, 2>, (void*)gemm_kernel<128, 2>,
                          (void*)upcast_kernel<true>, (void*)upcast_kernel<false>};
"""

# The launchers: CUDA's runtime and driver API only, so nvcc parses no torch header.
LAUNCH_SRC = r"""
#include <stdio.h>

static thread_local char why[256];  // why a call failed, for the wrapper to raise
#define KS_TRY(call) do { const cudaError_t e_ = (call); if (e_ != cudaSuccess) return \
    snprintf(why, 256, "CUDA error: %s (cuda.cu:%d)", cudaGetErrorString(e_), __LINE__), why; \
    } while (0)
#define KS_OK(call) do { if (const char* w_ = (call)) return w_; } while (0)

static const char* tensor_map(CUtensorMap& map, CUtensorMapDataType type, const void* base,
                              int inner, int outer, long row_bytes, int box_inner,
                              int box_outer) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        cudaDriverEntryPointQueryResult found;
        void* fn = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess
                || found != cudaDriverEntryPointSuccess)
            return "the driver has no cuTensorMapEncodeTiled (CUDA 12+ needed)";
        encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {(cuuint32_t)box_inner, (cuuint32_t)box_outer}, unit[2] = {1, 1};
    CUresult r = encode(&map, type, 2, const_cast<void*>(base), dims, strides,
                        box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return nullptr;
    snprintf(why, 256, "cuTensorMapEncodeTiled failed with %d for a [%d, %d] operand", (int)r,
             outer, inner);
    return why;
}

template <int BN, int CB>
static const char* launch(const CUtensorMap& map_a, const CUtensorMap& map_b,
                          const CUtensorMap& map_c, const Operands& x, const Sched& s, int grid,
                          int stages, int pingpong, int tma_c, int overlap, cudaStream_t stream) {
    const int smem = stages * (A_BYTES + 4 * BN * HK + SCALE_BYTES + 16) + CB * 256 * BN + 16;
    static int opted_in[64] = {};  // per device: the most shared memory asked for yet
    int device = 0;
    KS_TRY(cudaGetDevice(&device));
    if (opted_in[device % 64] < smem) {
        KS_TRY(cudaFuncSetAttribute(gemm_kernel<BN, CB>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        opted_in[device % 64] = smem;
    }
    // OVERLAP: a programmatic dependent of the upcast launched just before on this stream
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid), config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = smem, config.stream = stream;
    config.attrs = &attr, config.numAttrs = overlap ? 1 : 0;
    const int pairs_ok = x.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(x.c) % 4 == 0;
    KS_TRY(cudaLaunchKernelEx(
        &config, gemm_kernel<BN, CB>, map_a, map_b, map_c, x.as, x.lds,
        reinterpret_cast<const float4*>(x.bsq), x.nb, static_cast<__nv_bfloat16*>(x.c),
        reinterpret_cast<float4*>(x.ws), x.counts, s, stages, pingpong, tma_c, x.ldc,
        pairs_ok));
    return nullptr;
}

const char* ks_wgmma_fp8_gemm(const Operands& x, const Sched& s, int grid, int block_n,
                              int stages, int pingpong, int tma_store, int overlap,
                              int c_buffers, cudaStream_t stream) {
    // B -> fp16 [n, kp], K-major; the same launch zeroes the counters and writes `bsq`.
    const int kp = s.steps * BK, zeros = x.counts ? 2 * s.tiles_m * s.tiles_n : 0;
    const bool vec = x.b0 == 1 && x.b1 % 16 == 0 && reinterpret_cast<uintptr_t>(x.b) % 16 == 0;
    auto upcast = vec ? upcast_kernel<true> : upcast_kernel<false>;
    upcast<<<dim3(kp / BK, (s.n + 255) / 256), 256, 0, stream>>>(
        static_cast<const uint8_t*>(x.b), static_cast<__half*>(x.b16), s.n, x.k, kp, x.b0, x.b1,
        x.counts, zeros, x.bs, x.bs0, x.bs1, x.nb, s.steps, reinterpret_cast<float4*>(x.bsq));
    KS_TRY(cudaGetLastError());
    CUtensorMap map_a, map_b, map_c;
    KS_OK(tensor_map(map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, x.at, s.m, x.k, x.lda, BM, BK));
    KS_OK(tensor_map(map_b, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x.b16, kp, s.n, kp * 2L, HK,
                     block_n));
    // C through TMA where its rows are whole 16-byte lines (else direct stores)
    const bool tma_c = tma_store && x.ldc % 8 == 0 && reinterpret_cast<uintptr_t>(x.c) % 16 == 0;
    map_c = map_b;  // unused unless tma_c
    if (tma_c)
        KS_OK(tensor_map(map_c, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x.c, s.n, s.m, x.ldc * 2, 64,
                         64));
    const auto run = block_n == 64 ? (c_buffers == 2 ? launch<64, 2> : launch<64, 1>)
                                   : (c_buffers == 2 ? launch<128, 2> : launch<128, 1>);
    const auto div = [](int d) -> Div {  // mul = ceil(2^(31 + l) / d), 2^l >= d
        int l = 0;
        while ((1ll << l) < d) ++l;
        if (l == 0) return {0u, 0u};
        return {(unsigned)(((1ull << (31 + l)) + d - 1) / d), (unsigned)(l - 1)};
    };
    Sched f = s;
    f.band = div(s.group_m * s.tiles_n);
    f.rows = div(s.group_m);
    f.rows_last = div(s.tiles_m % s.group_m ? s.tiles_m % s.group_m : s.group_m);
    return run(map_a, map_b, map_c, x, f, grid, stages, pingpong, tma_c, overlap, stream);
}
"""

# The Python wrapper on Python's C API alone (a 0.2 s build). custom_kernel below checks the
# tensors, allocates, plans the schedule and passes integers.
WRAPPER_SRC = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
""" + API_SRC + r"""
// fp8_gemm(*ARGS): the integers below, in this order; raises RuntimeError with the CUDA error.
static const char* const ARGS[] = {
    "b", "b0", "b1", "bs", "bs0", "bs1", "nb", "b16", "bsq", "ws", "counts", "at", "lda", "k",
    "as", "lds", "c", "ldc", "m", "n", "steps", "tiles_m", "tiles_n", "group_m", "dp_tiles",
    "sk_ctas", "sk_units", "grid", "block_n", "stages", "pingpong", "tma_store", "overlap",
    "c_buffers", "stream"};
constexpr Py_ssize_t NARGS = sizeof(ARGS) / sizeof(ARGS[0]);

static PyObject* fp8_gemm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != NARGS)
        return PyErr_Format(PyExc_TypeError, "cuda_wgmma.fp8_gemm takes %zd integers (b, b0, "
                            "..., stream), got %zd arguments", NARGS, nargs);
    long long v[NARGS];
    for (Py_ssize_t i = 0; i < NARGS; ++i) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred())
            return PyErr_Format(PyExc_TypeError, "cuda_wgmma.fp8_gemm: argument '%s' must be "
                                "an int, got %R", ARGS[i], args[i]);
    }
    auto ptr = [&](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(v[i])); };
    const Operands x = {
        .b = ptr(0), .b0 = (long)v[1], .b1 = (long)v[2], .bs = (const float*)ptr(3),
        .bs0 = (long)v[4], .bs1 = (long)v[5], .nb = (int)v[6], .b16 = ptr(7),
        .bsq = (float*)ptr(8), .ws = (float*)ptr(9), .counts = (int*)ptr(10), .at = ptr(11),
        .lda = (long)v[12], .k = (int)v[13], .as = (const float*)ptr(14), .lds = (long)v[15],
        .c = ptr(16), .ldc = (long)v[17]};
    Sched s;
    s.m = (int)v[18], s.n = (int)v[19], s.steps = (int)v[20], s.tiles_m = (int)v[21];
    s.tiles_n = (int)v[22], s.group_m = (int)v[23], s.dp_tiles = (int)v[24];
    s.sk_ctas = (int)v[25], s.sk_units = (long)v[26];
    const char* why;
    Py_BEGIN_ALLOW_THREADS
    why = ks_wgmma_fp8_gemm(x, s, (int)v[27], (int)v[28], (int)v[29], (int)v[30], (int)v[31],
                            (int)v[32], (int)v[33], reinterpret_cast<cudaStream_t>(ptr(34)));
    Py_END_ALLOW_THREADS
    if (why != nullptr) return PyErr_Format(PyExc_RuntimeError, "cuda_wgmma: %s", why);
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"fp8_gemm", (PyCFunction)(void (*)(void))fp8_gemm, METH_FASTCALL,
     "B's upcast, then the GEMM, queued on a stream (custom_kernel passes the integers)"},
    {nullptr, nullptr, 0, nullptr}};
#define KS_STR(x) #x
#define KS_NAME(x) KS_STR(x)
static PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, KS_NAME(TORCH_EXTENSION_NAME), nullptr, -1,
                             METHODS};
#define KS_CAT(a, b) a##b
#define KS_INIT(name) KS_CAT(PyInit_, name)
PyMODINIT_FUNC KS_INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&MODULE); }
"""

# no_implicit_headers keeps torch's headers out of both files (issue 32: 56.5 s a build, 4 s).
def _build(**fast):
    return load_inline(
        name="ks_cuda_wgmma_v8",
        cpp_sources=[WRAPPER_SRC],
        cuda_sources=[kernel_source() + LAUNCH_SRC],
        # --split-compile=0: nvcc optimises the kernels on every core
        extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O3", "--split-compile=0"],
        **fast,
    )


try:
    module = _build(no_implicit_headers=True)
except TypeError:
    module = _build()


def shape_of(data):
    """The call's shape as the task's case keys (SHAPE_KEYS), what a graft dispatches on
    (pytest_kscientist/evolve/graft.py)."""
    a, b = data[0], data[1]
    return {"m": a.shape[0], "n": b.shape[0], "k": a.shape[1]}


def sk_ctas_for(units: int, steps: int, sms: int, fixup: float = 8.0) -> int:
    """Stream-K's CTAs (<= sms): a whole tile each, parts of one tile each, or the even cut
    (parts of two), whichever's longest CTA is shortest, a part costing ``fixup`` steps more
    (notes/fp8_gemm_h200.md)."""
    tiles, most = units // steps, min(sms, units)
    if tiles >= most:
        return most
    parts, best = most // tiles, (steps, -tiles)  # (longest, -CTAs): ties to more
    if parts > 1:
        best = min(best, (-(-steps // parts) + fixup, -parts * tiles))
    if most % tiles:
        best = min(best, (-(-units // most) + 2 * fixup, -most))
    return -best[1]


def plan(m: int, n: int, steps: int, block_n: int, group_m: int, stream_k: int,
         persistent: int, sms: int) -> tuple[list[int], int, int]:
    """Sched's fields (the wrapper's order), the grid, and how many tiles stream-K cuts."""
    tiles_m, tiles_n = -(-m // BLOCK_M), -(-n // block_n)
    tiles = tiles_m * tiles_n
    rest = tiles % sms
    sk_tiles = 0 if stream_k == 0 or rest == 0 else rest + (
        sms if stream_k == 2 and tiles > sms else 0)
    dp_tiles = tiles - sk_tiles
    sk_units = sk_tiles * steps
    sk_ctas = sk_ctas_for(sk_units, steps, sms) if sk_units else 0
    grid = ((sms if dp_tiles > 0 else sk_ctas) if sk_tiles else
            min(tiles, sms) if persistent else tiles)
    return ([m, n, steps, tiles_m, tiles_n, max(1, group_m), dp_tiles, sk_ctas, sk_units], grid,
            sk_tiles)


_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def fp8_gemm(a, b, a_scale, b_scale, c, knobs: dict) -> torch.Tensor:
    """C = (A * a_scale) @ (B * b_scale)^T into ``c`` on A's device's current stream; every
    other buffer the kernels use is this call's own."""
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError(f"cuda_wgmma: a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        raise TypeError(f"cuda_wgmma: a_scale and b_scale must be float32, got "
                        f"{a_scale.dtype} and {b_scale.dtype}")
    if c.dtype != torch.bfloat16 or c.stride(1) != 1:
        raise ValueError(f"cuda_wgmma: c must be row-major bf16, got {c.dtype} with strides "
                         f"{c.stride()}")
    (m, k), n = a.shape, b.shape[0]
    steps = -(-k // BLOCK_K)
    if b.shape[1] != k or a_scale.shape != (m, steps) or b_scale.shape != (-(-n // 128), steps):
        raise ValueError(f"cuda_wgmma: a [m, k], b [n, k], a_scale [m, ceil(k/128)] and b_scale "
                         f"[ceil(n/128), ceil(k/128)] expected, got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(a_scale.shape)} and {tuple(b_scale.shape)}")
    if not all(t.is_cuda and t.device == a.device for t in (b, a_scale, b_scale, c)):
        raise ValueError(f"cuda_wgmma: every tensor must be on one CUDA device, got "
                         f"{[str(t.device) for t in (a, b, a_scale, b_scale, c)]}")
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    block_n, c_buffers = knobs["BLOCK_N"], knobs["C_BUFFERS"]
    if block_n not in (64, 128) or c_buffers not in (1, 2):
        raise ValueError(f"cuda_wgmma: BLOCK_N must be 64 or 128 and C_BUFFERS 1 or 2, got "
                         f"{block_n} and {c_buffers}")
    device = a.device.index
    if device != torch.cuda.current_device():
        with torch.cuda.device(device):
            return fp8_gemm(a, b, a_scale, b_scale, c, knobs)
    sms = torch.cuda.get_device_properties(device).multi_processor_count  # kept by torch
    sched, grid, sk_tiles = plan(m, n, steps, block_n, knobs["GROUP_M"], knobs["STREAM_K"],
                                 knobs["PERSISTENT"], sms)
    # One allocation: B in fp16, B's scales' 16-byte slots, stream-K's partials and counters
    nb = b_scale.shape[0]
    sizes = [n * steps * BLOCK_K * 2, steps * nb * 16]
    if sk_tiles:
        sizes += [2 * sms * BLOCK_M * block_n * 4, 2 * sched[3] * sched[4] * 4]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + _aligned(size))
    scratch = torch.empty(offsets[-1], dtype=torch.uint8, device=a.device)
    # A's scales, a step's rows in whole 16-byte lines: the task's a_scale, else a copy.
    as_, lds = a_scale, a_scale.stride(1)
    if (a_scale.stride(0) != 1 or lds % 4 or lds < m or m % 4
            or a_scale.data_ptr() % 16):
        lds = -(-m // 4) * 4
        as_ = torch.zeros((steps, lds), dtype=torch.float32, device=a.device)
        as_[:, :m].copy_(a_scale.t())
    # TMA reads A in the task's layout ([k][m]) when its rows are 16-byte aligned, else a copy.
    at_, lda = a, a.stride(1)
    if a.stride(0) != 1 or lda % 16 or a.data_ptr() % 16:
        lda = -(-m // 16) * 16
        at_ = torch.zeros((k, lda), dtype=a.dtype, device=a.device)
        at_[:, :m].copy_(a.t())
    stream = _stream(device) if _stream else torch.cuda.current_stream(device).cuda_stream
    module.fp8_gemm(b.data_ptr(), b.stride(0), b.stride(1), b_scale.data_ptr(),
                    b_scale.stride(0), b_scale.stride(1), nb, scratch.data_ptr() + offsets[0],
                    scratch.data_ptr() + offsets[1],
                    scratch.data_ptr() + offsets[2] if sk_tiles else 0,
                    scratch.data_ptr() + offsets[3] if sk_tiles else 0,
                    at_.data_ptr(), lda, k, as_.data_ptr(), lds, c.data_ptr(), c.stride(0),
                    *sched, grid, block_n, stages_for(block_n, knobs["STAGE_DROP"], c_buffers),
                    knobs["PINGPONG"], knobs["TMA_STORE"], knobs["OVERLAP"], c_buffers, stream)
    return c


def custom_kernel(data):
    """C = (A * a_scale) @ (B * b_scale)^T in bf16, written into ``c`` and returned."""
    a, b, a_scale, b_scale, c = data
    (m, k), n = a.shape, b.shape[0]
    return fp8_gemm(a, b, a_scale, b_scale, c, tunables_for(m=m, n=n, k=k))
