// Portability layer shared by the CUDA (NVRTC) and HIP (hipRTC) builds of weft's kernels.
// Kernels use only block-level shared-memory reductions, so nothing assumes 32-lane warps
// (AMD Instinct wavefronts are 64 lanes).
#pragma once
typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;
typedef unsigned long long u64;
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

// The latent cache's values: f32, or bf16 (u16 bits); read and written as f32 (bf16 rounded
// to nearest even when stored).
__device__ __forceinline__ float kv_ld(const float* p) { return *p; }
__device__ __forceinline__ float kv_ld(const u16* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ void kv_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_st(u16* p, float v) { *p = f32_to_bf16(v); }
// Four consecutive values from an address aligned to four of them.
__device__ __forceinline__ float4 kv_ld4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 kv_ld4(const u16* p) {
    const uint2 u = *(const uint2*)p;
    return make_float4(bf16_to_f32((u16)u.x), bf16_to_f32((u16)(u.x >> 16)), bf16_to_f32((u16)u.y), bf16_to_f32((u16)(u.y >> 16)));
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

// Whether the calling block is the last of `n` to get here, counted in the device-wide
// `counter` (the last one resets it when done); its writes before the call are visible to that
// block, and after it that block sees the others' (read what they wrote past L1).
__device__ __forceinline__ bool last_block_of(u32* counter, u32 n) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == n - 1;
    __syncthreads();
    const bool is_last = last;
    if (is_last) __threadfence();
    return is_last;
}

// No NVIDIA inline PTX: a HIP build, or the CPU emulator (kernels/emu, which defines WEFT_EMU).
#if defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__) || defined(WEFT_EMU)
#define WEFT_NO_PTX 1
#endif

// Dynamic shared memory (the launch's byte count), declared as an array of T named `name`.
#ifndef WEFT_DYNAMIC_SHARED
#define WEFT_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

// Sub-group ("warp" on NVIDIA, "wavefront" on AMD) width and butterfly sum. Code that splits
// work across lanes uses WEFT_WARP, never a literal 32.
#if defined(WEFT_EMU)
#define WEFT_WARP emu_warp
__device__ __forceinline__ float lane_xor(float v, int o) { return emu_shfl_xor(v, o); }
__device__ __forceinline__ int lane_xor_int(int v, int o) { return __float_as_int(emu_shfl_xor(__int_as_float(v), o)); }
#elif defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__)
#define WEFT_WARP warpSize
__device__ __forceinline__ float lane_xor(float v, int o) { return __shfl_xor(v, o); }
__device__ __forceinline__ int lane_xor_int(int v, int o) { return __shfl_xor(v, o); }
#else
#define WEFT_WARP 32
__device__ __forceinline__ float lane_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ int lane_xor_int(int v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
#endif

// A 16-byte load of data read once (streamed weights): past L1, so the activations every block
// shares keep it.
#if defined(WEFT_EMU)
__device__ __forceinline__ uint4 ld_stream(const uint4* p) { return *p; }
#elif defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__)
typedef unsigned int weft_u32x4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    weft_u32x4 v = __builtin_nontemporal_load((const weft_u32x4*)p);
    return make_uint4(v.x, v.y, v.z, v.w);
}
#else
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
#endif

// Sum over the sub-group; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WEFT_WARP / 2; o > 0; o >>= 1) v += lane_xor(v, o);
    return v;
}

// OCP fp8 e4m3 ("e4m3fn") to f32: bias 7, subnormals m * 2^-9, 0x7f/0xff NaN, no infinities.
__device__ __forceinline__ float fp8_to_f32(u32 b) {
    u32 e = (b >> 3) & 0xfu, m = b & 7u;
    float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if (e == 15u && m == 7u) v = __uint_as_float(0x7fc00000u);
    return (b & 0x80u) ? -v : v;
}

// Four e4m3 codes (bytes 0..3 of p, in order) to f32. NVIDIA sm_89 and later convert in
// hardware, two codes per instruction (e4m3 -> f16 is exact, f16 -> f32 too): the decode
// kernels stream fp8 weights at close to the rate of bf16 ones instead of being bound by the
// ~8 integer operations per code of fp8_to_f32. Same values, NaN for the NaN codes.
// WEFT_FP8_SOFT (WEFT_CUDA_KERNEL_DEFINES) keeps the integer path, for comparisons.
__device__ __forceinline__ void fp8x4_to_f32(u32 p, float (&f)[4]) {
#if !defined(WEFT_NO_PTX) && !defined(WEFT_FP8_SOFT) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 a, b, c, d;\n\t.reg .b32 h0, h1;\n\tmov.b32 {a, b}, %4;\n\t"
        "cvt.rn.f16x2.e4m3x2 h0, a;\n\tcvt.rn.f16x2.e4m3x2 h1, b;\n\t"
        "mov.b32 {a, b}, h0;\n\tmov.b32 {c, d}, h1;\n\t"
        "cvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\tcvt.f32.f16 %2, c;\n\tcvt.f32.f16 %3, d;\n\t}"
        : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
        : "r"(p));
#else
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = fp8_to_f32((p >> (8 * i)) & 0xffu);
#endif
}

// f32 to e4m3, round to nearest even, saturating at ±448 (what the dummy weights use; the same
// arithmetic as weft_backend::dummy::e4m3 on the host, so both produce identical bytes).
__device__ __forceinline__ u32 f32_to_fp8(float x) {
    u32 s = (__float_as_uint(x) >> 31) ? 0x80u : 0u;
    float a = fabsf(x);
    if (!(a < 448.f)) return s | 0x7eu;
    int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;
    if (e < -6) return s | (u32)rintf(a * 512.f);
    float q = rintf((a / __uint_as_float((u32)(e + 127) << 23) - 1.f) * 8.f);
    if (q >= 8.f) { e += 1; q = 0.f; }
    u32 code = ((u32)(e + 7) << 3) | (u32)q;
    return s | (code > 0x7eu ? 0x7eu : code);
}

// Programmatic dependent launch (Hopper and later). Every kernel starts with WEFT_PDL_ENTRY():
// it waits until the grid before it has finished and its writes are visible. The wait is a
// no-op for a kernel launched the ordinary way; the CUDA backend turns the edges between weft
// kernels of a recorded step graph into programmatic ones (src/pdl.rs), so the next kernel's
// blocks are launched as this one's blocks exit — not after the whole grid has drained and
// flushed — and put their static weights on the way into L2 (weft_prefetch_l2, before the
// wait). Nothing before the wait may read what an earlier kernel wrote or write anything —
// save one case, argued where it is: the decode experts' shared-chunk blocks (moe.cu
// moe_gate_up_body, mma.cu moe_mma_body) read x and write their own rows of h, launched early
// by the routing (WEFT_PDL_TRIGGER below) only when x was complete before the router's wait.
// Variants for comparisons (WEFT_CUDA_KERNEL_DEFINES): WEFT_PDL_EARLY triggers the next grid
// as soon as every block of this one has started (measured slower: the waiting blocks take
// SM slots); WEFT_NO_PREFETCH drops the weight prefetch.
//
// WEFT_TRACE (a kernel variant, for measurements: src/trace.rs): past the wait, thread 0 of every
// block appends (FNV-1a hash of the enclosing function's name, block, %globaltimer) to a device
// buffer. In a chain of kernels each grid passes its wait only once the one before has finished,
// so the first block past it marks where the kernel joined the critical path.
#if defined(WEFT_TRACE) && !defined(WEFT_NO_PTX) && defined(__CUDA_ARCH__)
#define WEFT_TRACE_CAP (1u << 18)
__device__ unsigned long long weft_trace_n;
__device__ unsigned long long weft_trace_buf[2 * WEFT_TRACE_CAP];
__device__ __forceinline__ void weft_trace(const char* f) {
    if (threadIdx.x | threadIdx.y | threadIdx.z) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    u32 h = 2166136261u;
    for (; *f; ++f) h = (h ^ (unsigned char)*f) * 16777619u;
    const unsigned long long i = atomicAdd(&weft_trace_n, 1ull);
    if (i < WEFT_TRACE_CAP) {
        weft_trace_buf[2 * i] = (unsigned long long)h << 32 | (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
        weft_trace_buf[2 * i + 1] = t;
    }
}
#define WEFT_TRACE_HERE() weft_trace(__func__)
#else
#define WEFT_TRACE_HERE() ((void)0)
#endif
#if !defined(WEFT_NO_PTX) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef WEFT_PDL_EARLY
#define WEFT_PDL_ENTRY() do { asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory"); WEFT_TRACE_HERE(); } while (0)
#else
#define WEFT_PDL_ENTRY() do { asm volatile("griddepcontrol.wait;" ::: "memory"); WEFT_TRACE_HERE(); } while (0)
#endif
// Launch the next grid now rather than as this one's blocks exit (every block must reach it or
// exit): for a kernel whose successor has work that does not depend on it (moe.cu: the shared
// experts' gate|up during the router and the routing). A kernel triggering before its own wait
// lets the next one in while the one before it still runs: only where that next one reads
// nothing newer than the grid before this one's wait. WEFT_NO_EARLY_TRIGGER drops it (for
// comparisons).
#ifndef WEFT_NO_EARLY_TRIGGER
#define WEFT_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define WEFT_PDL_TRIGGER() ((void)0)
#endif
// `bytes` from `p` (both multiples of 16) towards L2, by the calling thread, without waiting.
__device__ __forceinline__ void weft_prefetch_l2(const void* p, u32 bytes) {
#ifndef WEFT_NO_PREFETCH
    if (bytes) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
#else
#define WEFT_PDL_ENTRY() WEFT_TRACE_HERE()
#define WEFT_PDL_TRIGGER() ((void)0)
__device__ __forceinline__ void weft_prefetch_l2(const void*, u32) {}
#endif
// cp.async: 16 bytes from global to shared memory without passing through registers (`bytes`
// 16, or 0 to fill zeros; `src` must be a valid address either way), grouped by commit and
// waited for by group (all but the newest N). Without PTX (HIP, the CPU emulator), a plain copy.
#if !defined(WEFT_NO_PTX)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#else
__device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 bytes) { *(uint4*)dst = bytes ? *(const uint4*)src : make_uint4(0u, 0u, 0u, 0u); }
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif

// At most this many bytes per block are prefetched (a block streams its rows once; more would
// only evict the activations from L2). A kernel variant may set it (round 28 compares).
#ifndef WEFT_PREFETCH_MAX
#define WEFT_PREFETCH_MAX (64u * 1024u)
#endif
