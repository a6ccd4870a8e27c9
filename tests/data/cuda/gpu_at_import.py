"""A CUDA candidate that asks for the GPU at import, before its load_inline call: without a
GPU its compile item cannot get the source and skips, saying why."""

import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"

SMS = torch.cuda.get_device_properties(0).multi_processor_count
module = load_inline(name="ks_test_cuda_gpu_at_import", cpp_sources=[""],
                     cuda_sources=["__global__ void k() {}"], no_implicit_headers=True)


def custom_kernel(data):
    return data[4]
