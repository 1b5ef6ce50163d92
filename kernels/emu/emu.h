// Runs weft's kernels on the CPU for tests on machines without a GPU: one std::thread per
// thread of a block, a std::barrier for __syncthreads, blocks one after another, and the
// block's shared memory filled with NaN before each block — so a kernel that reads shared
// memory it did not write shows NaN here instead of passing by luck on a GPU. Sub-group
// shuffles are not emulated: kernels using them (gemv.cu, moe.cu, the norms in weft.cu) are
// tested on the GPU only.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local emu_dim3 threadIdx;
emu_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* emu_barrier;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __shfl_xor_sync(unsigned, float, int) { std::fprintf(stderr, "emu: shuffles are not emulated\n"); std::abort(); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }

// Dynamic shared memory (`extern __shared__ float smem[]` in a kernel names this array).
float smem[1 << 16];

template <class F> void emu_launch(unsigned gx, unsigned gy, unsigned threads, F kernel) {
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            blockIdx = {bx, by, 0};
            std::fill(std::begin(smem), std::end(smem), NAN);
            std::barrier<> bar(threads);
            emu_barrier = &bar;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; t++) ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; kernel(); });
            for (auto& t : ts) t.join();
        }
}
