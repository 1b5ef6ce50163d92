// Prefill-sized MoE on tensor cores, planned on the device: the routed experts as a grouped GEMM
// over the plan of moe_route_plan (moe.cu), with no host round trip. The plan's tile list cuts
// every active expert's entries into tiles of MG_BM plan rows; block (x, y) multiplies tile x by
// the y-th slice of its expert's weight rows, K in stages of MG_BK columns through shared memory
// (double-buffered: the next stage's global loads are in flight while this one is multiplied;
// cp.async and deeper in the WEFT_MG_ASYNC variant below).
//
// Operands, as every other product of f32 activations here: the activation rows (tokens) are
// the mma's A (m16, row-major), each f32 value as two bf16 parts (its rounding and the rounding's
// error; both multiplied, so results follow f32 activations to ~1e-5); the weight rows are B
// (n8, "col": a weight row is a column of B), bf16 as stored or fp8 e4m3 converted to bf16 exactly
// while staged, its block scale applied in f32 to the partial sums of each scale block. Lane
// (g, t) of a warp holds C rows g and g + 8 (plan rows) at columns 2t, 2t + 1 (weight rows), so
// results leave as float2 stores along an output row.
//
// gate|up (`moe_gemm_gate_up_*`): a block's 128 weight rows are 64 gate rows and their 64 up rows
// (each warp's 64 columns: 32 gate rows, then the same 32 up rows), so SiLU(gate) · up is formed
// in registers and written once, h[plan row, inter] (f32). down (`moe_gemm_down_*`): 128 output
// rows of h · downᵀ into y[entry, hidden], entry = plan row's (token, slot), as the weight-
// streaming kernels write it for moe_combine.
#define MG_BM MOE_TILE_ROWS  // plan rows per tile (moe.cu cuts the plan's tile list by it)
#define MG_BN 128      // weight rows per block
// Columns per stage: 32 (40 KB of shared memory for two stages), or 64 with
// WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_BK=64 (72 KB; moe.rs reads the same setting).
#ifdef WEFT_MG_BK
#define MG_BK WEFT_MG_BK
#else
#define MG_BK 32
#endif
// Activation parts: two (f32-grade) for the rows of tokens the step computes precisely (its
// decode and verification rows, runtime/backend-cuda/src/precision.rs), else the bf16 rounding
// alone (prompt rows: as PyTorch's bf16 grouped_mm, ~1e-3 from f32). A tile without such a
// token runs the one-part body (half the products); in a tile with one, the other rows' second
// part is zeros, so a prompt row's bits do not depend on the tokens it shares a tile with.
// WEFT_MG_ONE_PART takes one part for every tile (a variant for measurements).
#ifdef WEFT_MG_ONE_PART
#define MG_PARTS 1
#else
#define MG_PARTS 2
#endif
#define MG_LD (MG_BK + 8)  // shared row stride in bf16 (≡ 16 bytes mod 128): conflict-free fragment loads
// Per stage and thread: float4s of activations (XQ per row), 16-byte pieces of weight rows
// (WQ per row), each thread taking one column position of rows tid / Q + j · (128 / Q).
#define MG_XQ (MG_BK / 4)
#define MG_WQ (MG_BK / 8)
#define MG_FQ (MG_BK / 16)
#define MG_THREADS 128 // 4 warps: 2 (plan rows) x 2 (weight rows), 32 x 64 each

// Loading (a variant for measurements, WEFT_MG_ASYNC; bf16 weights only, fp8 keeps the register
// path): instead of staging through registers (activations split there, fp8 converted there),
// moe_gemm_split first writes the gate|up operand's two parts as bf16 rows in plan order, the
// gate|up epilogue writes h the same way, and every stage arrives by cp.async, MG_STAGES deep
// (WEFT_MG_STAGES, default 3), with no registers held for loads in flight. moe.rs reads the
// same settings (shared bytes, the split pass, h's format).
#ifdef WEFT_MG_ASYNC
#define MG_ASYNC 1
#else
#define MG_ASYNC 0
#endif
#ifdef WEFT_MG_STAGES
#define MG_STAGES WEFT_MG_STAGES
#else
#define MG_STAGES 3
#endif

// Shared layout of one stage (bf16 units): Xhi [MG_BM][MG_LD], Xlo [MG_BM][MG_LD],
// W [MG_BN][MG_LD]. Two stages (MG_STAGES with cp.async).
#define MG_XH 0
#define MG_XL (MG_BM * MG_LD)
#define MG_W (2 * MG_BM * MG_LD)
#define MG_STAGE_BF16 (2 * MG_BM * MG_LD + MG_BN * MG_LD)

// ldmatrix.x4: four 8×8 blocks of b16 from shared memory in the mma fragment layout (lane g, t
// gets elements 2t, 2t + 1 of row g of block i in r[i]); lane l gives the address of row l % 8
// of block l / 8 (16-byte aligned).
#if !defined(WEFT_NO_PTX)
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void* row) {
    const u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void* row) { emu_ldsm_x4(r, row); }
#else
// AMD: the tensor-core kernels are never launched there (mma.cu).
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void*) { __builtin_trap(); }
#endif

// Four f32 values as their bf16 parts (split_bf16x2 twice).
__device__ __forceinline__ void split_bf16x4(float4 v, uint2& hi, uint2& lo) {
    split_bf16x2(v.x, v.y, hi.x, lo.x);
    split_bf16x2(v.z, v.w, hi.y, lo.y);
}

// Sixteen e4m3 codes to sixteen bf16 (exact), as two 16-byte rows of bf16.
__device__ __forceinline__ void fp8x16_to_bf16(uint4 v, uint4& lo, uint4& hi) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    u32 o[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = fp8x2_to_bf16x2(__byte_perm(w[i], 0u, 0x4140));
        o[2 * i + 1] = fp8x2_to_bf16x2(__byte_perm(w[i], 0u, 0x4342));
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Whether plan row i takes its second activation part in a two-part tile (mode as
// mg_rows_two_parts: 1 every row, 2 rows of tokens whose flag is set; ent: the plan's entries).
__device__ __forceinline__ bool mg_row_two_parts(const u32* ent, u32 i, u32 ek, const u32* flags, u32 mode) { return mode != 2 || flags[ent[i] / ek] != 0; }

// x: f32 activations (gate|up: token rows, gathered by entry; down: h, plan rows), or with
// cp.async the two bf16 parts of each plan row ([plan row][2 · cols]: hi, then lo). out: gate|up
// h (f32 [plan row][inter], or bf16 parts [plan row][2 · inter] with cp.async), down y.
// Two-part tiles (PARTS 2) multiply the second part of flagged tokens' rows only (flags, ek,
// mode as mg_rows_two_parts): the other rows' second part is staged as zeros, adding exact
// zeros to their sums, so a one-part row's result is the same bits in any tile.
template <int FP8, int GATED, int PARTS>
__device__ void moe_gemm_body(ExpertTable T, const u32* plan, u32 maxa, u32 n, const void* x_, void* out_, u32 k, u32 rows, u32 cols, u32 inter, const u32* flags, u32 ek, u32 mode) {
    constexpr bool ASYNC = MG_ASYNC && !FP8;
    const float* x = (const float*)x_;
    float* out = (float*)out_;
    WEFT_DYNAMIC_SHARED(uint4, mg_smem);
    u16* sm = (u16*)mg_smem;
    const u32* tiles = plan + 2 + 2 * maxa + n;
    if (blockIdx.x >= tiles[0]) return;  // whole block: past the plan's tiles
    const u32 a = tiles[1 + 2 * blockIdx.x], i0 = tiles[2 + 2 * blockIdx.x];
    const u32* off = plan + 1 + maxa;
    const u32* ent = plan + 2 + 2 * maxa;
    const u32 i1 = min(i0 + MG_BM, off[a + 1]);
    const WeightRef W = expert_ref(T, plan[1 + a]);
    const u32 tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    const u32 g = lane >> 2, t = lane & 3;
    // gated: this block's inter positions p0..p0+63; else its weight rows r0..r0+127.
    const u32 p0 = blockIdx.y * (MG_BN / 2), r0 = blockIdx.y * MG_BN;

    // Weight row of shared row s, or ~0u past the matrix.
    auto wrow = [&](u32 s) -> u32 {
        if (GATED) {
            u32 p = p0 + 32 * (s / 64) + s % 32;
            return p < inter ? ((s % 64) < 32 ? p : inter + p) : ~0u;
        }
        return r0 + s < rows ? r0 + s : ~0u;
    };
    // This thread's loads per stage (register path): XL float4s of activations (rows
    // tid / MG_XQ + j · 128 / MG_XQ, columns 4 · (tid % MG_XQ)) and WL 16-byte pieces of weight
    // rows (likewise by WQ); the cp.async path copies the same weight pieces.
    constexpr int XL = MG_BM * MG_XQ / MG_THREADS, WQ = FP8 ? MG_FQ : MG_WQ, WL = MG_BN * WQ / MG_THREADS;
    // Whether plan row i takes its second part.
    auto lo_row = [&](u32 i) -> bool { return PARTS == 2 && mg_row_two_parts(ent, i, ek, flags, mode); };
    const float* xp[XL];
    bool xk[XL];
#pragma unroll
    for (int j = 0; j < XL; j++) {
        u32 i = i0 + tid / MG_XQ + (MG_THREADS / MG_XQ) * j;
        xp[j] = !ASYNC && i < i1 ? x + (i64)(GATED ? ent[i] / k : i) * cols + 4 * (tid % MG_XQ) : nullptr;
        xk[j] = !ASYNC && i < i1 && lo_row(i);
    }
    const unsigned char* wp[WL];
#pragma unroll
    for (int j = 0; j < WL; j++) {
        u32 r = wrow(tid / WQ + (MG_THREADS / WQ) * j);
        wp[j] = r == ~0u ? nullptr : (const unsigned char*)W.w + (i64)r * cols * (FP8 ? 1 : 2) + 16 * (tid % WQ);
    }
    float4 xv[XL];
    uint4 wv[WL];
    auto gload = [&](u32 c0) {
#pragma unroll
        for (int j = 0; j < XL; j++) xv[j] = xp[j] ? *(const float4*)(xp[j] + c0) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < WL; j++) wv[j] = wp[j] ? *(const uint4*)(wp[j] + (i64)c0 * (FP8 ? 1 : 2)) : make_uint4(0u, 0u, 0u, 0u);
    };
    auto sstore = [&](u32 buf) {
        u16* st = sm + buf * MG_STAGE_BF16;
#pragma unroll
        for (int j = 0; j < XL; j++) {
            u32 row = tid / MG_XQ + (MG_THREADS / MG_XQ) * j, c = 4 * (tid % MG_XQ);
            uint2 h, l;
            split_bf16x4(xv[j], h, l);
            *(uint2*)(st + MG_XH + row * MG_LD + c) = h;
            if (PARTS == 2) *(uint2*)(st + MG_XL + row * MG_LD + c) = xk[j] ? l : uint2{0u, 0u};
        }
#pragma unroll
        for (int j = 0; j < WL; j++) {
            if (FP8) {
                u32 row = tid / WQ + (MG_THREADS / WQ) * j, c = 16 * (tid % WQ);
                uint4 lo, hi;
                fp8x16_to_bf16(wv[j], lo, hi);
                *(uint4*)(st + MG_W + row * MG_LD + c) = lo;
                *(uint4*)(st + MG_W + row * MG_LD + c + 8) = hi;
            } else {
                u32 row = tid / WQ + (MG_THREADS / WQ) * j, c = 8 * (tid % WQ);
                *(uint4*)(st + MG_W + row * MG_LD + c) = wv[j];
            }
        }
    };

    float acc[2][8][4], part[2][8][4];  // part: fp8's sums within one scale block
    zero_acc(acc);
    if (FP8) zero_acc(part);
    // fp8: the block scale of each of this lane's weight rows for the scale block at column c.
    auto flush = [&](u32 c) {
        if (!FP8) return;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                u32 r = wrow(wn * 64 + nt * 8 + 2 * t + q);
                float s = r == ~0u ? 0.f : W.sc[(i64)(r / W.br) * W.sc_cols + c / W.bc];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    acc[mt][nt][q] += s * part[mt][nt][q];
                    acc[mt][nt][2 + q] += s * part[mt][nt][2 + q];
                    part[mt][nt][q] = 0.f;
                    part[mt][nt][2 + q] = 0.f;
                }
            }
    };

    // One stage of shared memory times this warp's accumulators (fp8: the scale block's partials).
    auto multiply = [&](const u16* st) {
#pragma unroll
        for (int ks = 0; ks < MG_BK; ks += 16) {
            // A (16 plan rows x 16 columns): blocks rows 0-7 | 8-15 at columns 0-7, then at 8-15.
            // B (two n-tiles of 8 weight rows): blocks tile nt at columns 0-7 | 8-15, tile nt + 1.
            u32 af[2][2][4], bfr[8][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int p = 0; p < PARTS; p++)
                    ldsm_x4(af[mt][p], st + (p ? MG_XL : MG_XH) + (wm * 32 + mt * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * MG_LD + ks + 8 * (lane / 16));
#pragma unroll
            for (int nt = 0; nt < 8; nt += 2) {
                u32 r[4];
                ldsm_x4(r, st + MG_W + (wn * 64 + nt * 8 + lane % 8 + 8 * (lane / 16)) * MG_LD + ks + 8 * ((lane / 8) % 2));
                bfr[nt][0] = r[0];
                bfr[nt][1] = r[1];
                bfr[nt + 1][0] = r[2];
                bfr[nt + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    float (&d)[4] = FP8 ? part[mt][nt] : acc[mt][nt];
#pragma unroll
                    for (int p = 0; p < PARTS; p++) mma_bf16_16816(d, af[mt][p][0], af[mt][p][1], af[mt][p][2], af[mt][p][3], bfr[nt][0], bfr[nt][1]);
                }
        }
    };

    const u32 stages = cols / MG_BK;
    if constexpr (ASYNC) {
        // Both activation parts (2 · 64 rows) and the 128 weight rows of a stage, 16 bytes a
        // copy, MG_WQ per row: this thread's copies are at fixed rows and column offsets.
        constexpr int XC = 2 * MG_BM * MG_WQ / MG_THREADS;
        const u16* xs = (const u16*)x_;
        const u16* xq[XC];
        u32 xd[XC];
#pragma unroll
        for (int j = 0; j < XC; j++) {
            u32 q = tid + MG_THREADS * j, part = q / (MG_BM * MG_WQ), rr = (q / MG_WQ) % MG_BM, c = q % MG_WQ;
            u32 i = i0 + rr;
            xq[j] = i < i1 && (part == 0 || lo_row(i)) ? xs + (i64)i * 2 * cols + part * cols + 8 * c : nullptr;  // else zeros
            xd[j] = (part ? MG_XL : MG_XH) + rr * MG_LD + 8 * c;
        }
        auto issue = [&](u32 kt) {
            u16* st = sm + (kt % MG_STAGES) * MG_STAGE_BF16;
            const u32 c0 = kt * MG_BK;
#pragma unroll
            for (int j = 0; j < XC; j++) cp_async16(st + xd[j], xq[j] ? xq[j] + c0 : xs, xq[j] ? 16u : 0u);
#pragma unroll
            for (int j = 0; j < WL; j++) cp_async16(st + MG_W + (tid / WQ + (MG_THREADS / WQ) * j) * MG_LD + 8 * (tid % WQ), wp[j] ? wp[j] + (i64)c0 * 2 : (const unsigned char*)W.w, wp[j] ? 16u : 0u);
        };
#pragma unroll
        for (int s0 = 0; s0 < MG_STAGES - 1; s0++) {
            if ((u32)s0 < stages) issue(s0);
            cp_async_commit();
        }
        for (u32 kt = 0; kt < stages; kt++) {
            cp_async_wait<MG_STAGES - 2>();
            __syncthreads();  // stage kt landed for every thread; stage kt - 1's buffer is free
            if (kt + MG_STAGES - 1 < stages) issue(kt + MG_STAGES - 1);
            cp_async_commit();
            multiply(sm + (kt % MG_STAGES) * MG_STAGE_BF16);
        }
    } else {
        gload(0);
        sstore(0);
        __syncthreads();
        for (u32 kt = 0; kt < stages; kt++) {
            const u32 buf = kt & 1;
            if (kt + 1 < stages) gload((kt + 1) * MG_BK);
            multiply(sm + buf * MG_STAGE_BF16);
            if (FP8 && ((kt + 1) * MG_BK % W.bc == 0 || kt + 1 == stages)) flush(kt * MG_BK);
            if (kt + 1 < stages) sstore(buf ^ 1);
            __syncthreads();
        }
    }

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h8 = 0; h8 < 2; h8++) {
            const u32 i = i0 + wm * 32 + mt * 16 + g + 8 * h8;
            if (i >= i1) continue;
            if (GATED) {
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    u32 p = p0 + wn * 32 + nt * 8 + 2 * t;
                    if (p >= inter) continue;
                    float g0 = acc[mt][nt][2 * h8], g1 = acc[mt][nt][2 * h8 + 1];
                    float u0 = acc[mt][nt + 4][2 * h8], u1 = acc[mt][nt + 4][2 * h8 + 1];
                    float v0 = g0 / (1.0f + expf(-g0)) * u0, v1 = g1 / (1.0f + expf(-g1)) * u1;
                    if (ASYNC) {
                        u16* ho = (u16*)out_ + (i64)i * 2 * inter + p;
                        u32 hi, lo;
                        split_bf16x2(v0, v1, hi, lo);
                        *(u32*)ho = hi;
                        *(u32*)(ho + inter) = lo;
                    } else {
                        *(float2*)(out + (i64)i * inter + p) = make_float2(v0, v1);
                    }
                }
            } else {
                const u32 e = ent[i];
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    u32 r = r0 + wn * 64 + nt * 8 + 2 * t;
                    if (r < rows) *(float2*)(out + (i64)e * rows + r) = make_float2(acc[mt][nt][2 * h8], acc[mt][nt][2 * h8 + 1]);
                }
            }
        }
}

// Blocks per SM the compiler must fit (registers); a variant for comparisons:
// WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_MINB=4.
#ifdef WEFT_MG_MINB
#define MG_BOUNDS __launch_bounds__(MG_THREADS, WEFT_MG_MINB)
#else
#define MG_BOUNDS __launch_bounds__(MG_THREADS)
#endif

// Whether plan rows i0..i1 (one block's) take two activation parts: mode 0 never, 1 always, 2
// where they hold an entry of a token whose flag is set (every thread reads the rows' entries:
// no barrier needed). `ek`: entries per token.
__device__ __forceinline__ bool mg_rows_two_parts(const u32* ent, u32 i0, u32 i1, u32 ek, const u32* flags, u32 mode) {
    if (MG_PARTS == 1 || mode == 0) return false;
    if (mode == 1) return true;
    for (u32 i = i0; i < i1; i++)
        if (flags[ent[i] / ek]) return true;
    return false;
}

// Whether block x's tile (at most MG_BM rows) takes two activation parts (mg_rows_two_parts).
__device__ __forceinline__ bool mg_tile_two_parts(const u32* plan, u32 maxa, u32 n, u32 ek, const u32* flags, u32 mode) {
    const u32* tiles = plan + 2 + 2 * maxa + n;
    if (blockIdx.x >= tiles[0]) return false;
    const u32 a = tiles[1 + 2 * blockIdx.x], i0 = tiles[2 + 2 * blockIdx.x];
    return mg_rows_two_parts(plan + 2 + 2 * maxa, i0, min(i0 + MG_BM, plan[1 + maxa + a + 1]), ek, flags, mode);
}

template <int FP8, int GATED>
__device__ __forceinline__ void moe_gemm_tile(ExpertTable T, const u32* plan, u32 maxa, u32 n, const void* x, void* out, u32 k, u32 rows, u32 cols, u32 inter, u32 ek, const u32* flags, u32 mode) {
    if (mg_tile_two_parts(plan, maxa, n, ek, flags, mode)) moe_gemm_body<FP8, GATED, 2>(T, plan, maxa, n, x, out, k, rows, cols, inter, flags, ek, mode);
    else moe_gemm_body<FP8, GATED, 1>(T, plan, maxa, n, x, out, k, rows, cols, inter, flags, ek, mode);
}

// gate|up: x [tokens, hidden] → h [plan rows, inter]; grid (tile bound, inter / 64).
// down: h [plan rows, inter] → y [entries, hidden]; grid (tile bound, hidden / 128).
// k: entries per token; flags, mode: which tiles take two activation parts (mg_tile_two_parts).
// (With WEFT_MG_ASYNC the bf16 entries take and give the two-part rows described above.)
extern "C" __global__ void MG_BOUNDS moe_gemm_gate_up_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* x, void* h, u32 k, u32 hidden, u32 inter, const u32* flags, u32 mode) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_gemm_tile<0, 1>(Tb, plan, maxa, n, x, h, k, 2 * inter, hidden, inter, k, flags, mode);
}
extern "C" __global__ void MG_BOUNDS moe_gemm_gate_up_fp8(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, u32 n, const void* x, void* h, u32 k, u32 hidden, u32 inter, const u32* flags, u32 mode) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_gemm_tile<1, 1>(Tb, plan, maxa, n, x, h, k, 2 * inter, hidden, inter, k, flags, mode);
}
extern "C" __global__ void MG_BOUNDS moe_gemm_down_bf16(const u64* w, const u32* plan, u32 maxa, u32 n, const void* h, void* y, u32 hidden, u32 inter, u32 k, const u32* flags, u32 mode) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_gemm_tile<0, 0>(Tb, plan, maxa, n, h, y, 0, hidden, inter, inter, k, flags, mode);
}
extern "C" __global__ void MG_BOUNDS moe_gemm_down_fp8(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, u32 n, const void* h, void* y, u32 hidden, u32 inter, u32 k, const u32* flags, u32 mode) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_gemm_tile<1, 0>(Tb, plan, maxa, n, h, y, 0, hidden, inter, inter, k, flags, mode);
}

// One f32 row of `cols` values as its bf16 parts, o = (hi [cols], lo [cols]), by the block's
// threads (float4 steps).
__device__ __forceinline__ void split_row_parts(const float* xr, u16* o, u32 cols) {
    for (u32 c = 4 * threadIdx.x; c < cols; c += 4 * blockDim.x) {
        uint2 h, l;
        split_bf16x4(*(const float4*)(xr + c), h, l);
        *(uint2*)(o + c) = h;
        *(uint2*)(o + cols + c) = l;
    }
}

// With WEFT_MG_ASYNC: the gate|up operand as two bf16 parts per plan row, xs[i] = (hi, lo) of
// x[token of entry i] ([plan row][2 · cols]). One block per plan row (grid n), rows past the
// plan's entries exit.
extern "C" __global__ void moe_gemm_split(const u32* plan, u32 maxa, const float* x, u32 k, u32 cols, u16* xs) { WEFT_PDL_ENTRY();
    const u32 i = blockIdx.x;
    if (i >= plan[1 + maxa + plan[0]]) return;
    split_row_parts(x + (i64)(plan[2 + 2 * maxa + i] / k) * cols, xs + (i64)i * 2 * cols, cols);
}
