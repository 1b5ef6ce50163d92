// Absorbed MLA attention over the paged latent pool, split along the context ("flash
// decoding"): block (row * groups + head group, split) loads tiles of MLA_T cached tokens into
// shared memory once and scores them against every head of its group (MLA shares one latent
// per token across all heads), keeping an online softmax per head. Each split writes its
// unnormalised output and (max, sum); mla_combine merges the splits. Works for any number of
// query rows per sequence (decode, speculative verification, prefill chunks: each row has
// its own visible context).
#define MLA_T 16
#define MLA_HG 16

// Dynamic shared memory: q [hg][w], kv [MLA_T][w + 1] (padded: conflict-free column reads),
// p [MLA_HG][MLA_T], corr / m / l [MLA_HG].
extern "C" __global__ void mla_decode(const float* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    extern __shared__ float smem[];
    u32 w = latent + rd, wp = w + 1;
    u32 hg = min((u32)MLA_HG, heads);
    float* q = smem;
    float* kv = q + hg * w;
    float* p = kv + MLA_T * wp;
    float* corr = p + MLA_HG * MLA_T;
    float* mrun = corr + MLA_HG;
    float* lrun = mrun + MLA_HG;
    u32 row = blockIdx.x / groups, grp = blockIdx.x % groups;
    u32 h0 = grp * hg;
    u32 nsplit = gridDim.y, split = blockIdx.y;
    u32 n = ctx[row];
    u32 t_begin = split * chunk, t_end = min(n, t_begin + chunk);
    const u32* table = bt + bt_off[row];
    for (u32 i = threadIdx.x; i < hg * w; i += blockDim.x) {
        u32 h = i / w, j = i % w;
        i64 qh = (i64)row * heads + h0 + h;
        q[i] = j < latent ? q_lat[qh * latent + j] : q_pe[qh * rd + (j - latent)];
    }
    if (threadIdx.x < MLA_HG) { mrun[threadIdx.x] = -WEFT_INF; lrun[threadIdx.x] = 0.f; }
    // Each thread owns output dims d = threadIdx.x + k*blockDim.x (k < 2) for every head.
    float acc[MLA_HG][2];
#pragma unroll
    for (int h = 0; h < MLA_HG; h++) { acc[h][0] = 0.f; acc[h][1] = 0.f; }
    __syncthreads();
    for (u32 base = t_begin; base < t_end; base += MLA_T) {
        u32 cnt = min((u32)MLA_T, t_end - base);
        // Rows past the context are zeroed: the value pass multiplies every row of the tile
        // (by a zero weight), and 0 × stale shared memory can be NaN.
        for (u32 i = threadIdx.x; i < MLA_T * w; i += blockDim.x) {
            u32 t = i / w, j = i % w;
            u32 tt = base + t;
            kv[t * wp + j] = t < cnt ? layer[((i64)table[tt / page] * page + tt % page) * w + j] : 0.f;
        }
        __syncthreads();
        // Scores: one (head, token) pair per thread per pass.
        for (u32 i = threadIdx.x; i < hg * MLA_T; i += blockDim.x) {
            u32 h = i / MLA_T, t = i % MLA_T;
            float s = -WEFT_INF;
            if (t < cnt) {
                const float* qh = q + h * w;
                const float* kt = kv + t * wp;
                float a = 0.f, b = 0.f;
                for (u32 j = 0; j < latent; j++) a += qh[j] * kt[j];
                for (u32 j = latent; j < w; j++) b += qh[j] * kt[j];
                s = (a + b) * scale;
            }
            p[h * MLA_T + t] = s;
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
#pragma unroll
        for (int k = 0; k < 2; k++) {
            u32 d = threadIdx.x + k * blockDim.x;
            if (d < latent) {
                float v[MLA_T];
#pragma unroll
                for (int t = 0; t < MLA_T; t++) v[t] = kv[t * wp + d];
#pragma unroll
                for (int h = 0; h < MLA_HG; h++) {
                    if (h < (int)hg) {
                        float a = acc[h][k] * corr[h];
#pragma unroll
                        for (int t = 0; t < MLA_T; t++) a += p[h * MLA_T + t] * v[t];
                        acc[h][k] = a;
                    }
                }
            }
        }
        __syncthreads();
    }
    i64 part = ((i64)row * heads + h0) * nsplit + split;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        u32 d = threadIdx.x + k * blockDim.x;
        if (d < latent)
            for (u32 h = 0; h < hg; h++) o_part[(part + (i64)h * nsplit) * latent + d] = acc[h][k];
    }
    if (threadIdx.x < hg) {
        ml_part[(part + (i64)threadIdx.x * nsplit) * 2] = mrun[threadIdx.x];
        ml_part[(part + (i64)threadIdx.x * nsplit) * 2 + 1] = lrun[threadIdx.x];
    }
}

// One block per (row, head): merges the splits' partial outputs.
extern "C" __global__ void mla_combine(const float* o_part, const float* ml_part, float* out, u32 nsplit, u32 latent) {
    i64 rh = blockIdx.x;
    float M = -WEFT_INF;
    for (u32 s = 0; s < nsplit; s++) M = fmaxf(M, ml_part[(rh * nsplit + s) * 2]);
    float L = 0.f;
    for (u32 s = 0; s < nsplit; s++) {
        float m = ml_part[(rh * nsplit + s) * 2];
        L += m == -WEFT_INF ? 0.f : expf(m - M) * ml_part[(rh * nsplit + s) * 2 + 1];
    }
    for (u32 d = threadIdx.x; d < latent; d += blockDim.x) {
        float a = 0.f;
        for (u32 s = 0; s < nsplit; s++) {
            float m = ml_part[(rh * nsplit + s) * 2];
            if (m != -WEFT_INF) a += expf(m - M) * o_part[(rh * nsplit + s) * latent + d];
        }
        out[rh * latent + d] = a / L;
    }
}
