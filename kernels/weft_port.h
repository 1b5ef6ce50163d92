// Portability layer shared by the CUDA (NVRTC) and HIP (hipRTC) builds of weft's kernels.
// Kernels use only block-level shared-memory reductions, so nothing assumes 32-lane warps
// (AMD Instinct wavefronts are 64 lanes).
#pragma once
typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;
// NVRTC and hipRTC compile without the C library headers: no INFINITY macro.
#define WEFT_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Round-to-nearest-even, as PyTorch and the `half` crate do (NaN kept quiet).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

// Sum / max over the block; `sh` holds blockDim.x floats. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}
