"""A CUDA candidate for fp8_gemm whose kernel does not compile (a missing ';'): its
compile[sm_90] item must fail with nvcc's error, on a machine without the GPU."""

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"

CUDA_SRC = r"""
#include <cuda_runtime.h>
__global__ void scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f
}
extern "C" void launch_scale(float* x, int n) { scale<<<(n + 255) / 256, 256>>>(x, n); }
"""

module = load_inline(name="ks_test_cuda_syntax_error", cpp_sources=[""],
                     cuda_sources=[CUDA_SRC], no_implicit_headers=True)


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    return c.copy_(torch.zeros_like(c))
