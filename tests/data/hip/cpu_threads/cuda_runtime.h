// Runs HIP/CUDA kernel source on CPU threads, for tests: one std::thread per GPU thread, one
// block at a time, __syncthreads() a barrier over the block, __shared__ arrays static (shared by
// the block's threads). Enough for kernels that use threadIdx.x, blockIdx.x/y, __shared__ and
// __syncthreads(), such as the portable form of tasks/fp8_gemm/seeds/hip_mfma.py.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline std::barrier<>* ks_block_barrier = nullptr;

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { ks_block_barrier->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

template <class Kernel, class... Args>
void ks_launch(dim3 grid, unsigned threads, Kernel kernel, Args... args) {
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> barrier(threads);
            ks_block_barrier = &barrier;
            std::vector<std::thread> team;
            for (unsigned t = 0; t < threads; ++t)
                team.emplace_back([=] {
                    threadIdx = dim3(t);
                    blockIdx = dim3(bx, by);
                    kernel(args...);
                });
            for (auto& th : team) th.join();
        }
}
