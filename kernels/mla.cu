// Absorbed MLA attention over the paged latent pool, split along the context ("flash
// decoding"): block (row * groups + head group, split) loads tiles of MLA_T cached tokens into
// shared memory once and scores them against every head of its group (MLA shares one latent
// per token across all heads), keeping an online softmax per head. Each split writes its
// unnormalised output and (max, sum); mla_combine merges the splits. Works for any number of
// query rows per sequence (decode, speculative verification, prefill chunks: each row has
// its own visible context).
#define MLA_T 16
#define MLA_HG 16

// Dynamic shared memory: q [hg][w], kv [MLA_T][w + 4], p [MLA_HG][MLA_T], corr / m / l [MLA_HG].
// Rows are read as float4 (latent and rope widths are multiples of 4, checked by the host); the
// kv row stride w + 4 puts consecutive tokens 4 banks apart, so the 8 lanes of a quarter-warp
// that read 8 tokens' float4s at one column touch 32 distinct banks.
// The context range of split `split` of `nsplit` for a row of n visible tokens: the row's own
// context cut evenly into whole tiles of `tile` tokens, each split at least `min_chunk` tokens
// (so a step recorded for a context bucket still spreads each row's real context over all its
// splits; splits past the end are empty).
__device__ __forceinline__ void split_range(u32 n, u32 split, u32 nsplit, u32 tile, u32 min_chunk, u32& t_begin, u32& t_end) {
    const u32 even = ((n + nsplit - 1) / nsplit + tile - 1) / tile * tile;
    const u32 chunk = max(min_chunk, even);
    t_begin = min(n, split * chunk);
    t_end = min(n, t_begin + chunk);
}

// C: the cache's element (float, or u16 for bf16: converted to f32 as the tile is loaded).
template <typename C>
__device__ __forceinline__ void mla_decode_body(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    WEFT_DYNAMIC_SHARED(float, smem);
    u32 w = latent + rd, wp = w + 4, w4 = w / 4, l4 = latent / 4;
    u32 row = blockIdx.x / groups, grp = blockIdx.x % groups;
    u32 h0 = grp * gsize;
    // Heads of this block: groups of `gsize` (<= MLA_HG), the last one possibly smaller, so
    // every head count takes this kernel.
    u32 hg = min(gsize, heads - h0);
    float* q = smem;
    float* kv = q + hg * w;
    float* p = kv + MLA_T * wp;
    float* corr = p + MLA_HG * MLA_T;
    float* mrun = corr + MLA_HG;
    float* lrun = mrun + MLA_HG;
    u32 nsplit = gridDim.y, split = blockIdx.y;
    u32 n = ctx[row];
    u32 t_begin, t_end;
    split_range(n, split, nsplit, MLA_T, chunk, t_begin, t_end);
    const u32* table = bt + bt_off[row];
    for (u32 i = threadIdx.x; i < hg * w4; i += blockDim.x) {
        u32 h = i / w4, j = i % w4;
        i64 qh = (i64)row * heads + h0 + h;
        ((float4*)q)[i] = j < l4 ? ((const float4*)q_lat)[qh * l4 + j] : ((const float4*)q_pe)[qh * (rd / 4) + (j - l4)];
    }
    if (threadIdx.x < MLA_HG) { mrun[threadIdx.x] = -WEFT_INF; lrun[threadIdx.x] = 0.f; }
    // Each thread owns 4 output dims (dq: dims 4dq..4dq+3) of 8 heads (hh0..hh0+7): with 256
    // threads, 128 dim quads × 2 head halves cover a latent of 512 and 16 heads.
    const u32 dq = threadIdx.x % 128, hh0 = threadIdx.x / 128 * 8;
    const bool owns = 4 * dq < latent && hh0 < hg;
    float acc[8][4];
#pragma unroll
    for (int h = 0; h < 8; h++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[h][j] = 0.f;
    __syncthreads();
    for (u32 base = t_begin; base < t_end; base += MLA_T) {
        u32 cnt = min((u32)MLA_T, t_end - base);
        // Rows past the context are zeroed: the value pass multiplies every row of the tile
        // (by a zero weight), and 0 × stale shared memory can be NaN.
        for (u32 i = threadIdx.x; i < MLA_T * w4; i += blockDim.x) {
            u32 t = i / w4, j = i % w4;
            u32 tt = base + t;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < cnt) v = kv_ld4(layer + ((i64)table[tt / page] * page + tt % page) * w + 4 * j);
            ((float4*)(kv + t * wp))[j] = v;
        }
        __syncthreads();
        // Scores: each 16-lane group owns a 4-head × 4-token sub-tile (16 groups cover 16 heads
        // × MLA_T tokens); each lane sums a strided share of the width for all 16 pairs — 8
        // float4 loads from shared memory per 16 float4 products, a quarter of the traffic of
        // one pair per thread, which bounded this phase — and the group adds its lanes' sums by
        // butterfly. Sub-tiles past the block's heads skip (uniform over each sub-group: a
        // 32- or 64-lane sub-group holds groups of one head block).
        {
            const u32 sub = threadIdx.x / 16, lane = threadIdx.x % 16;
            const u32 hb = sub / 4 * 4, tb = sub % 4 * 4;
            if (hb < hg) {
                float a[4][4];
                const float4* qr[4];
                const float4* kr[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    qr[i] = (const float4*)(q + min(hb + i, hg - 1) * w);
                    kr[i] = (const float4*)(kv + (tb + i) * wp);
#pragma unroll
                    for (int j = 0; j < 4; j++) a[i][j] = 0.f;
                }
                for (u32 j = lane; j < w4; j += 16) {
                    float4 x[4], y[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        x[i] = qr[i][j];
                        y[i] = kr[i][j];
                    }
#pragma unroll
                    for (int hh = 0; hh < 4; hh++)
#pragma unroll
                        for (int tt = 0; tt < 4; tt++) a[hh][tt] += (x[hh].x * y[tt].x + x[hh].y * y[tt].y) + (x[hh].z * y[tt].z + x[hh].w * y[tt].w);
                }
                float s = 0.f;
#pragma unroll
                for (int hh = 0; hh < 4; hh++)
#pragma unroll
                    for (int tt = 0; tt < 4; tt++) {
                        float v = a[hh][tt];
#pragma unroll
                        for (int o = 8; o > 0; o >>= 1) v += lane_xor(v, o);
                        if (hh * 4 + tt == (int)lane) s = v;
                    }
                u32 h = hb + lane / 4, t = tb + lane % 4;
                if (h < hg) p[h * MLA_T + t] = t < cnt ? s * scale : -WEFT_INF;
            }
        }
        __syncthreads();
        if (threadIdx.x < hg) {
            u32 h = threadIdx.x;
            float mx = mrun[h];
            for (u32 t = 0; t < cnt; t++) mx = fmaxf(mx, p[h * MLA_T + t]);
            float c = expf(mrun[h] - mx), sum = 0.f;
            for (u32 t = 0; t < MLA_T; t++) {
                float e = t < cnt ? expf(p[h * MLA_T + t] - mx) : 0.f;
                p[h * MLA_T + t] = e;
                sum += e;
            }
            lrun[h] = lrun[h] * c + sum;
            mrun[h] = mx;
            corr[h] = c;
        }
        __syncthreads();
        // Values: per 4 tokens, 4 float4 rows of the tile (shared by the 8 heads) and 8 float4
        // weight quads (broadcast) feed 128 products.
        if (owns) {
#pragma unroll
            for (int h = 0; h < 8; h++) {
                float c = corr[min(hh0 + h, hg - 1)];
#pragma unroll
                for (int j = 0; j < 4; j++) acc[h][j] *= c;
            }
#pragma unroll
            for (int t4 = 0; t4 < MLA_T / 4; t4++) {
                float4 v[4];
#pragma unroll
                for (int tt = 0; tt < 4; tt++) v[tt] = ((const float4*)(kv + (4 * t4 + tt) * wp))[dq];
#pragma unroll
                for (int h = 0; h < 8; h++) {
                    float4 e = ((const float4*)(p + min(hh0 + h, hg - 1) * MLA_T))[t4];
                    acc[h][0] += e.x * v[0].x + e.y * v[1].x + e.z * v[2].x + e.w * v[3].x;
                    acc[h][1] += e.x * v[0].y + e.y * v[1].y + e.z * v[2].y + e.w * v[3].y;
                    acc[h][2] += e.x * v[0].z + e.y * v[1].z + e.z * v[2].z + e.w * v[3].z;
                    acc[h][3] += e.x * v[0].w + e.y * v[1].w + e.z * v[2].w + e.w * v[3].w;
                }
            }
        }
        __syncthreads();
    }
    i64 part = ((i64)row * heads + h0) * nsplit + split;
    if (owns)
#pragma unroll
        for (int h = 0; h < 8; h++)
            if (hh0 + h < hg) ((float4*)(o_part + (part + (i64)(hh0 + h) * nsplit) * latent))[dq] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
    if (threadIdx.x < hg) {
        ml_part[(part + (i64)threadIdx.x * nsplit) * 2] = mrun[threadIdx.x];
        ml_part[(part + (i64)threadIdx.x * nsplit) * 2 + 1] = lrun[threadIdx.x];
    }
}
extern "C" __global__ void __launch_bounds__(256, 2) mla_decode(const float* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) { WEFT_PDL_ENTRY();
    mla_decode_body(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk);
}
extern "C" __global__ void __launch_bounds__(256, 2) mla_decode_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) { WEFT_PDL_ENTRY();
    mla_decode_body(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk);
}

// A context split's weight in the merge of its partial output: exp(m_s − M) for its maximum m_s
// against the largest M, nothing for an empty split (also the 64-head kernels' in-kernel merge,
// mla_wgmma.cu `mlh_store`, which must match these bits).
__device__ __forceinline__ float mla_split_weight(float m, float M) { return m == -WEFT_INF ? 0.f : expf(m - M); }

// The merge of one row·head's `nsplit` context splits (`ml`: their (max, sum) pairs): each
// split's weight exp(m_s − M) into `wsh` (nsplit floats, shared), computed once in parallel,
// and the block's total L = Σ w_s l_s returned to every thread (`red`: blockDim.x floats of
// scratch). Column d of the merged output is then mla_merged_col / L. mla_combine and W_UV's
// merge (mla_uv_merge_body) both take these, so their bits agree.
__device__ __forceinline__ float mla_split_weights(const float* ml, u32 nsplit, float* wsh, float* red) {
    float mx = -WEFT_INF;
    for (u32 s = threadIdx.x; s < nsplit; s += blockDim.x) mx = fmaxf(mx, ml[2 * s]);
    const float M = block_max(mx, red);
    float l = 0.f;
    for (u32 s = threadIdx.x; s < nsplit; s += blockDim.x) {
        const float e = mla_split_weight(ml[2 * s], M);
        wsh[s] = e;
        l += e * ml[2 * s + 1];
    }
    return block_sum(l, red);
}
// Σ_s wsh[s] · o[s, d] over the splits' partials (`latent` wide), unrolled so that 16 loads are
// in flight before their sums need them.
__device__ __forceinline__ float mla_merged_col(const float* o, const float* wsh, u32 nsplit, u32 latent, u32 d) {
    float a = 0.f;
#pragma unroll 16
    for (u32 s = 0; s < nsplit; s++) a += wsh[s] * o[(i64)s * latent + d];
    return a;
}

// Block (row·head, column chunk): merges the splits' partial outputs for blockDim.x latent
// columns of one row and head (columns in chunks, so that a single decoding row still spreads
// over many SMs). Dynamic shared memory: blockDim.x floats of reduction scratch, then nsplit
// weights.
extern "C" __global__ void mla_combine(const float* o_part, const float* ml_part, float* out, u32 nsplit, u32 latent) { WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(float, smem);
    const i64 rh = blockIdx.x;
    const float L = mla_split_weights(ml_part + rh * nsplit * 2, nsplit, smem + blockDim.x, smem);
    const float* o = o_part + rh * nsplit * latent;
    for (u32 d = blockIdx.y * blockDim.x + threadIdx.x; d < min(latent, (blockIdx.y + 1) * blockDim.x); d += blockDim.x)
        out[rh * latent + d] = mla_merged_col(o, smem + blockDim.x, nsplit, latent, d) / L;
}

// rope_q_store_kv and the queries' absorption (W_UK, per head `latent` rows of `nope` columns)
// in one launch, for decoding rows: blocks below m · (heads + 1) rope the queries' rope parts
// into q_pe and store the rows' latents as rope_q_store_kv does (no q_nope copy), the rest take
// W_UK's rows as gemv_body does, each head's nope part read in place from q (rows
// heads · (nope + rd) wide). The two read only the projections, so neither waits for the other:
// one dependent step a layer fewer than the rope / store, then W_UK.
template <typename C, int KIND, int R>
__device__ void rope_store_absorb_body(C* layer, const float* q, float* q_lat, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, WeightRef W, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) {
    const u32 rb = m * (heads + 1);
    if (blockIdx.x >= rb) {
        const u32 warps = blockDim.x / WEFT_WARP, rows = heads * latent, b = blockIdx.x - rb;
        if (threadIdx.x == 0) prefetch_rows<KIND>(W, b * warps * R, warps * R, rows, nope);
        WEFT_PDL_ENTRY();
        const u32 r0 = (b * warps + threadIdx.x / WEFT_WARP) * R;
        if (r0 < rows) gemv_rows<KIND, R, 1>(W, q + (i64)(r0 / latent) * (nope + rd), heads * (nope + rd), q_lat, m, rows, nope, r0);
        return;
    }
    WEFT_PDL_ENTRY();
    const u32 b = blockIdx.x;
    if (b < m * heads) rope_into(q + (i64)b * (nope + rd) + nope, pos[b / heads], inv_freq, rd, attn_factor, interleaved, q_pe + (i64)b * rd);
    else store_kv_body(b - m * heads, layer, kv_a, norm_w, pos, slots, inv_freq, latent, rd, eps, attn_factor, interleaved);
}

#define ROPE_ABSORB_ENTRY(CN, C, R)                                                                                     \
    extern "C" __global__ void rope_store_absorb##CN##_bf16_r##R(C* layer, const float* q, float* q_lat, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, const u16* w, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        rope_store_absorb_body<C, WK_BF16, R>(layer, q, q_lat, q_pe, kv_a, norm_w, pos, slots, inv_freq, W, m, heads, nope, latent, rd, eps, attn_factor, interleaved); \
    }                                                                                                                   \
    extern "C" __global__ void rope_store_absorb##CN##_fp8_r##R(C* layer, const float* q, float* q_lat, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        rope_store_absorb_body<C, WK_FP8, R>(layer, q, q_lat, q_pe, kv_a, norm_w, pos, slots, inv_freq, W, m, heads, nope, latent, rd, eps, attn_factor, interleaved); \
    }
ROPE_ABSORB_ENTRY(, float, 1)
ROPE_ABSORB_ENTRY(, float, 2)
ROPE_ABSORB_ENTRY(, float, 4)
ROPE_ABSORB_ENTRY(_kvbf16, u16, 1)
ROPE_ABSORB_ENTRY(_kvbf16, u16, 2)
ROPE_ABSORB_ENTRY(_kvbf16, u16, 4)

// W_UV (per head: `group_rows` rows of the latent's `cols` columns) on the merge of the context
// splits, in one launch: out[i, r] = W[r, :] · merged[i, head(r), :] for i < m, the merged
// latent being mla_combine's (the same weights, sums and bits) of `nsplit` partials. Every block
// lies within one head (the host sizes blocks so: group_rows a multiple of sub-groups · R),
// merges that head's latent for the m rows into shared memory (dynamic: m · cols floats,
// blockDim.x of reduction scratch, nsplit weights) and multiplies its rows by it as gemv_body
// does. One dependent step fewer than mla_combine and then the GEMV, for a few decoding rows;
// each block re-reads its head's partials (from L2), so the host takes it while they are few.
template <int KIND, int R, int T>
__device__ void mla_uv_merge_body(WeightRef W, const float* o_part, const float* ml_part, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 nsplit) {
    WEFT_DYNAMIC_SHARED(float, smem);
    float* xs = smem;
    float* red = smem + (i64)m * cols;
    float* wsh = red + blockDim.x;
    const u32 warps = blockDim.x / WEFT_WARP;
    const u32 b0 = blockIdx.x * warps * R;
    if (threadIdx.x == 0) prefetch_rows<KIND>(W, b0, warps * R, rows, cols);
#ifdef WEFT_MLA_TRIGGER
    WEFT_PDL_TRIGGER();  // (a variant: the output projection's blocks in to prefetch its rows)
#endif
    WEFT_PDL_ENTRY();
    const u32 heads = rows / group_rows, g = b0 / group_rows;
    for (u32 t = 0; t < m; t++) {
        const i64 rh = (i64)t * heads + g;
        const float L = mla_split_weights(ml_part + rh * nsplit * 2, nsplit, wsh, red);
        const float* o = o_part + rh * nsplit * cols;
        for (u32 d = threadIdx.x; d < cols; d += blockDim.x) xs[(i64)t * cols + d] = mla_merged_col(o, wsh, nsplit, cols, d) / L;
        __syncthreads();
    }
    const u32 r0 = b0 + threadIdx.x / WEFT_WARP * R;
    if (r0 < rows) gemv_rows<KIND, R, T>(W, xs, cols, out, m, rows, cols, r0);
}

#define MLA_UV_ENTRY(R, T)                                                                                              \
    extern "C" __global__ void mla_uv_merge_bf16_r##R##_t##T(const u16* w, const float* o_part, const float* ml_part, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 nsplit) { \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        mla_uv_merge_body<WK_BF16, R, T>(W, o_part, ml_part, out, m, rows, cols, group_rows, nsplit);                    \
    }                                                                                                                   \
    extern "C" __global__ void mla_uv_merge_fp8_r##R##_t##T(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* o_part, const float* ml_part, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 nsplit) { \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        mla_uv_merge_body<WK_FP8, R, T>(W, o_part, ml_part, out, m, rows, cols, group_rows, nsplit);                     \
    }
MLA_UV_ENTRY(1, 1)
MLA_UV_ENTRY(2, 1)
MLA_UV_ENTRY(4, 1)
MLA_UV_ENTRY(1, 8)
MLA_UV_ENTRY(2, 8)
MLA_UV_ENTRY(4, 8)

// MLA attention of a long run of one sequence's query rows (a prefill chunk) through cuBLAS
// (src/mla_prefill.rs): the run's cached context and queries go in as two bf16 parts (rounding
// and the rounding's error, as cast_f32_bf16_split), scores and values as three bf16 products
// each (hi·hi + lo·hi + hi·lo, f32 accumulation), so the result tracks the f32 kernels above.
//
// Context token j of the run (one block each) as two bf16 parts, [T][width] each.
extern "C" __global__ void mla_gather_split(const float* __restrict__ kv, const u32* table, u16* hi, u16* lo, u32 ps, u32 width) { WEFT_PDL_ENTRY();
    const u32 j = blockIdx.x;
    const float* src = kv + ((i64)table[j / ps] * ps + j % ps) * width;
    for (u32 d = threadIdx.x; d < width; d += blockDim.x) {
        u16 h = f32_to_bf16(src[d]);
        hi[(i64)j * width + d] = h;
        lo[(i64)j * width + d] = f32_to_bf16(src[d] - bf16_to_f32(h));
    }
}

// The same from a bf16 cache: its values are the first part exactly, and there is no second.
extern "C" __global__ void mla_gather_bf16(const u16* __restrict__ kv, const u32* table, u16* hi, u32 ps, u32 width) { WEFT_PDL_ENTRY();
    const u32 j = blockIdx.x;
    const u16* src = kv + ((i64)table[j / ps] * ps + j % ps) * width;
    for (u32 d = threadIdx.x; d < width; d += blockDim.x) hi[(i64)j * width + d] = src[d];
}

// Query (row, head) = block: q_lat then q_pe, [rows·heads][lat + rd] per part (the per-head
// form passes q_nope as q_lat, its width as lat).
extern "C" __global__ void mla_q_split(const float* __restrict__ q_lat, const float* __restrict__ q_pe, u16* hi, u16* lo, u32 lat, u32 rd) { WEFT_PDL_ENTRY();
    const i64 rh = blockIdx.x;
    const u32 w = lat + rd;
    for (u32 d = threadIdx.x; d < w; d += blockDim.x) {
        float v = d < lat ? q_lat[rh * lat + d] : q_pe[rh * rd + d - lat];
        u16 h = f32_to_bf16(v);
        hi[rh * w + d] = h;
        lo[rh * w + d] = f32_to_bf16(v - bf16_to_f32(h));
    }
}

// Keys of the decompressed (per-head) prefill form as two bf16 parts [t][heads][nope + rd]
// (block = position · heads + head): the head's non-positional key k_nope [t][heads][nope] (f32,
// from the decompression GEMMs) split, then the position's rotary key, shared by every head,
// copied from the gathered context parts (columns lat.. of c_hi / c_lo, [t][w]; has_lo = 0: a
// bf16 cache, whose second part is zero). lo_out = 0: the first part alone (lo is not written).
extern "C" __global__ void mla_k_split(const float* __restrict__ k_nope, const u16* __restrict__ c_hi, const u16* __restrict__ c_lo, int has_lo, u16* hi, u16* lo, u32 heads, u32 nope, u32 lat, u32 rd, u32 w, int lo_out) { WEFT_PDL_ENTRY();
    const i64 th = blockIdx.x, t = th / heads;
    const u32 kw = nope + rd;
    for (u32 d = threadIdx.x; d < kw; d += blockDim.x) {
        u16 h, l;
        if (d < nope) {
            float v = k_nope[th * nope + d];
            h = f32_to_bf16(v);
            l = f32_to_bf16(v - bf16_to_f32(h));
        } else {
            h = c_hi[t * w + lat + d - nope];
            l = has_lo ? c_lo[t * w + lat + d - nope] : (u16)0;
        }
        hi[th * kw + d] = h;
        if (lo_out) lo[th * kw + d] = l;
    }
}

// Softmax of one (head, row) of scores s [heads][rows][t] (block blockIdx.x = head·rows + row):
// row i sees the first ctx0 + i + 1 positions (causal within the run), the rest get weight 0;
// the weights go out as two bf16 parts (the second only with lo_out).
extern "C" __global__ void mla_softmax_split(const float* __restrict__ s, u16* phi, u16* plo, u32 rows, u32 t, u32 ctx0, float scale, int lo_out) { WEFT_PDL_ENTRY();
    __shared__ float sh[1024];
    const i64 o = (i64)blockIdx.x * t;
    const u32 len = min(ctx0 + blockIdx.x % rows + 1, t);
    float mx = -WEFT_INF;
    for (u32 j = threadIdx.x; j < len; j += blockDim.x) mx = fmaxf(mx, s[o + j] * scale);
    mx = block_max(mx, sh);
    float sum = 0.f;
    for (u32 j = threadIdx.x; j < len; j += blockDim.x) sum += expf(s[o + j] * scale - mx);
    const float inv = 1.0f / block_sum(sum, sh);
    for (u32 j = threadIdx.x; j < t; j += blockDim.x) {
        float p = j < len ? expf(s[o + j] * scale - mx) * inv : 0.f;
        u16 h = f32_to_bf16(p);
        phi[o + j] = h;
        if (lo_out) plo[o + j] = f32_to_bf16(p - bf16_to_f32(h));
    }
}

// ---------------------------------------------------------------------------------------------
// mla_decode on tensor cores (NVIDIA sm_80+, `mma.sync` m16n8k16 from mma.cu): same inputs,
// launch grid, partial outputs and merge (mla_combine) as mla_decode, for up to 16 heads per
// block (one m16 tile; fewer heads leave rows of it zero) and latent widths up to 512. The f32
// cache and queries go in as two bf16 parts each (rounding + the rounding's error), every
// product as three (hi·hi + lo·hi + hi·lo, f32 accumulation), so the result tracks the CUDA-core
// kernel to ~4e-6 while the CUDA cores only split and the tensor cores do the arithmetic —
// which bound mla_decode (~15 % of copy bandwidth at 64 × 4096).
//
// W warps (8 or 16). A tile of T tokens (f32, all `latent + rope` columns) is copied into
// shared memory with cp.async while earlier tiles are used (S buffers: the next S − 1 tiles in flight). Scores: warp
// (kq, th) multiplies the block's queries (held in registers as A fragments, its part kq of
// W/2 parts of the width) by the tile's half th; the parts' partial scores meet in shared
// memory. Softmax: 2W threads per head, running max and sum in their registers; the weights go
// out as bf16 parts. Values: each warp owns 512/W latent columns for every head. More warps
// hold fewer query fragments and accumulators each (registers allow 512 threads), so twice as
// many warps hide each other's latencies — the kernel is bound by issue, not by memory.
// The k order inside each 16-column step of the score product is ours (A and B agree): lane t
// holds columns 4t..4t+3, one float4 from each. Shared-memory rows are w + pad floats with the
// stride ≡ 20 (mod 32) words for w ≡ 0 (mod 32): the value pass's column reads (8 columns ×
// tokens 2t, 2t+1, 2t+8, 2t+9) hit 32 distinct banks.

// (cp.async helpers: kernels/weft_port.h.)

// ldmatrix.x4.trans: four 8×8 blocks of b16 from shared memory, each transposed into the
// mma B-fragment layout (lane g, t gets rows 2t and 2t + 1 of column g); lane l gives the
// address of row l % 8 of block l / 8 (16-byte aligned).
#if !defined(WEFT_NO_PTX)
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], const void* row) {
    const u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], const void* row) { emu_ldsm_x4_trans(r, row); }
#else
// AMD: the tensor-core kernels are never launched there (mma.cu).
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], const void*) { __builtin_trap(); }
#endif

// Elements per shared-memory row of the tile: f32 rows of ≡ 20 words (mod 32) (see above);
// bf16 rows of ≡ 4 words (mod 32), where fragments are read in the standard mma layout (below).
template <typename C>
__device__ __forceinline__ u32 mlt_stride(u32 w) {
    if (sizeof(C) == 4) return w + (52u - w % 32u) % 32u;
    const u32 words = w / 2;
    return 2 * (words + (36u - words % 32u) % 32u);
}

// Tokens base..base+MLT_T-1 (MLT_T: the tile size) of the row's context into buf (rows past
// `end` zero-filled). A tile starts at a multiple of MLT_T, so with pages of a multiple of MLT_T
// tokens (64 in practice)
// it lies in one page: one block-table lookup per tile, not a dependent global load before
// every copy (the copies' asm orders them). Other page sizes look up every row.
template <int MLT_T, typename C>
__device__ __forceinline__ void mlt_load(C* buf, const C* layer, const u32* table, u32 base, u32 end, u32 page, u32 w, u32 ks) {
    constexpr u32 V = 16 / sizeof(C);  // elements per 16-byte copy
    const u32 w4 = w / V, chunks = MLT_T * w4;
    const bool one_page = page % MLT_T == 0;
    const i64 row0 = one_page ? (i64)table[base / page] * page + base % page : 0;
    u32 tt = threadIdx.x / w4, j = threadIdx.x % w4;
    const u32 step_t = blockDim.x / w4, step_j = blockDim.x % w4;
    for (u32 i = threadIdx.x; i < chunks; i += blockDim.x) {
        const u32 tok = base + tt;
        const C* src = layer;
        u32 bytes = 0;
        if (tok < end) {
            const i64 r = one_page ? row0 + tt : (i64)table[tok / page] * page + tok % page;
            src = layer + r * w + V * j;
            bytes = 16;
        }
        cp_async16((float*)(buf + tt * ks + V * j), (const float*)src, bytes);
        tt += step_t;
        j += step_j;
        if (j >= w4) {
            j -= w4;
            tt++;
        }
    }
    cp_async_commit();
}

// What a block of the tensor-core decode kernels serves: row blockIdx.x / groups, heads
// h0..h0 + hg of it, its split blockIdx.y's context range and the row's block table.
struct MlaBlock {
    u32 row, h0, hg, t_begin, t_end;
    const u32* table;
};
__device__ __forceinline__ MlaBlock mla_block(u32 tile, const u32* ctx, const u32* bt, const u32* bt_off, u32 heads, u32 groups, u32 gsize, u32 chunk) {
    MlaBlock b;
    b.row = blockIdx.x / groups;
    b.h0 = blockIdx.x % groups * gsize;
    b.hg = min(gsize, heads - b.h0);
    split_range(ctx[b.row], blockIdx.y, gridDim.y, tile, chunk, b.t_begin, b.t_end);
    b.table = bt + bt_off[b.row];
    return b;
}

// Online softmax over one tile for head sh (HT threads per head, E tokens each from column sc):
// adds the KQ partial scores of each column (rows q · rstride + sh of `red`, RS floats each),
// masks columns past `cnt` (and heads past `hg`: weight 0), updates the running max and sum,
// and writes the rescale factor and the weights as two bf16 parts (rows of PS u16). Two weights
// at a time where E is even (one cvt.rn.bf16x2 on NVIDIA).
template <int E, int HT, int KQ, int RS, int PS>
__device__ __forceinline__ void mla_tile_softmax(const float* red, u32 rstride, u32 sh, u32 sc, u32 cnt, u32 hg, float scale, float& m_run, float& l_run, float* corr, u16* phi, u16* plo) {
    float v[E];
    float mx = -WEFT_INF;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const u32 c = sc + e;
        float x = 0.f;
#pragma unroll
        for (int q = 0; q < KQ; q++) x += red[(q * rstride + sh) * RS + c];
        v[e] = c < cnt ? x * scale : -WEFT_INF;
        mx = fmaxf(mx, v[e]);
    }
#pragma unroll
    for (int o = HT / 2; o > 0; o >>= 1) mx = fmaxf(mx, lane_xor(mx, o));
    const float m_new = fmaxf(m_run, mx);
    const float c = expf(m_run - m_new);
    float p[E], sum = 0.f;
#pragma unroll
    for (int e = 0; e < E; e++) {
        p[e] = sh < hg ? expf(v[e] - m_new) : 0.f;
        sum += p[e];
    }
#pragma unroll
    for (int o = HT / 2; o > 0; o >>= 1) sum += lane_xor(sum, o);
    l_run = l_run * c + sum;
    m_run = m_new;
    if (sc == 0) corr[sh] = c;
    if (E % 2 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            u32 h2, l2;
            split_bf16x2(p[e], p[e + 1 < E ? e + 1 : e], h2, l2);
            *(u32*)(phi + sh * PS + sc + e) = h2;
            *(u32*)(plo + sh * PS + sc + e) = l2;
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const u16 h = f32_to_bf16(p[e]);
            phi[sh * PS + sc + e] = h;
            plo[sh * PS + sc + e] = f32_to_bf16(p[e] - bf16_to_f32(h));
        }
    }
}

// The value pass of one tile for one m-tile (head rows r0 = its first row + g, and r0 + 8):
// rescales this warp's accumulators (NT n-tiles of 8 latent columns from 8·NT·warp) by the
// heads' factors, then adds weights (two bf16 parts, rows of PS) × the tile's latent columns.
// C = u16: two n-tiles' B fragments per ldmatrix — 8×8 blocks (tokens 0-7 | 8-15 of the k
// step) × (columns d0.. | d0 + 8..), transposed into the col layout; f32: each column split.
template <int T, int NT, int PS, typename C>
__device__ __forceinline__ void mla_tile_values(float (&acc)[NT][4], const C* kv, u32 ks, const u16* phi, const u16* plo, const float* corr, u32 r0, u32 warp, u32 latent) {
    constexpr int CW = 8 * NT;
    const u32 lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float c0 = corr[r0], c1 = corr[r0 + 8];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        acc[j][0] *= c0;
        acc[j][1] *= c0;
        acc[j][2] *= c1;
        acc[j][3] *= c1;
    }
#pragma unroll
    for (int kk = 0; kk < T / 16; kk++) {
        const u32 tb = kk * 16 + 2 * t;
        const u32 ah[4] = {*(const u32*)(phi + r0 * PS + tb), *(const u32*)(phi + (r0 + 8) * PS + tb), *(const u32*)(phi + r0 * PS + tb + 8), *(const u32*)(phi + (r0 + 8) * PS + tb + 8)};
        const u32 al[4] = {*(const u32*)(plo + r0 * PS + tb), *(const u32*)(plo + (r0 + 8) * PS + tb), *(const u32*)(plo + r0 * PS + tb + 8), *(const u32*)(plo + (r0 + 8) * PS + tb + 8)};
        if (sizeof(C) == 2) {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const u32 d0 = CW * warp + 8 * j, mi = lane / 8;
                if (d0 < latent) {
                    u32 b[4];
                    ldsm_x4_trans(b, kv + (kk * 16 + (mi & 1) * 8 + lane % 8) * ks + d0 + (mi >> 1) * 8);
                    mma_bf16_16816(acc[j], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
                    mma_bf16_16816(acc[j], al[0], al[1], al[2], al[3], b[0], b[1]);
                    if (d0 + 8 < latent) {
                        mma_bf16_16816(acc[j + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
                        mma_bf16_16816(acc[j + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u32 d0 = CW * warp + 8 * j;
                if (d0 < latent) {
                    const C* col = kv + tb * ks + d0 + g;
                    u32 bh0, bl0, bh1, bl1;
                    split_bf16x2(col[0], col[ks], bh0, bl0);
                    split_bf16x2(col[8 * ks], col[9 * ks], bh1, bl1);
                    mma_bf16_16816(acc[j], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
                    mma_bf16_16816(acc[j], al[0], al[1], al[2], al[3], bh0, bh1);
                    mma_bf16_16816(acc[j], ah[0], ah[1], ah[2], ah[3], bl0, bl1);
                }
            }
        }
    }
}

// Dynamic shared memory: tiles [S][T][ks] of C, partial scores [W/2][16][T] f32, weights hi/lo
// [16][T + 8] u16 each, per-head rescale [16] f32 (mla.rs: mla_mma_smem). T = 32 or 16 tokens
// per tile, W = 8 or 16 warps (one variant is built: below).
// C = u16: a bf16 cache. Its values are bf16 already: one part, so scores and values take two
// products each (queries' and weights' two parts), and the B fragments are read as stored —
// the score pass's in the standard mma layout (lane t: columns 2t, 2t + 1, 2t + 8, 2t + 9 as
// two words), the value pass's as four bf16 of one column.
template <int T, int W, int S, typename C>
__device__ __forceinline__ void mla_mma_body(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    constexpr int PS = T + 8;          // u16 stride of the weights' rows
    constexpr int KQ = W / 2;          // parts of the width in the score product
    constexpr int KS = (36 + KQ - 1) / KQ; // its k16 steps per warp (width <= 576)
    constexpr int NJ = T / 16;         // n-tiles of 8 tokens per score warp (tokens 8·NJ·th..)
    constexpr int HT = 2 * W;          // softmax threads per head
    constexpr int E = T / HT;          // tokens per softmax thread
    constexpr int NT = 64 / W;         // n-tiles of 8 latent columns per value warp
    constexpr int CW = 8 * NT;         // latent columns per value warp
    constexpr int RS = T + 8;          // floats per row of the partial scores (conflict-free writes)
    constexpr bool BF = sizeof(C) == 2;
    static_assert(E >= 1 && NJ >= 1 && NT >= 2 && NT % 2 == 0, "tile and warp counts");
    WEFT_DYNAMIC_SHARED(float, smem);
    const u32 w = latent + rd, ks = mlt_stride<C>(w);
    const MlaBlock B = mla_block(T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 row = B.row, h0 = B.h0, hg = B.hg, nsplit = gridDim.y, split = blockIdx.y, t_begin = B.t_begin, t_end = B.t_end;
    const u32* table = B.table;
    C* tiles = (C*)smem;
    float* red = (float*)(tiles + S * T * ks);
    u16* phi = (u16*)(red + KQ * 16 * RS);
    u16* plo = phi + 16 * PS;
    float* corr = (float*)(plo + 16 * PS);
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const u32 kq = warp % KQ, th = warp / KQ;
    const u32 nks = w / 16, ks0 = kq * nks / KQ, ks1 = (kq + 1) * nks / KQ;
    const u32 ntiles = (t_end - t_begin + T - 1) / T;
    // Tiles 0..S-2 in flight before the loop: one commit group each (empty past the last tile,
    // so that every iteration waits for the same count).
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if ((u32)st < ntiles) mlt_load<T>(tiles + st * T * ks, layer, table, t_begin + st * T, t_end, page, w, ks);
        else cp_async_commit();
    }

    // This warp's part of the queries as A fragments (rows: heads g, g + 8 of the block).
    u32 qa[KS][4], qb[KS][4];
#pragma unroll
    for (int i = 0; i < KS; i++) {
        float4 x[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            x[r] = make_float4(0.f, 0.f, 0.f, 0.f);
            const u32 h = g + 8 * r;
            if (ks0 + i < ks1 && h < hg) {
                const i64 qh = (i64)row * heads + h0 + h;
                if (BF) {
                    // Columns 2t, 2t + 1 (x, y) and 2t + 8, 2t + 9 (z, w): the standard layout.
                    const u32 d = (ks0 + i) * 16 + 2 * t;
                    float2 a = d < latent ? *(const float2*)(q_lat + qh * latent + d) : *(const float2*)(q_pe + qh * rd + d - latent);
                    float2 b = d + 8 < latent ? *(const float2*)(q_lat + qh * latent + d + 8) : *(const float2*)(q_pe + qh * rd + d + 8 - latent);
                    x[r] = make_float4(a.x, a.y, b.x, b.y);
                } else {
                    const u32 d = (ks0 + i) * 16 + 4 * t;
                    x[r] = d < latent ? *(const float4*)(q_lat + qh * latent + d) : *(const float4*)(q_pe + qh * rd + d - latent);
                }
            }
        }
        split_bf16x2(x[0].x, x[0].y, qa[i][0], qb[i][0]);
        split_bf16x2(x[1].x, x[1].y, qa[i][1], qb[i][1]);
        split_bf16x2(x[0].z, x[0].w, qa[i][2], qb[i][2]);
        split_bf16x2(x[1].z, x[1].w, qa[i][3], qb[i][3]);
    }
    // Softmax state of head sh (its HT threads hold identical copies).
    const u32 sh = threadIdx.x / HT, sc = E * (threadIdx.x % HT);
    float m_run = -WEFT_INF, l_run = 0.f;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.f;

    for (u32 it = 0; it < ntiles; it++) {
        const C* kv = tiles + (it % S) * T * ks;
        const u32 base = t_begin + it * T, cnt = min((u32)T, t_end - base);
        // Tile it + S - 1 into the buffer tile it - 1 used (free since the loop's last barrier).
        if (it + S - 1 < ntiles) mlt_load<T>(tiles + ((it + S - 1) % S) * T * ks, layer, table, base + (S - 1) * T, t_end, page, w, ks);
        else cp_async_commit();
        cp_async_wait<S - 1>();
        __syncthreads();
        {
            // Even and odd k steps accumulate apart (two independent mma chains per n-tile).
            float s[2][NJ][4];
            zero_acc(s);
#pragma unroll
            for (int i = 0; i < KS; i++) {
                if (ks0 + i < ks1) {
#pragma unroll
                    for (int j = 0; j < NJ; j++) {
                        float(&sc4)[4] = s[i & 1][j];
                        if (BF) {
                            const C* kr = kv + (th * 8 * NJ + j * 8 + g) * ks + (ks0 + i) * 16 + 2 * t;
                            const u32 b0 = *(const u32*)kr, b1 = *(const u32*)(kr + 8);
                            mma_bf16_16816(sc4, qa[i][0], qa[i][1], qa[i][2], qa[i][3], b0, b1);
                            mma_bf16_16816(sc4, qb[i][0], qb[i][1], qb[i][2], qb[i][3], b0, b1);
                        } else {
                            const float4 k4 = *(const float4*)(kv + (th * 8 * NJ + j * 8 + g) * ks + (ks0 + i) * 16 + 4 * t);
                            u32 bh0, bl0, bh1, bl1;
                            split_bf16x2(k4.x, k4.y, bh0, bl0);
                            split_bf16x2(k4.z, k4.w, bh1, bl1);
                            mma_bf16_16816(sc4, qa[i][0], qa[i][1], qa[i][2], qa[i][3], bh0, bh1);
                            mma_bf16_16816(sc4, qb[i][0], qb[i][1], qb[i][2], qb[i][3], bh0, bh1);
                            mma_bf16_16816(sc4, qa[i][0], qa[i][1], qa[i][2], qa[i][3], bl0, bl1);
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const u32 c = th * 8 * NJ + j * 8 + 2 * t;
                *(float2*)(red + (kq * 16 + g) * RS + c) = make_float2(s[0][j][0] + s[1][j][0], s[0][j][1] + s[1][j][1]);
                *(float2*)(red + (kq * 16 + g + 8) * RS + c) = make_float2(s[0][j][2] + s[1][j][2], s[0][j][3] + s[1][j][3]);
            }
        }
        __syncthreads();
        mla_tile_softmax<E, HT, KQ, RS, PS>(red, 16, sh, sc, cnt, hg, scale, m_run, l_run, corr, phi, plo);
        __syncthreads();
        mla_tile_values<T, NT, PS>(acc, kv, ks, phi, plo, corr, g, warp, latent);
        __syncthreads();
    }
    const i64 part = ((i64)row * heads + h0) * nsplit + split;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const u32 d = CW * warp + 8 * j + 2 * t;
        if (CW * warp + 8 * j < latent) {
            if (g < hg) *(float2*)(o_part + (part + (i64)g * nsplit) * latent + d) = make_float2(acc[j][0], acc[j][1]);
            if (g + 8 < hg) *(float2*)(o_part + (part + (i64)(g + 8) * nsplit) * latent + d) = make_float2(acc[j][2], acc[j][3]);
        }
    }
    if (sc == 0 && sh < hg) {
        ml_part[(part + (i64)sh * nsplit) * 2] = m_run;
        ml_part[(part + (i64)sh * nsplit) * 2 + 1] = l_run;
    }
}

#define WEFT_MLA_MMA(name, T, W, S, C) \
    extern "C" __global__ void __launch_bounds__(32 * W, 1) name(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) { \
        WEFT_PDL_ENTRY(); \
        mla_mma_body<T, W, S, C>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk); \
    }
// 32-token tiles, 16 warps. Measured on the H200 (mla_bench, 64 x 4096, 16 heads): 8 warps
// 348 us, 16-token tiles with 8 warps 441 us, this 311 us.
// Two tile buffers (one tile in flight) for either cache: with bf16 tiles, 3, 4 and 5 buffers
// measured 3-4 % slower than 2 (mla_bench 64 x 4096, 16 and 64 heads; round 8) — the kernel is
// not waiting on memory. (Three f32 buffers would not fit in shared memory.)
WEFT_MLA_MMA(mla_decode_mma, 32, 16, 2, float)
WEFT_MLA_MMA(mla_decode_mma_bf16, 32, 16, 2, u16)
