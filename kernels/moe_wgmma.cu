// Prefill-sized MoE on Hopper's warpgroup tensor cores (`wgmma.mma_async`, sm_90a only): the
// grouped GEMM of moe_gemm.cu for bf16 experts — same plan, tiles and grids, activation parts
// per block's rows (mg_rows_two_parts) — with a block of 4 warps (one warpgroup) multiplying its
// 64 plan rows by 128 weight rows as m64n128k16 products, both operands read by the tensor cores from
// shared memory through matrix descriptors. Every operand arrives by cp.async, WG_STAGES stages
// of 64 columns deep, so no register holds a load in flight: the weight rows (B) as stored, the
// activations (A) as bf16 parts written beforehand — moe_wg_split's (hi, lo) rows per token for
// gate|up (gathered by entry), and for down the parts of h that the gate|up epilogue writes.
// Each operand row of a stage is one 128-byte line in the 128-byte swizzle (16-byte chunk c of
// row r at chunk c ^ (r % 8); stage bases 1024-aligned), which the descriptors name. Accumulator
// layout per warp w: lane (g, t) holds rows 16w + g, 16w + g + 8 at columns 8j + 2t, 8j + 2t + 1
// in d[4j..4j + 3] (as mma.sync's C, repeated over j).
//
// gate|up: shared weight rows 0-63 are the block's 64 gate rows, 64-127 their up rows, so
// SiLU(gate) · up pairs d[4j..] with d[4(j + 8)..]; h leaves as bf16 parts [plan row][2 · inter]
// (hi, then lo). down: 128 output rows into y[entry, hidden] (f32) as moe_gemm_down.
// The moe_wg2_* entries run two warpgroups per block over two consecutive 64-row tiles of one
// expert, sharing each stage's 128 weight rows (moe_wg_body, WGS = 2).
// The host takes this path on sm_90a for bf16 experts whose hidden and intermediate sizes are
// multiples of 64 (runtime/backend-cuda/src/moe.rs; `WEFT_CUDA_WGMMA=0` keeps moe_gemm.cu's).
#define WG_BK 64
#define WG_B_BYTES (MG_BN * 128)  // one stage's weights: 128 rows of 64 bf16
#define WG_A_BYTES (MG_BM * 128)  // one stage's activation part: 64 rows of 64 bf16
// One stage of a block of WGS warpgroups (64 plan rows each): the weights and PARTS activation
// parts of its rows (multiples of 1024 bytes). One-part launches (mode 0) ask for one-part
// stages only (WGS 1: 24 KiB, so three blocks fit an SM).
#define WG_STAGE_BYTES(PARTS, WGS) (WG_B_BYTES + (PARTS) * (WGS) * WG_A_BYTES)
#ifdef WEFT_WG_STAGES
#define WG_STAGES WEFT_WG_STAGES
#else
#define WG_STAGES 3
#endif
// wgmma groups a warpgroup leaves in flight while it loads the next stage (WEFT_WG_INFLIGHT, 0 or
// 1): with 1 the tensor cores work on stage kt while the block waits for stage kt + 1, and loads
// run WG_STAGES - 2 stages ahead instead of WG_STAGES - 1 (a stage is refilled only after the
// products that read it are done).
#ifdef WEFT_WG_INFLIGHT
#define WG_INFLIGHT WEFT_WG_INFLIGHT
#else
#define WG_INFLIGHT 0
#endif
#define WG_AHEAD (WG_STAGES - 1 - WG_INFLIGHT)
// Dynamic shared bytes a block asks for: the stages and room to align them to 1024 bytes.
#define WG_SMEM_BYTES(PARTS, WGS) (WG_STAGES * WG_STAGE_BYTES(PARTS, WGS) + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(WEFT_NO_PTX)
// A K-major operand of 8-row groups 1024 bytes apart, 128-byte swizzle (descriptor bits: start
// address / 16 at 0, leading offset 1 (unused when swizzled) at 16, stride 1024 / 16 at 32,
// layout 1 = 128-byte swizzle at 62).
__device__ __forceinline__ u64 wg_desc(const void* p) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    return (u64)((a & 0x3ffffu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Shared memory written by this thread (cp.async, stores) visible to the async proxy wgmma reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The shared offset of p rounded up to 1024 bytes, as a generic pointer.
__device__ __forceinline__ unsigned char* wg_align1024(void* p) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    return (unsigned char*)p + (((a + 1023u) & ~1023u) - a);
}
// d (64 rows x 128 columns) += A (64 rows x 16 at da) x B (128 rows x 16 at db), both K-major.
__device__ __forceinline__ void wgmma_n128_ss(float (&d)[64], u64 da, u64 db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db));
}
#define WEFT_HAS_WGMMA 1
#elif defined(WEFT_EMU)
// The CPU emulator (kernels/emu/emu.h): a descriptor is the operand's address; each lane
// computes its outputs from the swizzled rows in shared memory.
__device__ __forceinline__ u64 wg_desc(const void* p) { return (u64)(uintptr_t)p; }
__device__ __forceinline__ void wg_fence() {}
__device__ __forceinline__ void wg_commit() {}
template <int N>
__device__ __forceinline__ void wg_wait() {}
__device__ __forceinline__ void fence_async_shared() {}
__device__ __forceinline__ unsigned char* wg_align1024(void* p) { return (unsigned char*)(((uintptr_t)p + 1023) & ~(uintptr_t)1023); }
__device__ __forceinline__ void wgmma_n128_ss(float (&d)[64], u64 da, u64 db) { emu_wgmma_ss<128>(d, da, db, 0, 0); }
#define WEFT_HAS_WGMMA 1
#else
// Other targets (sm_80/89/100/120, AMD): no wgmma; the host never launches these kernels there.
__device__ __forceinline__ u64 wg_desc(const void*) { return 0; }
__device__ __forceinline__ void wg_fence() {}
__device__ __forceinline__ void wg_commit() {}
template <int N>
__device__ __forceinline__ void wg_wait() {}
__device__ __forceinline__ void fence_async_shared() {}
__device__ __forceinline__ unsigned char* wg_align1024(void* p) { return (unsigned char*)p; }
#if defined(WEFT_NO_PTX)
#define WG_TRAP() __builtin_trap()
#else
#define WG_TRAP() __trap()
#endif
__device__ __forceinline__ void wgmma_n128_ss(float (&)[64], u64, u64) { WG_TRAP(); }
#endif

// Plan rows i0..i1 (of active expert a) x weight slice `slice`, bf16 weights. xs: bf16 parts, [token][2 · cols] for
// gate|up (row of plan row i: its entry's token, ent[i] / k), [plan row][2 · cols] for down;
// out: h as bf16 parts [plan row][2 · inter] (gate|up), y f32 [entry][rows] (down). Other
// arguments as moe_gemm_body. WGS = 2: a block of two warpgroups takes two consecutive 64-row
// plan tiles of one expert (the even-numbered tile of the expert's and the one after; blocks of
// odd-numbered tiles exit), warpgroup w the rows 64w.., both reading each stage's weights — half
// the weight loads per product.
template <int GATED, int PARTS, int WGS>
__device__ void moe_wg_body(const u64* w, const u32* plan, u32 maxa, const u16* xs, void* out, u32 k, u32 rows, u32 cols, u32 inter, const u32* flags, u32 ek, u32 mode, u32 i0, u32 i1, u32 a, u32 slice) {
    constexpr u32 T = 128 * WGS, STAGE = WG_STAGE_BYTES(PARTS, WGS), PART = WGS * WG_A_BYTES;
    WEFT_DYNAMIC_SHARED(uint4, wg_smem);
    unsigned char* sm = wg_align1024(wg_smem);
    const u32* ent = plan + 2 + 2 * maxa;
    const u16* W = (const u16*)w[plan[1 + a]];
    const u32 tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane >> 2, t = lane & 3;
    const u32 wg = warp / 4, wr = warp % 4;  // warpgroup, warp within it
    const u32 p0 = slice * (MG_BN / 2), r0 = slice * MG_BN;

    // This thread copies 16-byte chunk c = tid % 8 of shared rows tid / 8 + (T / 8)j (weights:
    // 128 rows, j < 1024 / T; each activation part: 64 · WGS rows, j < 4); a row's swizzle
    // (row % 8 = (tid / 8) % 8) puts it at chunk c ^ (row % 8). Rows past the matrix or the
    // tile, and the second part of rows that take one, are zero-filled.
    constexpr int WJ = 1024 / T;
    const u32 wc = tid % 8, sw = (wc ^ ((tid / 8) % 8)) * 16;
    const u16* wp[WJ];
#pragma unroll
    for (int j = 0; j < WJ; j++) {
        const u32 s = tid / 8 + (T / 8) * j;
        u32 r;
        if (GATED) r = s < 64 ? (p0 + s < inter ? p0 + s : ~0u) : (p0 + s - 64 < inter ? inter + p0 + s - 64 : ~0u);
        else r = r0 + s < rows ? r0 + s : ~0u;
        wp[j] = r == ~0u ? nullptr : W + (i64)r * cols + 8 * wc;
    }
    const u16* xp[4];
    bool xk[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const u32 i = i0 + tid / 8 + (T / 8) * j;
        xp[j] = i < i1 ? xs + (i64)(GATED ? ent[i] / k : i) * 2 * cols + 8 * wc : nullptr;
        xk[j] = i < i1 && PARTS == 2 && mg_row_two_parts(ent, i, ek, flags, mode);
    }
    auto issue = [&](u32 kt) {
        unsigned char* b = sm + (kt % WG_STAGES) * STAGE;
        const u32 c0 = kt * WG_BK;
#pragma unroll
        for (int j = 0; j < WJ; j++) cp_async16(b + (tid / 8 + (T / 8) * j) * 128 + sw, wp[j] ? wp[j] + c0 : W, wp[j] ? 16u : 0u);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            cp_async16(b + WG_B_BYTES + (tid / 8 + (T / 8) * j) * 128 + sw, xp[j] ? xp[j] + c0 : xs, xp[j] ? 16u : 0u);
            if (PARTS == 2) cp_async16(b + WG_B_BYTES + PART + (tid / 8 + (T / 8) * j) * 128 + sw, xk[j] ? xp[j] + cols + c0 : xs, xk[j] ? 16u : 0u);
        }
    };

    // A warpgroup whose 64 rows are all past the tile (the second of a pair on an expert's last,
    // short tile) loads its share but multiplies nothing.
    const bool live = i0 + 64 * wg < i1;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    const u32 stages = cols / WG_BK;
#pragma unroll
    for (int s0 = 0; s0 < WG_AHEAD; s0++) {
        if ((u32)s0 < stages) issue(s0);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < stages; kt++) {
        cp_async_wait<WG_AHEAD - 1>();
        fence_async_shared();
        // Stage kt landed for every thread; every wgmma of stage kt - 1 - WG_INFLIGHT is done,
        // so its stage, (kt + WG_AHEAD) % WG_STAGES, may be refilled.
        __syncthreads();
        if (kt + WG_AHEAD < stages) issue(kt + WG_AHEAD);
        cp_async_commit();
        if (!live) continue;
        const unsigned char* st = sm + (kt % WG_STAGES) * STAGE;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < WG_BK / 16; ks++)
#pragma unroll
            for (int p = 0; p < PARTS; p++) wgmma_n128_ss(acc, wg_desc(st + WG_B_BYTES + p * PART + wg * WG_A_BYTES + 32 * ks), wg_desc(st + 32 * ks));
        wg_commit();
        wg_wait<WG_INFLIGHT>();
    }
    if (!live) return;
    wg_wait<0>();

#pragma unroll
    for (int h8 = 0; h8 < 2; h8++) {
        const u32 i = i0 + 64 * wg + wr * 16 + g + 8 * h8;
        if (i >= i1) continue;
        if (GATED) {
            u16* ho = (u16*)out + (i64)i * 2 * inter;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const u32 p = p0 + 8 * j + 2 * t;
                if (p >= inter) continue;
                const float g0 = acc[4 * j + 2 * h8], g1 = acc[4 * j + 2 * h8 + 1];
                const float u0 = acc[4 * (j + 8) + 2 * h8], u1 = acc[4 * (j + 8) + 2 * h8 + 1];
                u32 hi, lo;
                split_bf16x2(g0 / (1.0f + expf(-g0)) * u0, g1 / (1.0f + expf(-g1)) * u1, hi, lo);
                *(u32*)(ho + p) = hi;
                if (mode != 0) *(u32*)(ho + inter + p) = lo;  // mode 0: down reads no second part
            }
        } else {
            float* y = (float*)out;
            const u32 e = ent[i];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const u32 r = r0 + 8 * j + 2 * t;
                if (r < rows) *(float2*)(y + (i64)e * rows + r) = make_float2(acc[4 * j + 2 * h8], acc[4 * j + 2 * h8 + 1]);
            }
        }
    }
}

// order 0: block (x, y) = (tile, weight slice); order 1: (slice, tile), so a tile's slices run
// together and read its activation rows from L2 (down's h, [plan rows][2 · inter], outgrows L2
// at a few thousand tokens and would be read again from memory for every slice).
template <int GATED, int WGS>
__device__ __forceinline__ void moe_wg_tile(const u64* w, const u32* plan, u32 maxa, u32 n, const void* x, void* out, u32 k, u32 rows, u32 cols, u32 inter, u32 ek, const u32* flags, u32 mode, u32 order) {
    const u32* tiles = plan + 2 + 2 * maxa + n;
    const u32 tile = order ? blockIdx.y : blockIdx.x, slice = order ? blockIdx.x : blockIdx.y;
    if (tile >= tiles[0]) return;  // whole block: past the plan's tiles
    const u32 a = tiles[1 + 2 * tile], i0 = tiles[2 + 2 * tile], off = plan[1 + maxa + a];
    if (WGS == 2 && (i0 - off) / MG_BM % 2) return;  // the pair's second tile: its first's block takes it
    const u32 i1 = min(i0 + 64 * WGS, plan[1 + maxa + a + 1]);
    if (mg_rows_two_parts(plan + 2 + 2 * maxa, i0, i1, ek, flags, mode)) moe_wg_body<GATED, 2, WGS>(w, plan, maxa, (const u16*)x, out, k, rows, cols, inter, flags, ek, mode, i0, i1, a, slice);
    else moe_wg_body<GATED, 1, WGS>(w, plan, maxa, (const u16*)x, out, k, rows, cols, inter, flags, ek, mode, i0, i1, a, slice);
}

// As moe_gemm_gate_up_bf16 / moe_gemm_down_bf16 (same grids, or with order 1 their transpose,
// moe_wg_tile; dynamic shared size WG_SMEM_BYTES(1, 1) for mode 0, WG_SMEM_BYTES(2, 1)
// otherwise), over bf16 parts: xs from moe_wg_split ([tokens][2 · hidden]), h as gate|up writes it ([plan rows][2 · inter]).
extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_wg_gate_up_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* xs, void* h, u32 k, u32 hidden, u32 inter, const u32* flags, u32 mode, u32 order) { WEFT_PDL_ENTRY();
    moe_wg_tile<1, 1>(w, plan, maxa, n, xs, h, k, 2 * inter, hidden, inter, k, flags, mode, order);
}
extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_wg_down_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* h, void* y, u32 hidden, u32 inter, u32 k, const u32* flags, u32 mode, u32 order) { WEFT_PDL_ENTRY();
    moe_wg_tile<0, 1>(w, plan, maxa, n, h, y, 0, hidden, inter, inter, k, flags, mode, order);
}
// Two warpgroups (256 threads) per block over tile pairs, same grids and arguments; shared size
// WG_SMEM_BYTES(parts, 2).
extern "C" __global__ void __launch_bounds__(2 * MG_THREADS, 2) moe_wg2_gate_up_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* xs, void* h, u32 k, u32 hidden, u32 inter, const u32* flags, u32 mode, u32 order) { WEFT_PDL_ENTRY();
    moe_wg_tile<1, 2>(w, plan, maxa, n, xs, h, k, 2 * inter, hidden, inter, k, flags, mode, order);
}
extern "C" __global__ void __launch_bounds__(2 * MG_THREADS, 2) moe_wg2_down_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* h, void* y, u32 hidden, u32 inter, u32 k, const u32* flags, u32 mode, u32 order) { WEFT_PDL_ENTRY();
    moe_wg_tile<0, 2>(w, plan, maxa, n, h, y, 0, hidden, inter, inter, k, flags, mode, order);
}

// x [tokens, cols] (f32) as bf16 parts xs [tokens][2 · cols]: the rounding, then what it lost.
// Grid (tokens), 128 threads.
extern "C" __global__ void moe_wg_split(const float* x, u32 cols, u16* xs) { WEFT_PDL_ENTRY();
    split_row_parts(x + (i64)blockIdx.x * cols, xs + (i64)blockIdx.x * 2 * cols, cols);
}
