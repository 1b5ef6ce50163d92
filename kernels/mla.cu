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
extern "C" __global__ void mla_decode(const float* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) { WEFT_PDL_ENTRY();
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
    u32 t_begin = split * chunk, t_end = min(n, t_begin + chunk);
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
            if (t < cnt) v = ((const float4*)layer)[((i64)table[tt / page] * page + tt % page) * w4 + j];
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

// One block per (row, head): merges the splits' partial outputs. The splits' weights
// exp(m_s - M) / L are computed once, in parallel, into shared memory (dynamic: blockDim.x
// floats of reduction scratch, then nsplit weights); each output dim then sums independent
// loads over the splits.
extern "C" __global__ void mla_combine(const float* o_part, const float* ml_part, float* out, u32 nsplit, u32 latent) { WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(float, smem);
    float* red = smem;
    float* wsh = smem + blockDim.x;
    i64 rh = blockIdx.x;
    const float* ml = ml_part + rh * nsplit * 2;
    float mx = -WEFT_INF;
    for (u32 s = threadIdx.x; s < nsplit; s += blockDim.x) mx = fmaxf(mx, ml[2 * s]);
    float M = block_max(mx, red);
    float l = 0.f;
    for (u32 s = threadIdx.x; s < nsplit; s += blockDim.x) {
        float m = ml[2 * s];
        float e = m == -WEFT_INF ? 0.f : expf(m - M);
        wsh[s] = e;
        l += e * ml[2 * s + 1];
    }
    float L = block_sum(l, red);
    const float* o = o_part + rh * nsplit * latent;
    for (u32 d = threadIdx.x; d < latent; d += blockDim.x) {
        // Unrolled so that 16 loads are in flight before their sums need them.
        float a = 0.f;
#pragma unroll 16
        for (u32 s = 0; s < nsplit; s++) a += wsh[s] * o[(i64)s * latent + d];
        out[rh * latent + d] = a / L;
    }
}

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

// Query (row, head) = block: q_lat then q_pe, [rows·heads][lat + rd] per part.
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

// Softmax of one (head, row) of scores s [heads][rows][t] (block blockIdx.x = head·rows + row):
// row i sees the first ctx0 + i + 1 positions (causal within the run), the rest get weight 0;
// the weights go out as two bf16 parts.
extern "C" __global__ void mla_softmax_split(const float* __restrict__ s, u16* phi, u16* plo, u32 rows, u32 t, u32 ctx0, float scale) { WEFT_PDL_ENTRY();
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
        plo[o + j] = f32_to_bf16(p - bf16_to_f32(h));
    }
}
