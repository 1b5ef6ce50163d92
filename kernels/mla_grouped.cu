// MLA decode on tensor cores for more than 16 heads per sequence (64 and 128 under Kimi /
// DeepSeek at TP1–2): mla_decode_mma (mla.cu) takes one 16-head m-tile per block, so 64 heads
// were four blocks that each loaded the same tile of the cache and ran the whole per-tile
// chain (scores → barrier → softmax → barrier → values) for 16 heads; the kernel's time grew
// with the head count (~13 % of copy bandwidth at 64 heads). Here a block holds MG m-tiles
// (16·MG heads) and every phase covers them all over one tile in shared memory:
//
// - queries live in shared memory as ready A fragments (bf16 hi and lo parts, [MG][k16 step]
//   [part][lane] of uint4: one conflict-free 16-byte load per part and step), not in
//   registers, so the register budget does not grow with MG;
// - scores: warp (pair, kq) multiplies m-tile pr / (T/8) by n-tile pr % (T/8) of the tile over
//   its part kq of the width (KQ = W / pairs parts); partial scores meet in shared memory;
// - softmax: 32·W / (16·MG) threads per head;
// - values: each warp owns 512 / W latent columns for every head of the block: the B fragments
//   (the tile's columns) are read once per m-tile, the weights' A fragments once per k step.
//
// Same inputs, launch grid (block = row · groups + group, y = split), partial outputs and merge
// (mla_combine) as mla_decode_mma, and the same numerics (queries and softmax weights in two
// bf16 parts; an f32 cache in two parts as well, a bf16 one as stored).
template <int T, int W, int S, int MG, int NJW, int QP, typename C>
__device__ __forceinline__ void mla_mmg_body(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    constexpr int HB = 16 * MG;             // head rows per block
    constexpr int NJT = T / 8;              // n-tiles of 8 tokens per tile
    constexpr int NG = NJT / NJW;           // groups of NJW n-tiles (one score warp's tokens)
    constexpr int P = MG * NG;              // (m-tile, n-tile group) score pairs
    constexpr int KQ = W / P;               // parts of the width per pair
    constexpr int CHN = NJW == 1 ? 2 : 1;   // independent mma chains per n-tile
    constexpr int KS = (36 + KQ - 1) / KQ;  // k16 steps per warp (width <= 576)
    constexpr int HT = 32 * W / HB;         // softmax threads per head
    constexpr int E = T / HT;               // tokens per softmax thread
    constexpr int NT = 64 / W;              // n-tiles of 8 latent columns per value warp
    constexpr int CW = 8 * NT;              // latent columns per value warp
    constexpr int RS = T + 8;               // floats per partial-score row (conflict-free writes)
    constexpr int PS = T + 8;               // u16 per weight row (conflict-free fragment reads)
    constexpr bool BF = sizeof(C) == 2;
    static_assert(QP == 1 || QP == 2, "query parts");
    static_assert(NG * NJW == NJT && KQ * P == W && E >= 1 && E * HT == T && HT <= 32 && NT % 2 == 0 && T % 16 == 0, "tile, head and warp counts");
    WEFT_DYNAMIC_SHARED(float, smem);
    const u32 w = latent + rd, ks = mlt_stride<C>(w), nks = w / 16;
    const MlaBlock B = mla_block(T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 row = B.row, h0 = B.h0, hg = B.hg, nsplit = gridDim.y, split = blockIdx.y, t_begin = B.t_begin, t_end = B.t_end;
    const u32* table = B.table;
    uint4* qf = (uint4*)smem;                  // [MG][nks][QP][32]
    C* tiles = (C*)(qf + MG * nks * QP * 32);  // [S][T][ks]
    float* red = (float*)(tiles + S * T * ks); // [KQ][HB][RS]
    u16* phi = (u16*)(red + KQ * HB * RS);     // [HB][PS]
    u16* plo = phi + HB * PS;
    float* corr = (float*)(plo + HB * PS);     // [HB]
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const u32 ntiles = (t_end - t_begin + T - 1) / T;
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if ((u32)st < ntiles) mlt_load<T>(tiles + st * T * ks, layer, table, t_begin + st * T, t_end, page, w, ks);
        else cp_async_commit();
    }
    // The block's queries as A fragments while the first tiles load (the loop's first barrier
    // publishes them). Lane (g, t) of step k: rows g, g + 8 of the m-tile; columns 2t, 2t + 1,
    // 2t + 8, 2t + 9 of the step over a bf16 cache (the standard layout, as its B fragments are
    // read), 4t..4t + 3 over an f32 one (one float4 of the tile row: mla.cu's k order).
    for (u32 e = threadIdx.x; e < MG * nks * 32; e += blockDim.x) {
        const u32 l = e % 32, kst = e / 32 % nks, m = e / 32 / nks, gg = l / 4, tt = l % 4;
        float4 x[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            x[r] = make_float4(0.f, 0.f, 0.f, 0.f);
            const u32 h = m * 16 + gg + 8 * r;
            if (h < hg) {
                const i64 qh = (i64)row * heads + h0 + h;
                if (BF) {
                    const u32 d = kst * 16 + 2 * tt;
                    const float2 a = d < latent ? *(const float2*)(q_lat + qh * latent + d) : *(const float2*)(q_pe + qh * rd + d - latent);
                    const float2 b = d + 8 < latent ? *(const float2*)(q_lat + qh * latent + d + 8) : *(const float2*)(q_pe + qh * rd + d + 8 - latent);
                    x[r] = make_float4(a.x, a.y, b.x, b.y);
                } else {
                    const u32 d = kst * 16 + 4 * tt;
                    x[r] = d < latent ? *(const float4*)(q_lat + qh * latent + d) : *(const float4*)(q_pe + qh * rd + d - latent);
                }
            }
        }
        uint4 hi, lo;
        split_bf16x2(x[0].x, x[0].y, hi.x, lo.x);
        split_bf16x2(x[1].x, x[1].y, hi.y, lo.y);
        split_bf16x2(x[0].z, x[0].w, hi.z, lo.z);
        split_bf16x2(x[1].z, x[1].w, hi.w, lo.w);
        qf[((m * nks + kst) * QP) * 32 + l] = hi;
        if (QP == 2) qf[((m * nks + kst) * QP + 1) * 32 + l] = lo;
    }
    const u32 pr = warp / KQ, kq = warp % KQ, mt = pr / NG, nj0 = pr % NG * NJW;
    const u32 ks0 = kq * nks / KQ, ks1 = (kq + 1) * nks / KQ;
    const uint4* qw = qf + mt * nks * QP * 32 + lane;
    // Softmax state of head sh (its HT threads hold identical copies).
    const u32 sh = threadIdx.x / HT, sc = E * (threadIdx.x % HT);
    float m_run = -WEFT_INF, l_run = 0.f;
    float acc[MG][NT][4];
    zero_acc(acc);

    for (u32 it = 0; it < ntiles; it++) {
        const C* kv = tiles + (it % S) * T * ks;
        const u32 base = t_begin + it * T, cnt = min((u32)T, t_end - base);
        if (it + S - 1 < ntiles) mlt_load<T>(tiles + ((it + S - 1) % S) * T * ks, layer, table, base + (S - 1) * T, t_end, page, w, ks);
        else cp_async_commit();
        cp_async_wait<S - 1>();
        __syncthreads();
        {
            // One warp: NJW n-tiles (each query fragment read once for all of them); with a
            // single n-tile, even and odd k steps accumulate apart (two mma chains).
            float s[CHN][NJW][4];
            zero_acc(s);
            const C* kr = kv + (nj0 * 8 + g) * ks;
#pragma unroll
            for (int i = 0; i < KS; i++) {
                const u32 k = ks0 + i;
                if (k < ks1) {
                    const uint4 a = qw[k * QP * 32];
                    uint4 b = a;
                    if (QP == 2) b = qw[k * QP * 32 + 32];
#pragma unroll
                    for (int j = 0; j < NJW; j++) {
                        float(&sc4)[4] = s[i % CHN][j];
                        const C* kj = kr + j * 8 * ks + k * 16;
                        if (BF) {
                            const u32 b0 = *(const u32*)(kj + 2 * t), b1 = *(const u32*)(kj + 2 * t + 8);
                            mma_bf16_16816(sc4, a.x, a.y, a.z, a.w, b0, b1);
                            if (QP == 2) mma_bf16_16816(sc4, b.x, b.y, b.z, b.w, b0, b1);
                        } else {
                            const float4 k4 = *(const float4*)(kj + 4 * t);
                            u32 bh0, bl0, bh1, bl1;
                            split_bf16x2(k4.x, k4.y, bh0, bl0);
                            split_bf16x2(k4.z, k4.w, bh1, bl1);
                            mma_bf16_16816(sc4, a.x, a.y, a.z, a.w, bh0, bh1);
                            if (QP == 2) mma_bf16_16816(sc4, b.x, b.y, b.z, b.w, bh0, bh1);
                            mma_bf16_16816(sc4, a.x, a.y, a.z, a.w, bl0, bl1);
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NJW; j++) {
                float* rr = red + (kq * HB + mt * 16 + g) * RS + (nj0 + j) * 8 + 2 * t;
                float x[4];
#pragma unroll
                for (int i = 0; i < 4; i++) x[i] = CHN == 2 ? s[0][j][i] + s[CHN - 1][j][i] : s[0][j][i];
                *(float2*)rr = make_float2(x[0], x[1]);
                *(float2*)(rr + 8 * RS) = make_float2(x[2], x[3]);
            }
        }
        __syncthreads();
        mla_tile_softmax<E, HT, KQ, RS, PS>(red, HB, sh, sc, cnt, hg, scale, m_run, l_run, corr, phi, plo);
        __syncthreads();
#pragma unroll
        for (int m = 0; m < MG; m++) mla_tile_values<T, NT, PS>(acc[m], kv, ks, phi, plo, corr, m * 16 + g, warp, latent);
        __syncthreads();
    }
    const i64 part = ((i64)row * heads + h0) * nsplit + split;
#pragma unroll
    for (int m = 0; m < MG; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const u32 d = CW * warp + 8 * j + 2 * t, r0 = m * 16 + g;
            if (CW * warp + 8 * j < latent) {
                if (r0 < hg) *(float2*)(o_part + (part + (i64)r0 * nsplit) * latent + d) = make_float2(acc[m][j][0], acc[m][j][1]);
                if (r0 + 8 < hg) *(float2*)(o_part + (part + (i64)(r0 + 8) * nsplit) * latent + d) = make_float2(acc[m][j][2], acc[m][j][3]);
            }
        }
    if (sc == 0 && sh < hg) {
        ml_part[(part + (i64)sh * nsplit) * 2] = m_run;
        ml_part[(part + (i64)sh * nsplit) * 2 + 1] = l_run;
    }
}

#define WEFT_MLA_MMG(name, T, W, S, MG, NJW, QP, C) \
    extern "C" __global__ void __launch_bounds__(32 * W, 1) name(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) { \
        WEFT_PDL_ENTRY(); \
        mla_mmg_body<T, W, S, MG, NJW, QP, C>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk); \
    }
// (tile tokens, warps, tile buffers, m-tiles, n-tiles per score warp, query parts) — src/mla.rs
// MMG_KERNELS holds the same. Measured on the H200 (mla_bench 64 × 4096, one query row; round
// 9 in results/roofline-h200.md), against mla_decode_mma's 779 µs at 64 heads and 204 µs at
// 16 over a bf16 cache, 1,121 µs at 64 heads over an f32 one:
// - bf16, more than 32 heads: 64 heads over 16-token tiles, each score warp over both n-tiles
//   (query fragments read once for both): 519 µs (one n-tile per warp: 571; 32 tokens would not
//   fit beside 147 KB of query fragments);
// - bf16, 17–32 heads: 32 over 32-token tiles (316 µs at 32 heads, against 392);
// - bf16, up to 16 heads: one m-tile over 64-token tiles, score warps over 4 n-tiles: 153 µs
//   (one n-tile per warp: 180);
// - f32, more than 16 heads: 32 heads over 16-token tiles: 1,046 µs (up to 16 heads
//   mla_decode_mma stays: 291 µs, against 311 here over 32-token tiles);
// - bf16 with the queries as one bf16 part (their rounding enters the scores, as in FlashMLA;
//   opt-in, `WEFT_CUDA_MLA_MMG=mla_decode_mmg4wq1_bf16`): 64 heads over 32-token tiles, 369 µs.
WEFT_MLA_MMG(mla_decode_mmg4w_bf16, 16, 16, 2, 4, 2, 2, u16)
WEFT_MLA_MMG(mla_decode_mmg2_bf16, 32, 16, 2, 2, 1, 2, u16)
WEFT_MLA_MMG(mla_decode_mmg1w_bf16, 64, 16, 2, 1, 4, 2, u16)
WEFT_MLA_MMG(mla_decode_mmg2w, 16, 16, 2, 2, 2, 2, float)
WEFT_MLA_MMG(mla_decode_mmg4wq1_bf16, 32, 16, 2, 4, 4, 1, u16)
