// Weight-streaming products on tensor cores for a few to 64 activation rows (`mma.sync`
// m16n8k16, bf16 inputs, f32 accumulation; NVIDIA sm_80 and later): MoE experts serving
// several tokens each (same inputs, plan and outputs as moe_*_t8 in moe.cu) and dense linears
// (as gemv_* in gemv.cu). Each f32 activation goes in as two bf16 parts (its rounding and the
// rounding's error), so results track the f32-activation kernels to ~1e-5 rather than bf16's
// ~1e-3. The CUDA-core kernels re-read every activation once per weight row;
// here a sub-group multiplies 32 weight rows by 8–32 activation rows per pass, so activations
// cost at most as much traffic as the weights.
//
// Fragment layout. For an m16n8k16 product, lane (g = lane/4, t = lane%4) holds A[g][2t..2t+1],
// A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9] and B[2t..2t+1][g], B[2t+8..2t+9][g].
// Which 16 columns of the weights make up one k16 step is ours to choose, as long as A and B
// agree: lane t loads V consecutive columns (one 16-byte load of a weight row: V = 8 bf16 or 16
// fp8) starting at column V·t of a 4V-wide chunk, and its values 4j..4j+3 play the roles of
// logical columns 2t, 2t+1, 2t+8, 2t+9 of the chunk's j-th k16 step. Every weight byte is then
// read with 16-byte loads and every activation with float4 loads.
//
// fp8 e4m3 weights become bf16 exactly (3 mantissa bits fit in 7); the block scale is applied
// to the partial sum of each 4V-column chunk (one scale per 16-row tile and chunk). The e4m3
// NaN code (0x7f) is not reproduced (checkpoints do not contain it).
#define MMA_ROWS 16
#define MMA_TOKENS 8

#if !defined(WEFT_NO_PTX)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// (lo, hi) to a bf16 pair, round to nearest even; lo in the low half.
__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#define WEFT_HAS_MMA 1
#elif defined(WEFT_EMU)
// The CPU emulator: mma.sync by the warp's lanes exchanging fragments (kernels/emu/emu.h).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { emu_mma_bf16_16816(d, a0, a1, a2, a3, b0, b1); }
__device__ __forceinline__ u32 bf16x2(float lo, float hi) { return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16); }
#define WEFT_HAS_MMA 1
#else
// AMD: no mma.sync. The host never selects these kernels on a HIP
// device (the CUDA-core kernels serve every batch there); the bodies only keep the sources
// compiling.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], u32, u32, u32, u32, u32, u32) { __builtin_trap(); }
__device__ __forceinline__ u32 bf16x2(float lo, float hi) { return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16); }
#endif

// x to a bf16 pair hi (round to nearest) and the bf16 pair of what rounding lost, lo.
__device__ __forceinline__ void split_bf16x2(float x, float y, u32& hi, u32& lo) {
    hi = bf16x2(x, y);
    lo = bf16x2(x - __uint_as_float(hi << 16), y - __uint_as_float(hi & 0xffff0000u));
}

template <int Q, int NTL>
__device__ __forceinline__ void zero_acc(float (&acc)[Q][NTL][4]) {
#pragma unroll
    for (int q = 0; q < Q; q++)
#pragma unroll
        for (int j = 0; j < NTL; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[q][j][i] = 0.f;
}

// Two e4m3 codes (bits 0..7 and 16..23 of x) to a bf16 pair, exactly.
__device__ __forceinline__ u32 fp8x2_to_bf16x2(u32 x) {
    u32 mag = x & 0x007f007fu;
    u32 r = (mag << 4) + 0x3c003c00u;  // exponent rebias 7 -> 127 for normal codes
    if ((mag & 0x78u) == 0u || (mag & 0x780000u) == 0u)  // zero or subnormal: the exact way
        r = (__float_as_uint(fp8_to_f32(x & 0x7fu)) >> 16) | (__float_as_uint(fp8_to_f32((x >> 16) & 0x7fu)) & 0xffff0000u);
    return r | ((x & 0x00800080u) << 8);
}

// acc[q][j] = rows rb[q]..rb[q]+15 of W (rows of `cols` columns) times NTL·8 activation rows,
// over columns [c_begin, c_end) (whole chunks; fragment layout above). This lane supplies token
// column g of each n-tile j: x row `xrow[j]`, or zeros when j·8 + g >= nt.
template <int FP8, int NTL>
__device__ __forceinline__ void mma_rows(WeightRef W, const u32 (&rb)[2], u32 cols, u32 c_begin, u32 c_end, const float* x, i64 xstride, const u32 (&xrow)[NTL], u32 nt, float (&acc)[2][NTL][4]) {
    constexpr int V = FP8 ? 16 : 8;  // columns per lane per chunk (one 16-byte weight load)
    constexpr int CH = 4 * V;        // columns per chunk
    constexpr int U = 2;             // chunks in flight
    const u32 lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const unsigned char* rowp[2][2];
    const float* srow[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
#pragma unroll
        for (int h = 0; h < 2; h++) rowp[q][h] = (const unsigned char*)W.w + (i64)(rb[q] + g + 8 * h) * cols * (FP8 ? 1 : 2);
        srow[q] = FP8 ? W.sc + (i64)(rb[q] / W.br) * W.sc_cols : 0;
    }
    const float* xp[NTL];
    bool xok[NTL];
#pragma unroll
    for (int j = 0; j < NTL; j++) {
        xok[j] = j * MMA_TOKENS + g < nt;
        xp[j] = x + (i64)(xok[j] ? xrow[j] : 0) * xstride;
    }
    zero_acc(acc);
    for (u32 c0 = c_begin; c0 < c_end; c0 += U * CH) {
        uint4 a[U][2][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u32 c = c0 + u * CH + V * t;
#pragma unroll
            for (int q = 0; q < 2; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) a[u][q][h] = c < c_end ? ld_stream((const uint4*)(rowp[q][h] + (i64)c * (FP8 ? 1 : 2))) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u32 c = c0 + u * CH + V * t;
            if (c0 + u * CH >= c_end) break;
            float part[2][NTL][4];
            if (FP8) zero_acc(part);
#pragma unroll
            for (int s = 0; s < V / 4; s++) {
                // k16 step s: this lane's activations 4s..4s+3 of each token column, each pair
                // split into a bf16 pair and the bf16 pair of its rounding error (hi + lo carries
                // 16 mantissa bits: products then match f32 activations to ~1e-5, which greedy
                // decoding needs when verify rows and one-token steps take different kernels).
                u32 bh[NTL][2], bl[NTL][2];
#pragma unroll
                for (int j = 0; j < NTL; j++) {
                    float4 v = xok[j] ? *(const float4*)(xp[j] + c + 4 * s) : make_float4(0.f, 0.f, 0.f, 0.f);
                    split_bf16x2(v.x, v.y, bh[j][0], bl[j][0]);
                    split_bf16x2(v.z, v.w, bh[j][1], bl[j][1]);
                }
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    // This lane's weights 4s..4s+3 of rows g (lo) and g+8 (hi).
                    const u32 lo[4] = {a[u][q][0].x, a[u][q][0].y, a[u][q][0].z, a[u][q][0].w};
                    const u32 hi[4] = {a[u][q][1].x, a[u][q][1].y, a[u][q][1].z, a[u][q][1].w};
                    u32 a0, a1, a2, a3;
                    if (FP8) {
                        a0 = fp8x2_to_bf16x2(__byte_perm(lo[s], 0u, 0x4140));
                        a2 = fp8x2_to_bf16x2(__byte_perm(lo[s], 0u, 0x4342));
                        a1 = fp8x2_to_bf16x2(__byte_perm(hi[s], 0u, 0x4140));
                        a3 = fp8x2_to_bf16x2(__byte_perm(hi[s], 0u, 0x4342));
                    } else {
                        a0 = lo[2 * s];
                        a2 = lo[2 * s + 1];
                        a1 = hi[2 * s];
                        a3 = hi[2 * s + 1];
                    }
#pragma unroll
                    for (int j = 0; j < NTL; j++) {
                        float (&d)[4] = FP8 ? part[q][j] : acc[q][j];
                        mma_bf16_16816(d, a0, a1, a2, a3, bh[j][0], bh[j][1]);
                        mma_bf16_16816(d, a0, a1, a2, a3, bl[j][0], bl[j][1]);
                    }
                }
            }
            if (FP8) {
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    float sc = srow[q][(c0 + u * CH) / W.bc];
#pragma unroll
                    for (int j = 0; j < NTL; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[q][j][i] += sc * part[q][j][i];
                }
            }
        }
    }
}

// Entries [i0, i0 + nt) of active expert `a`, NTL token tiles: the gate tile and the up tile of
// inter rows r0..r0+15, SiLU(gate) · up into h.
template <int FP8, int NTL>
__device__ __forceinline__ void mma_gate_up_pass(WeightRef W, const u32* ent, u32 i0, u32 nt, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 r0) {
    const u32 lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    u32 tok[NTL];
#pragma unroll
    for (int j = 0; j < NTL; j++) tok[j] = j * MMA_TOKENS + g < nt ? ent[i0 + j * MMA_TOKENS + g] / k : 0;
    float acc[2][NTL][4];
    u32 rb[2] = {r0, inter + r0};
    mma_rows<FP8, NTL>(W, rb, hidden, 0, hidden, x, hidden, tok, nt, acc);
#pragma unroll
    for (int j = 0; j < NTL; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 n = j * MMA_TOKENS + 2 * t + (i & 1), r = r0 + g + 8 * (i >> 1);
            float gt = acc[0][j][i], up = acc[1][j][i];
            if (n < nt) h[(i64)ent[i0 + n] * inter + r] = gt / (1.0f + expf(-gt)) * up;
        }
}

// y rows r0..r0+31 (two tiles) of entries [i0, i0 + nt).
template <int FP8, int NTL>
__device__ __forceinline__ void mma_down_pass(WeightRef W, const u32* ent, u32 i0, u32 nt, const float* h, float* y, u32 hidden, u32 inter, u32 r0) {
    const u32 lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    u32 idx[NTL];
#pragma unroll
    for (int j = 0; j < NTL; j++) idx[j] = j * MMA_TOKENS + g < nt ? ent[i0 + j * MMA_TOKENS + g] : 0;
    float acc[2][NTL][4];
    u32 rb[2] = {r0, r0 + MMA_ROWS};
    mma_rows<FP8, NTL>(W, rb, inter, 0, inter, h, inter, idx, nt, acc);
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int j = 0; j < NTL; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 n = j * MMA_TOKENS + 2 * t + (i & 1), r = rb[q] + g + 8 * (i >> 1);
                if (n < nt) y[(i64)ent[i0 + n] * hidden + r] = acc[q][j][i];
            }
}

// Gate|up of a shared chunk (local expert e) for every one of the m tokens (entries i · k +
// slot): the block lists a pass's entries in shared memory (every thread at the barriers; the
// list is the same for all its sub-groups) and each sub-group with a unit runs the pass over the
// list as it runs one over the plan's entries.
template <int FP8>
__device__ __forceinline__ void mma_shared_chunk(ExpertTable T, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 slot, u32 e, u32 unit, u32 units) {
    __shared__ u32 list[2 * MMA_TOKENS];
    WeightRef W = expert_ref(T, e);
    for (u32 i0 = 0; i0 < m;) {
        const u32 left = m - i0, nt = left > MMA_TOKENS ? min(left, 2u * MMA_TOKENS) : left;
        __syncthreads();
        if (threadIdx.x < nt) list[threadIdx.x] = (i0 + threadIdx.x) * k + slot;
        __syncthreads();
        if (unit < units) {
            if (nt > MMA_TOKENS) mma_gate_up_pass<FP8, 2>(W, list, 0, nt, x, h, k, hidden, inter, unit * MMA_ROWS);
            else mma_gate_up_pass<FP8, 1>(W, list, 0, nt, x, h, k, hidden, inter, unit * MMA_ROWS);
        }
        i0 += nt;
    }
}

// One sub-group per unit of work: `units` per expert (gate_up: inter/16 tiles, each with its up
// tile; down: hidden/32), blockDim.x/32 units per block, blocks past the active experts exit.
// Entries go 8 at a time, or 16 when more than 8 remain. Gate|up takes the S shared chunks
// (local experts held..held+S, every one of the m tokens at slots k-S..k-1) in its first
// S · per_expert blocks from x alone, before the wait, as moe_gate_up_body (moe.cu) does; the
// blocks after them wait and take the plan's routed experts.
template <int FP8, int DOWN>
__device__ void moe_mma_body(ExpertTable T, const u32* plan, u32 maxa, const float* in, float* out, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) {
    u32 warps = blockDim.x / 32;
    u32 units = DOWN ? hidden / (2 * MMA_ROWS) : inter / MMA_ROWS;
    u32 per_expert = (units + warps - 1) / warps;
    u32 unit = (blockIdx.x % per_expert) * warps + threadIdx.x / 32;
    if (!DOWN && blockIdx.x < S * per_expert) {
        const u32 s = blockIdx.x / per_expert;
        mma_shared_chunk<FP8>(T, in, out, k, hidden, inter, m, k - S + s, held + s, unit, units);
        return;
    }
    WEFT_PDL_ENTRY();
    u32 a = blockIdx.x / per_expert - S;
    if (a + S >= plan[0]) return;
    if (unit >= units) return;
    WeightRef W = expert_ref(T, plan[1 + a]);
    const u32* off = plan + 1 + maxa;
    const u32* ent = plan + 2 + 2 * maxa;
    for (u32 i0 = off[a]; i0 < off[a + 1];) {
        u32 left = off[a + 1] - i0;
        if (left > MMA_TOKENS) {
            u32 nt = min(left, 2u * MMA_TOKENS);
            if (DOWN) mma_down_pass<FP8, 2>(W, ent, i0, nt, in, out, hidden, inter, unit * 2 * MMA_ROWS);
            else mma_gate_up_pass<FP8, 2>(W, ent, i0, nt, in, out, k, hidden, inter, unit * MMA_ROWS);
            i0 += nt;
        } else {
            if (DOWN) mma_down_pass<FP8, 1>(W, ent, i0, left, in, out, hidden, inter, unit * 2 * MMA_ROWS);
            else mma_gate_up_pass<FP8, 1>(W, ent, i0, left, in, out, k, hidden, inter, unit * MMA_ROWS);
            i0 += left;
        }
    }
}

// (Bounded to five blocks an SM, as the kernel ran before it had the shared-chunk path: that
// path takes the bf16 kernel from 96 registers to more, and four blocks; bounded, 96 and no
// spills.)
extern "C" __global__ void __launch_bounds__(128, 5) moe_gate_up_bf16_mma(const u64* w, const u32* plan, u32 maxa, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) {
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_mma_body<0, 0>(Tb, plan, maxa, x, h, k, hidden, inter, m, S, held);
}
extern "C" __global__ void moe_gate_up_fp8_mma(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) {
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_mma_body<1, 0>(Tb, plan, maxa, x, h, k, hidden, inter, m, S, held);
}
// (Down has no shared-chunk blocks: S = 0, every block waits.)
extern "C" __global__ void moe_down_bf16_mma(const u64* w, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter) {
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_mma_body<0, 1>(Tb, plan, maxa, h, y, 0, hidden, inter, 0, 0, 0);
}
extern "C" __global__ void moe_down_fp8_mma(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter) {
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_mma_body<1, 1>(Tb, plan, maxa, h, y, 0, hidden, inter, 0, 0, 0);
}

// Dense linears, plain (out[i, r] = W[r, :] · x[i, g(r)], rows grouped `group_rows` per group
// as in gemv_body) or gated (out[i, r] = silu(gate_r · x[i]) * (up_r · x[i]) for a stacked
// [2*rows, cols] gate|up weight). A block per unit of two 16-row tiles (32 rows, or 16 gate rows
// and their 16 up rows); its blockDim.x/32 sub-groups (at most MMA_SPLIT_FLOATS / (256·NTL), the
// host's bound: 32, 16 or 8) each take an equal
// share of whole column chunks, so a short matrix still keeps enough loads in flight. The
// partial sums meet in shared memory and are added in sub-group order (deterministic).
#define MMA_SPLIT_FLOATS 8192
// Row within a 16-row tile of accumulator element i of lane l (m16n8 C fragment).
__device__ __forceinline__ u32 g_row(u32 l, u32 i) { return l / 4 + 8 * (i >> 1); }
// One pass of a sub-group of the dense kernels: its tile pair rb times activation rows
// t0..t0+nt over columns [c_begin, c_end), the sums left in red[sg] ([place][lane]) for the
// block's reduction, after a block barrier.
template <int FP8, int NTL>
__device__ __forceinline__ void mma_pass_to_shared(WeightRef W, const u32 (&rb)[2], u32 cols, u32 c_begin, u32 c_end, const float* xg, u32 xstride, u32 t0, u32 nt, float* red, u32 sg) {
    constexpr int PER_LANE = 2 * NTL * 4;
    const u32 lane = threadIdx.x % 32;
    u32 xr[NTL];
#pragma unroll
    for (int j = 0; j < NTL; j++) xr[j] = t0 + j * MMA_TOKENS + lane / 4;
    float acc[2][NTL][4];
    mma_rows<FP8, NTL>(W, rb, cols, c_begin, c_end, xg, xstride, xr, nt, acc);
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int j = 0; j < NTL; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[(sg * PER_LANE + (q * NTL + j) * 4 + i) * 32 + lane] = acc[q][j][i];
    __syncthreads();
}
// Both tiles' sums s of place (lane l, ji = j·4 + i) to out: the gated product or the two rows.
template <int GATED>
__device__ __forceinline__ void gemv_mma_store(float* out, const float (&s)[2], u32 l, u32 ji, u32 nt, u32 t0, u32 rows, u32 r0) {
    u32 j = ji / 4, i = ji % 4;
    u32 n = j * MMA_TOKENS + 2 * (l % 4) + (i & 1), r = g_row(l, i);
    if (n >= nt) return;
    if (GATED) out[(i64)(t0 + n) * rows + r0 + r] = s[0] / (1.0f + expf(-s[0])) * s[1];
    else {
        out[(i64)(t0 + n) * rows + r0 + r] = s[0];
        out[(i64)(t0 + n) * rows + r0 + MMA_ROWS + r] = s[1];
    }
}
template <int FP8, int NTL, int GATED>
__device__ void gemv_mma_body(WeightRef W, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    constexpr int CH = FP8 ? 64 : 32;
    constexpr int PER_LANE = 2 * NTL * 4;
    __shared__ float red[MMA_SPLIT_FLOATS];  // [sub-group][place][lane]: 32 KB
    const u32 split = blockDim.x / 32, sg = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 r0 = blockIdx.x * (GATED ? MMA_ROWS : 2 * MMA_ROWS);
    if (r0 >= rows) return;  // whole block: the grid is exact
    const u32 chunks = cols / CH, share = (chunks + split - 1) / split;
    const u32 c_begin = min(sg * share, chunks) * CH, c_end = min((sg + 1) * share, chunks) * CH;
    const float* xg = GATED ? x : x + (i64)(r0 / group_rows) * cols;
    u32 rb[2] = {r0, GATED ? rows + r0 : r0 + MMA_ROWS};
    for (u32 t0 = 0; t0 < m; t0 += NTL * MMA_TOKENS) {
        u32 nt = min((u32)(NTL * MMA_TOKENS), m - t0);
        mma_pass_to_shared<FP8, NTL>(W, rb, cols, c_begin, c_end, xg, xstride, t0, nt, red, sg);
        // Each thread finishes some (lane, j, i) places of the tile pair: both tiles' sums.
        for (u32 e = threadIdx.x; e < NTL * 4 * 32; e += blockDim.x) {
            u32 l = e % 32, ji = e / 32;
            float s[2] = {0.f, 0.f};
            for (u32 w = 0; w < split; w++)
#pragma unroll
                for (int q = 0; q < 2; q++) s[q] += red[(w * PER_LANE + q * NTL * 4 + ji) * 32 + l];
            gemv_mma_store<GATED>(out, s, l, ji, nt, t0, rows, r0);
        }
        __syncthreads();
    }
}

// N: activation rows per pass = 8·N (N = 1, 2, 4; the host picks the smallest covering m).
#define GEMV_MMA_ENTRY(N)                                                                                               \
    extern "C" __global__ void gemv_mma_bf16_n##N(const u16* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) { WEFT_PDL_ENTRY(); \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        gemv_mma_body<0, N, 0>(W, x, out, m, rows, cols, group_rows, xstride);                                             \
    }                                                                                                                   \
    extern "C" __global__ void gemv_mma_fp8_n##N(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) { WEFT_PDL_ENTRY(); \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        gemv_mma_body<1, N, 0>(W, x, out, m, rows, cols, group_rows, xstride);                                             \
    }                                                                                                                   \
    extern "C" __global__ void gemv_gated_mma_bf16_n##N(const u16* w, const float* x, float* out, u32 m, u32 inter, u32 cols) { WEFT_PDL_ENTRY(); \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        gemv_mma_body<0, N, 1>(W, x, out, m, inter, cols, inter, cols);                                                           \
    }                                                                                                                   \
    extern "C" __global__ void gemv_gated_mma_fp8_n##N(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* out, u32 m, u32 inter, u32 cols) { WEFT_PDL_ENTRY(); \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        gemv_mma_body<1, N, 1>(W, x, out, m, inter, cols, inter, cols);                                                           \
    }
GEMV_MMA_ENTRY(1)
GEMV_MMA_ENTRY(2)
GEMV_MMA_ENTRY(4)

// Thread block clusters (sm_90+): the blocks of one cluster split a unit's columns, each
// reduces its sub-groups' sums, then each finishes a share of the unit's outputs by adding the
// cluster's partial sums read from the other blocks' shared memory (in rank order).
#if !defined(WEFT_NO_PTX) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync_all() { asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// The float at p's offset in the shared memory of cluster block `rank`.
__device__ __forceinline__ float ld_cluster_f32(const float* p, u32 rank) {
    u32 a = (u32)__cvta_generic_to_shared(p), r;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
    return v;
}
#define WEFT_HAS_CLUSTER 1
#elif defined(WEFT_EMU)
// The CPU emulator runs a cluster's blocks together (kernels/emu/emu.h, emu_launch_clusters).
__device__ __forceinline__ void cluster_sync_all() { emu_cluster_sync(); }
__device__ __forceinline__ float ld_cluster_f32(const float* p, u32 rank) { return emu_ld_cluster(p, rank); }
#define WEFT_HAS_CLUSTER 1
#else
__device__ __forceinline__ void cluster_sync_all() {}
__device__ __forceinline__ float ld_cluster_f32(const float* p, u32) { return *p; }
#endif

// gemv_mma_body for the 64-row pass of bf16 weights (kept apart so the measured 8–32-row
// kernels compile as before). A block takes `ub` units: sub-group sg works on unit sg / split
// (split = blockDim.x / 32 / ub sub-groups a unit) over its share of the columns, so the ub
// sub-groups of a share read the same activations (L1 hits after the first). red: the block's
// dynamic reduction buffer, [sub-group][place][lane] (2·NTL·4·32 floats a sub-group); with
// CL > 1 (blockIdx.y = rank in a cluster of CL blocks along the columns) ub·2·NTL·4·32 more
// floats after the sub-groups' for the block's partial sums.
template <int NTL, int GATED, int CL>
__device__ __forceinline__ void gemv_mma_wide_body(WeightRef W, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride, float* red, u32 ub) {
    constexpr int FP8 = 0, CH = 32;
    constexpr int PER_LANE = 2 * NTL * 4;
    constexpr u32 PLACES = NTL * 4 * 32;  // (j, i, lane) places of one tile
    const u32 split = blockDim.x / 32 / ub, sg = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 unit = sg / split, ks = sg % split;
    const u32 urows = GATED ? MMA_ROWS : 2 * MMA_ROWS;
    if (blockIdx.x * ub * urows >= rows) return;  // whole block (and cluster: clusters run along y): the grid is exact
    const u32 r0 = (blockIdx.x * ub + unit) * urows;
    const u32 rank = CL > 1 ? blockIdx.y : 0;
    const u32 chunks = cols / CH, cshare = (chunks + CL - 1) / CL;
    const u32 cb = min(rank * cshare, chunks), ce = min(cb + cshare, chunks);
    const u32 share = (ce - cb + split - 1) / split;
    const u32 c_begin = min(cb + ks * share, ce) * CH, c_end = min(cb + (ks + 1) * share, ce) * CH;
    const float* xg = GATED ? x : x + (i64)(r0 / group_rows) * cols;
    u32 rb[2] = {r0, GATED ? rows + r0 : r0 + MMA_ROWS};
    float* part = red + blockDim.x / 32 * PER_LANE * 32;  // CL > 1: this block's sums, [unit][tile][place]
    for (u32 t0 = 0; t0 < m; t0 += NTL * MMA_TOKENS) {
        u32 nt = min((u32)(NTL * MMA_TOKENS), m - t0);
        mma_pass_to_shared<FP8, NTL>(W, rb, cols, c_begin, c_end, xg, xstride, t0, nt, red, sg);
        // Each thread finishes some (unit, lane, j, i) places of the tile pairs: both tiles' sums.
        for (u32 e = threadIdx.x; e < ub * PLACES; e += blockDim.x) {
            u32 u = e / PLACES, pe = e % PLACES, l = pe % 32, ji = pe / 32;
            float s[2] = {0.f, 0.f};
            for (u32 w = u * split; w < (u + 1) * split; w++)
#pragma unroll
                for (int q = 0; q < 2; q++) s[q] += red[(w * PER_LANE + q * NTL * 4 + ji) * 32 + l];
            if (CL > 1) {
                part[(2 * u) * PLACES + pe] = s[0];
                part[(2 * u + 1) * PLACES + pe] = s[1];
            } else {
                gemv_mma_store<GATED>(out, s, l, ji, nt, t0, rows, (blockIdx.x * ub + u) * urows);
            }
        }
        if (CL > 1) {
            cluster_sync_all();  // every block's sums written
            const u32 per = ub * PLACES / CL;
            for (u32 e = rank * per + threadIdx.x; e < (rank + 1) * per; e += blockDim.x) {
                u32 u = e / PLACES, pe = e % PLACES;
                float s[2] = {0.f, 0.f};
                for (u32 c = 0; c < CL; c++)
#pragma unroll
                    for (int q = 0; q < 2; q++) s[q] += ld_cluster_f32(part + (2 * u + q) * PLACES + pe, c);
                gemv_mma_store<GATED>(out, s, pe % 32, pe / 32, nt, t0, rows, (blockIdx.x * ub + u) * urows);
            }
            cluster_sync_all();  // no block leaves (or overwrites its sums) while others read them
        } else {
            __syncthreads();
        }
    }
}

// 33–64 activation rows of bf16 weights in one pass (each weight read once; 64 accumulators a
// lane), `ub` units a block. The reduction buffer is dynamic: 8 KB a sub-group, up to 16
// sub-groups (the host's MMA_SPLIT_FLOATS_WIDE), plus 8 KB a unit of partial sums in the
// cluster variants. _c2 / _c4 / _c8 (sm_90+): clusters of 2 / 4 / 8 blocks split each unit's
// columns, for matrices of too few 32-row units to fill the GPU. fp8 weights keep two passes of
// 32 (their per-chunk partial sums would double the accumulators).
#define GEMV_MMA_WIDE(SUFFIX, CL, ATTR)                                                                                  \
    extern "C" __global__ void ATTR gemv_mma_bf16_n8##SUFFIX(const u16* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride, u32 ub) { WEFT_PDL_ENTRY(); \
        WEFT_DYNAMIC_SHARED(float, red);                                                                                 \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                   \
        gemv_mma_wide_body<8, 0, CL>(W, x, out, m, rows, cols, group_rows, xstride, red, ub);                              \
    }                                                                                                                    \
    extern "C" __global__ void ATTR gemv_gated_mma_bf16_n8##SUFFIX(const u16* w, const float* x, float* out, u32 m, u32 inter, u32 cols, u32 ub) { WEFT_PDL_ENTRY(); \
        WEFT_DYNAMIC_SHARED(float, red);                                                                                 \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                   \
        gemv_mma_wide_body<8, 1, CL>(W, x, out, m, inter, cols, inter, cols, red, ub);                                     \
    }
GEMV_MMA_WIDE(, 1, )
#if defined(WEFT_HAS_CLUSTER)
GEMV_MMA_WIDE(_c2, 2, __cluster_dims__(1, 2, 1))
GEMV_MMA_WIDE(_c4, 4, __cluster_dims__(1, 4, 1))
GEMV_MMA_WIDE(_c8, 8, __cluster_dims__(1, 8, 1))
#else
// No clusters (before sm_90, AMD): the host never selects these.
#if defined(WEFT_NO_PTX)
#define GEMV_WIDE_TRAP() __builtin_trap()
#else
#define GEMV_WIDE_TRAP() __trap()
#endif
#define GEMV_MMA_WIDE_STUB(NAME) \
    extern "C" __global__ void NAME(const u16*, const float*, float*, u32, u32, u32, u32, u32, u32) { GEMV_WIDE_TRAP(); }
#define GEMV_GATED_WIDE_STUB(NAME) \
    extern "C" __global__ void NAME(const u16*, const float*, float*, u32, u32, u32, u32) { GEMV_WIDE_TRAP(); }
GEMV_MMA_WIDE_STUB(gemv_mma_bf16_n8_c2)
GEMV_MMA_WIDE_STUB(gemv_mma_bf16_n8_c4)
GEMV_GATED_WIDE_STUB(gemv_gated_mma_bf16_n8_c2)
GEMV_GATED_WIDE_STUB(gemv_gated_mma_bf16_n8_c4)
GEMV_MMA_WIDE_STUB(gemv_mma_bf16_n8_c8)
GEMV_GATED_WIDE_STUB(gemv_gated_mma_bf16_n8_c8)
#endif
