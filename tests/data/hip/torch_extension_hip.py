"""load_inline's most common form in GPU MODE's HIP submissions: the HIP source includes
<torch/extension.h> itself (torch's Python bindings, hence Python.h) and checks its tensors with
TORCH_CHECK. A naive fp8 GEMM, written for the compile gate's tests (issue 30)."""

from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "rocm"
KS_HIP_ARCH = "gfx942"

CPP_WRAPPER = """
torch::Tensor fp8_mm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                     torch::Tensor c);
"""

CUDA_SRC = """
#include <torch/extension.h>
#include <hip/amd_detail/amd_hip_fp8.h>
#include <hip/amd_detail/amd_hip_bf16.h>

__global__ void naive_fp8_mm(const __hip_fp8_e4m3_fnuz* a, const __hip_fp8_e4m3_fnuz* b,
                             const float* as, const float* bs, __hip_bfloat16* c,
                             int m, int n, int k) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= m || col >= n) return;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) {
        float scale = as[row + (i / 128) * m] * bs[col / 128 + (i / 128) * ((n + 127) / 128)];
        acc += (float)a[row + i * m] * (float)b[col + i * n] * scale;
    }
    c[row * n + col] = (__hip_bfloat16)acc;
}

torch::Tensor fp8_mm(torch::Tensor a, torch::Tensor b, torch::Tensor as, torch::Tensor bs,
                     torch::Tensor c) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "fp8_mm: inputs must be on the GPU");
    int m = a.size(0), n = b.size(0), k = a.size(1);
    naive_fp8_mm<<<dim3((m + 15) / 16, (n + 15) / 16), dim3(16, 16), 0, 0>>>(
        (const __hip_fp8_e4m3_fnuz*)a.data_ptr(), (const __hip_fp8_e4m3_fnuz*)b.data_ptr(),
        as.data_ptr<float>(), bs.data_ptr<float>(), (__hip_bfloat16*)c.data_ptr(), m, n, k);
    return c;
}
"""

module = load_inline(
    name="fp8_mm_extension",
    cpp_sources=[CPP_WRAPPER],
    cuda_sources=[CUDA_SRC],
    functions=["fp8_mm"],
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20"],
)


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    return module.fp8_mm(a, b, a_scale, b_scale, c)
