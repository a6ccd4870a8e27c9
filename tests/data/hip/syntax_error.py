"""A HIP candidate with a C++ syntax error (a missing semicolon) in its kernel."""

from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "rocm"
KS_HIP_ARCH = "gfx942"

CPP_WRAPPER = "void scale(torch::Tensor x);"

HIP_SRC = """
__global__ void scale_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f
}

void scale(torch::Tensor x) {
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), n);
}
"""

module = load_inline(name="scale", cpp_sources=CPP_WRAPPER, cuda_sources=HIP_SRC,
                     functions=["scale"], extra_cuda_cflags=["-std=c++20"])


def custom_kernel(data):
    module.scale(data[0])
    return data[0]
