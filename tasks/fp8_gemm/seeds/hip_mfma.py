"""HIP seed for MI300 (gfx942): block-scaled FP8 GEMM on fp8 MFMA with fp32 accumulation.

GPU MODE's template-hip.py form: load_inline compiles the HIP source below on ROCm torch. On
other machines its run items skip (KS_REQUIRES) and its compile[gfx942] item compiles it with
an AMDGPU toolchain (pytest_kscientist/hip/compile_gate.py).

A workgroup owns a BLOCK_M x BLOCK_N tile of C and walks K one 128-wide scale block at a time:
it stages the block's A and B slabs in LDS in the task's column-major layout ([k][m], [k][n];
coalesced 4-byte copies, zero past the edges), then each of its WAVES_M x WAVES_N waves
multiplies its sub-tile with v_mfma_f32_16x16x32_fp8_fp8 (e4m3fnuz operands, exact products,
fp32 accumulation) into a partial sum for that block, and adds partial * a_scale[row] *
b_scale[col / 128] to its fp32 accumulators: per-block scaling in fp32, as in the reference.
C is rounded once to bf16, to nearest even.

Portable form: compiled for anything but gfx942 (another AMD target, or CUDA through nvcc),
the MFMA becomes a software emulation with the instruction's lane layout (fragments exchanged
through LDS), decoding e4m3fn or e4m3fnuz bytes exactly; bench/hip_seed_portable.py runs that
form on an NVIDIA GPU against the task's reference, which checks everything but the
instruction itself: staging, fragment gathering, the C layout, scaling, edges, rounding.
"""

from __future__ import annotations

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "rocm"
KS_HIP_ARCH = ["gfx942"]

# The knobs reach the source as -D flags of the same name (KNOB_FLAGS). Waves that would get
# less than one 16x16 MFMA tile are dropped (WM, WN below), so every point of the space builds.
TUNABLES = {
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "WAVES_M": 2,
    "WAVES_N": 2,
    "LDS_PAD": 4,
}
TUNABLE_SPACE = {
    "BLOCK_M": [32, 64, 128],
    "BLOCK_N": [32, 64, 128],
    "WAVES_M": [1, 2, 4],
    "WAVES_N": [1, 2, 4],
    "LDS_PAD": [0, 4, 8, 16],
}

CPP_WRAPPER = """
torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t fnuz);
"""

HIP_SRC = r"""
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif
#include <stdint.h>

#if !defined(BLOCK_M) || !defined(BLOCK_N) || !defined(WAVES_M) || !defined(WAVES_N) || \
    !defined(LDS_PAD)
#error "the TUNABLES come as -D flags (KNOB_FLAGS in extra_cuda_cflags)"
#endif

constexpr int BK = 128;    // one K step is one scale block
constexpr int WAVE = 64;   // lanes of an MFMA wave; the portable form uses 64 threads alike
constexpr int WM = WAVES_M < BLOCK_M / 16 ? WAVES_M : BLOCK_M / 16;
constexpr int WN = WAVES_N < BLOCK_N / 16 ? WAVES_N : BLOCK_N / 16;
constexpr int TM = BLOCK_M / (16 * WM);  // 16x16 MFMA tiles per wave along M
constexpr int TN = BLOCK_N / (16 * WN);
constexpr int THREADS = WAVE * WM * WN;
constexpr int PITCH_A = BLOCK_M + LDS_PAD;  // LDS bytes per k row of the A slab
constexpr int PITCH_B = BLOCK_N + LDS_PAD;
static_assert(BLOCK_M % 16 == 0 && BLOCK_N % 16 == 0, "tiles are whole 16x16 MFMA tiles");
static_assert(TM * 16 * WM == BLOCK_M && TN * 16 * WN == BLOCK_N, "waves split the tile evenly");
static_assert(LDS_PAD % 4 == 0, "slabs are written in 4-byte words");

#if defined(__gfx942__)
typedef float acc4 __attribute__((ext_vector_type(4)));
#else
struct acc4 {
    float v[4];
    __device__ float& operator[](int i) { return v[i]; }
};
#endif

// An e4m3 byte as a float, exactly: e4m3fn (bias 7, NaN 0x7f/0xff) or e4m3fnuz (bias 8, NaN
// 0x80, no negative zero). Only the portable form decodes; MFMA reads fnuz bytes itself.
__device__ inline float decode_e4m3(uint32_t v, int fnuz) {
    if (fnuz ? v == 0x80 : (v & 0x7f) == 0x7f) return __int_as_float(0x7fc00000);
    int exp = (v >> 3) & 0xf, man = v & 7, bias = fnuz ? 8 : 7;
    float mag = exp ? ldexpf((float)(8 + man), exp - bias - 3) : ldexpf((float)man, -bias - 2);
    return (v & 0x80) ? -mag : mag;
}

// c += A(16x32) * B(32x16) for one wave. Lane l holds A[l % 16][8 * (l / 16) + i] and
// B[8 * (l / 16) + i][l % 16] (byte i of its fragment) and receives C[4 * (l / 16) + r][l % 16].
__device__ inline void mfma_16x16x32(uint64_t fa, uint64_t fb, acc4& c, uint64_t* xa,
                                     uint64_t* xb, int lane, int fnuz) {
#if defined(__gfx942__)
    c = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8((long)fa, (long)fb, c, 0, 0, 0);
#else
    // The same contract in software, fragments exchanged through LDS; every thread of the
    // workgroup calls this the same number of times, so the barriers are uniform.
    xa[lane] = fa;
    xb[lane] = fb;
    __syncthreads();
    const int col = lane % 16, row0 = 4 * (lane / 16);
    for (int r = 0; r < 4; ++r) {
        float sum = 0.f;
        for (int g = 0; g < 4; ++g) {
            uint64_t pa = xa[16 * g + row0 + r], pb = xb[16 * g + col];
            for (int i = 0; i < 8; ++i)
                sum += decode_e4m3((pa >> (8 * i)) & 0xff, fnuz) *
                       decode_e4m3((pb >> (8 * i)) & 0xff, fnuz);
        }
        c[r] += sum;
    }
    __syncthreads();
#endif
}

// Copy a [BK][width] slab of a column-major operand (element (col, kk) at src[kk * ld + col])
// into LDS rows of ``pitch`` bytes, zero past the matrix edges.
__device__ inline void stage(const uint8_t* __restrict__ src, uint8_t* dst, int col0, int k0,
                             int cols, int k, long ld, int width, int pitch, bool words) {
    const int per_row = width / 4;
    for (int idx = threadIdx.x; idx < BK * per_row; idx += THREADS) {
        const int kk = idx / per_row, i = 4 * (idx % per_row);
        const int gk = k0 + kk, gc = col0 + i;
        uint32_t v = 0;
        if (gk < k) {
            const uint8_t* p = src + (long)gk * ld + gc;
            if (words && gc + 3 < cols) {
                v = *(const uint32_t*)p;
            } else {
                for (int j = 0; j < 4; ++j)
                    if (gc + j < cols) v |= (uint32_t)p[j] << (8 * j);
            }
        }
        *(uint32_t*)(dst + kk * pitch + i) = v;
    }
}

// Eight consecutive k of one row (or column) of a staged slab, as an MFMA fragment.
__device__ inline uint64_t fragment(const uint8_t* slab, int pitch, int col, int kk) {
    uint64_t f = 0;
    for (int i = 0; i < 8; ++i) f |= (uint64_t)slab[(kk + i) * pitch + col] << (8 * i);
    return f;
}

__device__ inline uint16_t to_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1);  // round to nearest, ties to even
    return (uint16_t)(u >> 16);
}

__global__ void __launch_bounds__(THREADS)
fp8_gemm_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                const float* __restrict__ as, const float* __restrict__ bs,
                uint16_t* __restrict__ c, int m, int n, int k, long lda, long ldb,
                long sa_m, long sa_k, long sb_n, long sb_k, long ldc, int words_a,
                int words_b, int fnuz) {
    __shared__ __attribute__((aligned(16))) uint8_t slab_a[BK * PITCH_A];
    __shared__ __attribute__((aligned(16))) uint8_t slab_b[BK * PITCH_B];
#if defined(__gfx942__)
    uint64_t *xa = nullptr, *xb = nullptr;
#else
    __shared__ uint64_t exchange[2][WM * WN][WAVE];
#endif
    const int lane = threadIdx.x % WAVE, wave = threadIdx.x / WAVE;
    const int wm = wave % WM, wn = wave / WM;
#if !defined(__gfx942__)
    uint64_t* xa = exchange[0][wave];
    uint64_t* xb = exchange[1][wave];
#endif
    const int m0 = blockIdx.y * BLOCK_M, n0 = blockIdx.x * BLOCK_N;
    const int row_base = m0 + wm * TM * 16 + 4 * (lane / 16);  // + 16 * tm + r
    const int col_base = n0 + wn * TN * 16 + lane % 16;        // + 16 * tn

    acc4 acc[TM][TN];
    for (int tm = 0; tm < TM; ++tm)
        for (int tn = 0; tn < TN; ++tn)
            for (int r = 0; r < 4; ++r) acc[tm][tn][r] = 0.f;

    for (int kb = 0; kb * BK < k; ++kb) {
        stage(a, slab_a, m0, kb * BK, m, k, lda, BLOCK_M, PITCH_A, words_a);
        stage(b, slab_b, n0, kb * BK, n, k, ldb, BLOCK_N, PITCH_B, words_b);
        __syncthreads();
        acc4 part[TM][TN];
        for (int tm = 0; tm < TM; ++tm)
            for (int tn = 0; tn < TN; ++tn)
                for (int r = 0; r < 4; ++r) part[tm][tn][r] = 0.f;
        for (int ks = 0; ks < BK; ks += 32) {
            const int kk = ks + 8 * (lane / 16);
            uint64_t fa[TM], fb[TN];
            for (int tm = 0; tm < TM; ++tm)
                fa[tm] = fragment(slab_a, PITCH_A, wm * TM * 16 + tm * 16 + lane % 16, kk);
            for (int tn = 0; tn < TN; ++tn)
                fb[tn] = fragment(slab_b, PITCH_B, wn * TN * 16 + tn * 16 + lane % 16, kk);
            for (int tm = 0; tm < TM; ++tm)
                for (int tn = 0; tn < TN; ++tn)
                    mfma_16x16x32(fa[tm], fb[tn], part[tm][tn], xa, xb, lane, fnuz);
        }
        // This block's scales, in fp32: rows past m and columns past n read none.
        float sb[TN];
        for (int tn = 0; tn < TN; ++tn) {
            const int col = col_base + 16 * tn;
            sb[tn] = col < n ? bs[(long)(col / 128) * sb_n + (long)kb * sb_k] : 0.f;
        }
        for (int tm = 0; tm < TM; ++tm)
            for (int r = 0; r < 4; ++r) {
                const int row = row_base + 16 * tm + r;
                const float sa = row < m ? as[(long)row * sa_m + (long)kb * sa_k] : 0.f;
                for (int tn = 0; tn < TN; ++tn) acc[tm][tn][r] += part[tm][tn][r] * sa * sb[tn];
            }
        __syncthreads();  // the slabs are overwritten next step
    }

    for (int tm = 0; tm < TM; ++tm)
        for (int r = 0; r < 4; ++r) {
            const int row = row_base + 16 * tm + r;
            for (int tn = 0; tn < TN; ++tn) {
                const int col = col_base + 16 * tn;
                if (row < m && col < n) c[(long)row * ldc + col] = to_bf16(acc[tm][tn][r]);
            }
        }
}

torch::Tensor fp8_gemm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                       torch::Tensor c, int64_t fnuz) {
    TORCH_CHECK(a.element_size() == 1 && b.element_size() == 1,
                "fp8_gemm: a and b must be fp8 (one byte each), got ", a.dtype(), " and ",
                b.dtype());
    TORCH_CHECK(a.stride(0) == 1 && b.stride(0) == 1,
                "fp8_gemm: a and b must be column-major (the task's layout, stride(0) == 1), "
                "got strides ", a.strides(), " and ", b.strides());
    TORCH_CHECK(c.stride(1) == 1, "fp8_gemm: c must be row-major, got strides ", c.strides());
    TORCH_CHECK(as.scalar_type() == torch::kFloat32 && bs.scalar_type() == torch::kFloat32,
                "fp8_gemm: scales must be float32");
    const int m = a.size(0), k = a.size(1), n = b.size(0);
    if (m == 0 || n == 0) return c;
    const long lda = a.stride(1), ldb = b.stride(1);
    dim3 grid((n + BLOCK_N - 1) / BLOCK_N, (m + BLOCK_M - 1) / BLOCK_M);
    fp8_gemm_kernel<<<grid, THREADS, 0, 0>>>(
        reinterpret_cast<const uint8_t*>(a.data_ptr()),
        reinterpret_cast<const uint8_t*>(b.data_ptr()), as.data_ptr<float>(),
        bs.data_ptr<float>(), reinterpret_cast<uint16_t*>(c.data_ptr()), m, n, k, lda, ldb,
        as.stride(0), as.stride(1), bs.stride(0), bs.stride(1), c.stride(0), lda % 4 == 0,
        ldb % 4 == 0, (int)fnuz);
    return c;
}
"""

KNOB_FLAGS = [f"-D{name}={value}" for name, value in TUNABLES.items()]

module = load_inline(
    name=f"ks_hip_mfma_{TUNABLES['BLOCK_M']}x{TUNABLES['BLOCK_N']}"
         f"_w{TUNABLES['WAVES_M']}x{TUNABLES['WAVES_N']}_p{TUNABLES['LDS_PAD']}",
    cpp_sources=[CPP_WRAPPER],
    cuda_sources=[HIP_SRC],
    functions=["fp8_gemm"],
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3", *KNOB_FLAGS],
)


def custom_kernel(data):
    """C = (A * a_scale) @ (B * b_scale)^T in bf16, written into ``c`` and returned."""
    a, b, a_scale, b_scale, c = data
    fnuz = a.dtype == torch.float8_e4m3fnuz
    if not fnuz:
        raise ValueError(f"hip_mfma: gfx942's fp8 MFMA reads float8_e4m3fnuz, got {a.dtype}; "
                         "run it on ROCm, where the task draws e4m3fnuz")
    return module.fp8_gemm(a, b, a_scale, b_scale, c, int(fnuz))
