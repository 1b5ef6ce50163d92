// weft's GPU kernels (correctness-first versions), compiled at start-up with NVRTC.
// Every kernel is checked against the CPU reference backend (runtime/backend/src/cpu).
// Block size is a power of two (BLOCK) for the reductions.
#define BLOCK 256

// Four bf16 of four floats, packed in order.
__device__ __forceinline__ uint2 bf16x4_of(float4 v) {
    return make_uint2((u32)f32_to_bf16(v.x) | (u32)f32_to_bf16(v.y) << 16, (u32)f32_to_bf16(v.z) | (u32)f32_to_bf16(v.w) << 16);
}

// Casts run four values a thread (16-byte loads, 8-byte stores) when the buffers allow it, over
// a grid of n / 4 threads; the rest (or everything, unaligned) one value a thread.
__device__ __forceinline__ bool casts_by_four(const void* x, const void* a, const void* b) {
    return ((u64)x % 16 | (u64)a % 8 | (u64)b % 8) == 0;
}

extern "C" __global__ void cast_f32_bf16(const float* x, u16* y, i64 n) { WEFT_PDL_ENTRY();
    const i64 n4 = casts_by_four(x, y, y) ? n / 4 : 0, stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n4; i += stride) ((uint2*)y)[i] = bf16x4_of(((const float4*)x)[i]);
    for (i64 i = 4 * n4 + blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f32_to_bf16(x[i]);
}

// x as two bf16 arrays, its rounding hi and the rounding's error lo (hi + lo: 16 mantissa bits),
// for GEMMs whose products should track f32 activations (two passes, the second adding).
extern "C" __global__ void cast_f32_bf16_split(const float* x, u16* hi, u16* lo, i64 n) { WEFT_PDL_ENTRY();
    const i64 n4 = casts_by_four(x, hi, lo) ? n / 4 : 0, stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = ((const float4*)x)[i];
        const uint2 h = bf16x4_of(v);
        ((uint2*)hi)[i] = h;
        ((uint2*)lo)[i] = bf16x4_of(make_float4(v.x - bf16_to_f32((u16)h.x), v.y - bf16_to_f32((u16)(h.x >> 16)), v.z - bf16_to_f32((u16)h.y), v.w - bf16_to_f32((u16)(h.y >> 16))));
    }
    for (i64 i = 4 * n4 + blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += stride) {
        u16 h = f32_to_bf16(x[i]);
        hi[i] = h;
        lo[i] = f32_to_bf16(x[i] - bf16_to_f32(h));
    }
}

extern "C" __global__ void embed_bf16(const u16* table, const u32* ids, float* out, u32 d) { WEFT_PDL_ENTRY();
    const u16* row = table + (i64)ids[blockIdx.x] * d;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) out[(i64)blockIdx.x * d + j] = bf16_to_f32(row[j]);
}

extern "C" __global__ void gather_rows(const float* x, const u32* rows, float* out, u32 d) { WEFT_PDL_ENTRY();
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) out[(i64)blockIdx.x * d + j] = x[(i64)rows[blockIdx.x] * d + j];
}

// Sum over the block by sub-group sums (two barriers); blockDim.x a multiple of WEFT_WARP,
// `sh` at least blockDim.x / WEFT_WARP floats.
__device__ __forceinline__ float block_sum_lanes(float v, float* sh) {
    v = warp_sum(v);
    u32 nw = blockDim.x / WEFT_WARP;
    if (threadIdx.x % WEFT_WARP == 0) sh[threadIdx.x / WEFT_WARP] = v;
    __syncthreads();
    float t = 0.f;
    for (u32 i = 0; i < nw; i++) t += sh[i];
    __syncthreads();
    return t;
}

// out = w * x / sqrt(mean(x^2) + eps), one block per row.
// (`out`: f32, or the bf16 latent cache.)
template <typename O>
__device__ void rms_row(const float* x, const float* w, O* out, u32 dim, float eps, float* sh) {
    float s = 0.f;
    for (u32 j = threadIdx.x; j < dim; j += blockDim.x) s += x[j] * x[j];
    float ms = block_sum_lanes(s, sh) / (float)dim;
    float r = 1.0f / sqrtf(ms + eps);
    for (u32 j = threadIdx.x; j < dim; j += blockDim.x) kv_st(out + j, w[j] * (x[j] * r));
}

// Rows up to 4 * RMS_V * blockDim.x wide (the host sizes the block by the row: 256 threads for
// 2048, 896 for 7168) are held in registers between the sum of squares and the scaling, as
// RMS_V float4s a thread (one read of the input, 16-byte accesses), and summed with sub-group
// sums (two barriers, not one per tree level): these norms run twice per layer on one row at
// batch 1, where latency is all, and over every prompt row at prefill, where they must stream.
// Few registers a thread (~40): the first version held 32 floats of each operand whatever the
// row, took 253 registers and one block per SM, and ran at ~40 % of copy bandwidth.
#define RMS_V 2

// Whether rms_row_v4 takes a row: width a multiple of 4 within the block's registers, every
// row start 16-byte aligned.
__device__ __forceinline__ bool rms_v4_fits(u32 dim, const void* a, const void* b, const void* c, const void* d) {
    return dim % 4 == 0 && dim <= 4 * RMS_V * blockDim.x && (((u64)a | (u64)b | (u64)c | (u64)d) & 15) == 0;
}

// out = w * x / rms(x) for the row a block holds as RMS_V float4s a thread (values 4 · (thread
// + k · blockDim.x) on), its norm weights beside them: the sum of squares in this order, then
// one block sum (every caller's bits the same).
__device__ __forceinline__ void rms_v4_scale(const float4 (&v)[RMS_V], const float4 (&wv)[RMS_V], float* out, u32 dim, float eps, float* sh) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < RMS_V; k++) s += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    const float r = 1.0f / sqrtf(block_sum_lanes(s, sh) / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < RMS_V; k++) {
        const u32 j = 4 * (threadIdx.x + k * blockDim.x);
        if (j < dim) *(float4*)(out + j) = make_float4(wv[k].x * (v[k].x * r), wv[k].y * (v[k].y * r), wv[k].z * (v[k].z * r), wv[k].w * (v[k].w * r));
    }
}

// x = src (+ delta, written back to res when ADD; with HALF, delta is the hi half of a stacked
// two-part product whose lo half lies `half` values on, the two added first as add_halves
// does); out = w * x / rms(x).
template <bool ADD, bool HALF = false>
__device__ void rms_row_v4(const float* src, const float* delta, float* res, const float* w, float* out, u32 dim, float eps, float* sh, i64 half = 0) {
    // Every load is issued before the first store: `res` aliases `src`, so a store between
    // them would make each load wait for the previous one (a latency chain per element).
    // The norm weights are loaded with the row, not after the reduction (one latency, not two).
    float4 v[RMS_V], dv[RMS_V], wv[RMS_V];
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < RMS_V; k++) {
        const u32 j = 4 * (threadIdx.x + k * blockDim.x);
        v[k] = j < dim ? *(const float4*)(src + j) : z;
        dv[k] = ADD && j < dim ? *(const float4*)(delta + j) : z;
        if (HALF && j < dim) {
            const float4 lo = *(const float4*)(delta + half + j);
            dv[k] = make_float4(dv[k].x + lo.x, dv[k].y + lo.y, dv[k].z + lo.z, dv[k].w + lo.w);
        }
        wv[k] = j < dim ? *(const float4*)(w + j) : z;
    }
#pragma unroll
    for (int k = 0; k < RMS_V; k++) {
        const u32 j = 4 * (threadIdx.x + k * blockDim.x);
        if (ADD) {
            v[k] = make_float4(v[k].x + dv[k].x, v[k].y + dv[k].y, v[k].z + dv[k].z, v[k].w + dv[k].w);
            if (j < dim) *(float4*)(res + j) = v[k];
        }
    }
    rms_v4_scale(v, wv, out, dim, eps, sh);
}

// One block per row (blockDim.x a multiple of 64, up to 1024: ops.rs `norm_cfg`); rows
// rms_row_v4 does not take go through rms_row (two passes).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, u32 dim, float eps) { WEFT_PDL_ENTRY();
    __shared__ float sh[BLOCK];
    i64 o = (i64)blockIdx.x * dim;
    if (rms_v4_fits(dim, x + o, w, out + o, w)) rms_row_v4<false>(x + o, 0, 0, w, out + o, dim, eps, sh);
    else rms_row(x + o, w, out + o, dim, eps, sh);
}

// `early` (a single row, ops.rs `norm_trigger`): the next launch in at once. Its blocks read
// nothing before their wait but static weights (weft_port.h), so they may load them while this
// one block works — the router's rows (gemv_f32_pre_t1), or a GEMV's prefetch.
extern "C" __global__ void add_rms_norm(float* res, const float* delta, const float* w, float* out, u32 dim, float eps, int early) {
    if (early) WEFT_PDL_TRIGGER();
    WEFT_PDL_ENTRY();
    __shared__ float sh[BLOCK];
    i64 o = (i64)blockIdx.x * dim;
    if (rms_v4_fits(dim, res + o, delta + o, w, out + o)) {
        rms_row_v4<true>(res + o, delta + o, res + o, w, out + o, dim, eps, sh);
        return;
    }
    for (u32 j = threadIdx.x; j < dim; j += blockDim.x) res[o + j] += delta[o + j];
    __syncthreads();
    rms_row(res + o, w, out + o, dim, eps, sh);
}

// add_rms_norm whose delta is a stacked two-part product's halves (`half` values apart: the
// output projection's, ops.rs `linear_add_rms_norm`), added as add_halves adds them.
extern "C" __global__ void add_rms_norm_halves(float* res, const float* delta, i64 half, const float* w, float* out, u32 dim, float eps) { WEFT_PDL_ENTRY();
    __shared__ float sh[BLOCK];
    i64 o = (i64)blockIdx.x * dim;
    if (rms_v4_fits(dim, res + o, delta + o, w, out + o) && half % 4 == 0) {
        rms_row_v4<true, true>(res + o, delta + o, res + o, w, out + o, dim, eps, sh, half);
        return;
    }
    for (u32 j = threadIdx.x; j < dim; j += blockDim.x) res[o + j] += delta[o + j] + delta[half + o + j];
    __syncthreads();
    rms_row(res + o, w, out + o, dim, eps, sh);
}

extern "C" __global__ void add_inplace(float* x, const float* y, i64 n) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) x[i] += y[i];
}

// out = s[0..n) + s[n..2n): the two halves of a GEMM that took an activation's two bf16 parts
// as stacked rows (ops.rs, `gemm`).
extern "C" __global__ void add_halves(const float* __restrict__ s, float* __restrict__ out, i64 n) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) out[i] = s[i] + s[n + i];
}

// silu(gate) · up of row blockIdx.x of a gate|up product given whole (half 0) or as the two
// stacked halves of a two-part GEMM (`half` values apart, added first as add_halves does), into
// f32 (`silu_mul_halves`) or straight into the bf16 parts of the down product's activations
// (`silu_mul_split`: hi, and lo when `two`, rounded as cast_f32_bf16_split): the same bits as
// add_halves, silu_mul and the cast one after the other, in one launch (ops.rs `halves`).
__device__ __forceinline__ float silu_mul_at(const float* gu, i64 half, u32 inter, u32 j) {
    const float* g = gu + (i64)blockIdx.x * 2 * inter;
    float a = g[j], u = g[inter + j];
    if (half) {
        a = a + g[half + j];
        u = u + g[half + inter + j];
    }
    return a / (1.0f + expf(-a)) * u;
}
extern "C" __global__ void silu_mul_halves(const float* __restrict__ gu, i64 half, float* __restrict__ out, u32 inter) { WEFT_PDL_ENTRY();
    for (u32 j = threadIdx.x; j < inter; j += blockDim.x) out[(i64)blockIdx.x * inter + j] = silu_mul_at(gu, half, inter, j);
}
extern "C" __global__ void silu_mul_split(const float* __restrict__ gu, i64 half, u16* __restrict__ hi, u16* __restrict__ lo, u32 inter, int two) { WEFT_PDL_ENTRY();
    for (u32 j = threadIdx.x; j < inter; j += blockDim.x) {
        const float v = silu_mul_at(gu, half, inter, j);
        const i64 i = (i64)blockIdx.x * inter + j;
        const u16 h = f32_to_bf16(v);
        hi[i] = h;
        if (two) lo[i] = f32_to_bf16(v - bf16_to_f32(h));
    }
}

// add_halves of two products in one launch: out_a = s_a's halves (n_a values), then out_b.
extern "C" __global__ void add_halves2(const float* __restrict__ sa, float* __restrict__ oa, i64 na, const float* __restrict__ sb, float* __restrict__ ob, i64 nb) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < na + nb; i += (i64)gridDim.x * blockDim.x) {
        if (i < na) oa[i] = sa[i] + sa[na + i];
        else ob[i - na] = sb[i - na] + sb[nb + i - na];
    }
}

extern "C" __global__ void silu_mul(const float* __restrict__ gu, float* __restrict__ out, u32 inter) { WEFT_PDL_ENTRY();
    const float* g = gu + (i64)blockIdx.x * 2 * inter;
    for (u32 j = threadIdx.x; j < inter; j += blockDim.x) {
        float a = g[j];
        out[(i64)blockIdx.x * inter + j] = a / (1.0f + expf(-a)) * g[inter + j];
    }
}

// RoPE of `rd` values at `pos`, written de-interleaved (first half / second half).
template <typename O>
__device__ void rope_into(const float* x, u32 pos, const float* inv_freq, u32 rd, float attn_factor, int interleaved, O* out) {
    u32 half = rd / 2;
    for (u32 i = threadIdx.x; i < half; i += blockDim.x) {
        float x1 = interleaved ? x[2 * i] : x[i];
        float x2 = interleaved ? x[2 * i + 1] : x[i + half];
        float th = (float)pos * inv_freq[i];
        float c = cosf(th) * attn_factor, s = sinf(th) * attn_factor;
        kv_st(out + i, x1 * c - x2 * s);
        kv_st(out + i + half, x2 * c + x1 * s);
    }
}

// Block mh = (row, head): q [m, heads, nope + rd] -> q_nope [m, heads, nope], q_pe [m, heads, rd].
__device__ void split_rope_q_body(i64 mh, const float* q, float* q_nope, float* q_pe, const u32* pos, const float* inv_freq, u32 heads, u32 nope, u32 rd, float attn_factor, int interleaved) {
    const float* src = q + mh * (nope + rd);
    for (u32 j = threadIdx.x; j < nope; j += blockDim.x) q_nope[mh * nope + j] = src[j];
    rope_into(src + nope, pos[mh / heads], inv_freq, rd, attn_factor, interleaved, q_pe + mh * rd);
}
extern "C" __global__ void split_rope_q(const float* q, float* q_nope, float* q_pe, const u32* pos, const float* inv_freq, u32 heads, u32 nope, u32 rd, float attn_factor, int interleaved) { WEFT_PDL_ENTRY();
    split_rope_q_body(blockIdx.x, q, q_nope, q_pe, pos, inv_freq, heads, nope, rd, attn_factor, interleaved);
}

// Block t = token: RMSNorm the latent, rope the shared key, store both at its slot (an f32 or a
// bf16 cache).
template <typename C>
__device__ void store_kv_body(u32 t, C* layer, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) {
    __shared__ float sh[BLOCK];
    u32 w = latent + rd;
    const float* row = kv_a + (i64)t * w;
    C* dst = layer + (i64)slots[t] * w;
    rms_row(row, norm_w, dst, latent, eps, sh);
    rope_into(row + latent, pos[t], inv_freq, rd, attn_factor, interleaved, dst + latent);
}
extern "C" __global__ void store_kv(float* layer, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { WEFT_PDL_ENTRY();
    store_kv_body(blockIdx.x, layer, kv_a, norm_w, pos, slots, inv_freq, latent, rd, eps, attn_factor, interleaved);
}
extern "C" __global__ void store_kv_bf16(u16* layer, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { WEFT_PDL_ENTRY();
    store_kv_body(blockIdx.x, layer, kv_a, norm_w, pos, slots, inv_freq, latent, rd, eps, attn_factor, interleaved);
}

// split_rope_q and store_kv of the same m rows in one launch of m · heads + m blocks (the first
// m · heads split and rope the queries, the rest store the tokens' latents): two independent
// per-row kernels of ~3 and ~4 us a layer at batch 1 (Nsight, H100), each mostly its launch and
// first reads, now one.
template <typename C>
__device__ void rope_q_store_kv_body(C* layer, const float* q, float* q_nope, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) {
    const u32 b = blockIdx.x;
    if (b < m * heads) split_rope_q_body(b, q, q_nope, q_pe, pos, inv_freq, heads, nope, rd, attn_factor, interleaved);
    else store_kv_body(b - m * heads, layer, kv_a, norm_w, pos, slots, inv_freq, latent, rd, eps, attn_factor, interleaved);
}
extern "C" __global__ void rope_q_store_kv(float* layer, const float* q, float* q_nope, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { WEFT_PDL_ENTRY();
    rope_q_store_kv_body(layer, q, q_nope, q_pe, kv_a, norm_w, pos, slots, inv_freq, m, heads, nope, latent, rd, eps, attn_factor, interleaved);
}
extern "C" __global__ void rope_q_store_kv_bf16(u16* layer, const float* q, float* q_nope, float* q_pe, const float* kv_a, const float* norm_w, const u32* pos, const u32* slots, const float* inv_freq, u32 m, u32 heads, u32 nope, u32 latent, u32 rd, float eps, float attn_factor, int interleaved) { WEFT_PDL_ENTRY();
    rope_q_store_kv_body(layer, q, q_nope, q_pe, kv_a, norm_w, pos, slots, inv_freq, m, heads, nope, latent, rd, eps, attn_factor, interleaved);
}

// Absorbed MLA attention over the paged latent pool, one block per (query row, head), online
// softmax over chunks of BLOCK context tokens. Dynamic shared memory: latent + rd floats (q).
// bt: concatenated block tables, bt_off[row] its start; ctx[row] the visible context.
template <typename C>
__device__ void mla_attention_body(const C* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* out, u32 heads, u32 latent, u32 rd, u32 page, float scale) {
    WEFT_DYNAMIC_SHARED(float, q);
    __shared__ float p[BLOCK];
    __shared__ float sh[BLOCK];
    u32 w = latent + rd;
    i64 mh = blockIdx.x;
    u32 row = mh / heads;
    for (u32 j = threadIdx.x; j < latent; j += blockDim.x) q[j] = q_lat[mh * latent + j];
    for (u32 j = threadIdx.x; j < rd; j += blockDim.x) q[latent + j] = q_pe[mh * rd + j];
    __syncthreads();
    const u32* table = bt + bt_off[row];
    u32 n = ctx[row];
    // Each thread owns output dims threadIdx.x + k*BLOCK (latent <= 4*BLOCK).
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    float m_run = -WEFT_INF, l_run = 0.f;
    for (u32 base = 0; base < n; base += blockDim.x) {
        u32 t = base + threadIdx.x;
        float sc = -WEFT_INF;
        if (t < n) {
            const C* e = layer + ((i64)table[t / page] * page + t % page) * w;
            float s = 0.f, s2 = 0.f;
            for (u32 j = 0; j < latent; j++) s += q[j] * kv_ld(e + j);
            for (u32 j = 0; j < rd; j++) s2 += q[latent + j] * kv_ld(e + latent + j);
            sc = (s + s2) * scale;
        }
        float m_new = fmaxf(m_run, block_max(sc, sh));
        float e_sc = (t < n) ? expf(sc - m_new) : 0.f;
        p[threadIdx.x] = e_sc;
        float corr = expf(m_run - m_new);
        l_run = l_run * corr + block_sum(e_sc, sh);
        __syncthreads();
        u32 cnt = min((u32)blockDim.x, n - base);
        for (u32 k = 0; k < 4; k++) {
            u32 d = threadIdx.x + k * blockDim.x;
            if (d >= latent) break;
            float a = acc[k] * corr;
            for (u32 i = 0; i < cnt; i++) {
                u32 tt = base + i;
                a += p[i] * kv_ld(layer + ((i64)table[tt / page] * page + tt % page) * w + d);
            }
            acc[k] = a;
        }
        m_run = m_new;
        __syncthreads();
    }
    for (u32 k = 0; k < 4; k++) {
        u32 d = threadIdx.x + k * blockDim.x;
        if (d < latent) out[mh * latent + d] = acc[k] / l_run;
    }
}
extern "C" __global__ void mla_attention(const float* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* out, u32 heads, u32 latent, u32 rd, u32 page, float scale) { WEFT_PDL_ENTRY();
    mla_attention_body(layer, q_lat, q_pe, bt, bt_off, ctx, out, heads, latent, rd, page, scale);
}
extern "C" __global__ void mla_attention_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* out, u32 heads, u32 latent, u32 rd, u32 page, float scale) { WEFT_PDL_ENTRY();
    mla_attention_body(layer, q_lat, q_pe, bt, bt_off, ctx, out, heads, latent, rd, page, scale);
}

// Grouped-query attention for draft models with ordinary attention (DFlash): entries of
// 2*kw floats (K row, then V row; kw = kv_heads * d). kv_store_rows writes one entry per
// block; gqa_attention is one block per (query row, head) with an online softmax over chunks
// of blockDim context entries, head h reading group h / group. Dynamic shared memory: d
// floats (q). Every entry 0..ctx[row] is visible: no causal mask beyond the length.
extern "C" __global__ void kv_store_rows(float* layer, const float* k, const float* v, const u32* slots, u32 kw) { WEFT_PDL_ENTRY();
    float* dst = layer + (i64)slots[blockIdx.x] * 2 * kw;
    const float* ks = k + (i64)blockIdx.x * kw;
    const float* vs = v + (i64)blockIdx.x * kw;
    for (u32 j = threadIdx.x; j < kw; j += blockDim.x) {
        dst[j] = ks[j];
        dst[kw + j] = vs[j];
    }
}

extern "C" __global__ void gqa_attention(const float* layer, const float* q_in, const u32* bt, const u32* bt_off, const u32* ctx, float* out, u32 heads, u32 group, u32 d, u32 kw, u32 page, float scale) { WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(float, q);
    __shared__ float p[BLOCK];
    __shared__ float sh[BLOCK];
    i64 mh = blockIdx.x;
    u32 row = mh / heads;
    u32 koff = (u32)(mh % heads) / group * d;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) q[j] = q_in[mh * d + j];
    __syncthreads();
    const u32* table = bt + bt_off[row];
    u32 n = ctx[row];
    float acc = 0.f;
    float m_run = -WEFT_INF, l_run = 0.f;
    for (u32 base = 0; base < n; base += blockDim.x) {
        u32 t = base + threadIdx.x;
        float sc = -WEFT_INF;
        if (t < n) {
            const float* e = layer + ((i64)table[t / page] * page + t % page) * 2 * kw + koff;
            float s = 0.f;
            for (u32 j = 0; j < d; j++) s += q[j] * e[j];
            sc = s * scale;
        }
        float m_new = fmaxf(m_run, block_max(sc, sh));
        float e_sc = (t < n) ? expf(sc - m_new) : 0.f;
        p[threadIdx.x] = e_sc;
        float corr = expf(m_run - m_new);
        l_run = l_run * corr + block_sum(e_sc, sh);
        __syncthreads();
        u32 cnt = min((u32)blockDim.x, n - base);
        if (threadIdx.x < d) {
            float a = acc * corr;
            for (u32 i = 0; i < cnt; i++) {
                u32 tt = base + i;
                a += p[i] * layer[((i64)table[tt / page] * page + tt % page) * 2 * kw + kw + koff + threadIdx.x];
            }
            acc = a;
        }
        m_run = m_new;
        __syncthreads();
    }
    if (threadIdx.x < d) out[mh * d + threadIdx.x] = acc / l_run;
}

// out[tok[i]] += wt[i] * y[i], one block per routed row (rows of one expert hit distinct tokens).
extern "C" __global__ void scatter_add_weighted(const float* y, const u32* tok, const float* wt, float* out, u32 d) { WEFT_PDL_ENTRY();
    float g = wt[blockIdx.x];
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) out[(i64)tok[blockIdx.x] * d + j] += g * y[(i64)blockIdx.x * d + j];
}

extern "C" __global__ void fill_f32(float* x, float v, i64 n) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) x[i] = v;
}

// out[rows[i]] = x[i] for each of the grid's rows (one block per row, d wide).
extern "C" __global__ void scatter_rows(const float* x, const u32* rows, float* out, u32 d) { WEFT_PDL_ENTRY();
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) out[(i64)rows[blockIdx.x] * d + j] = x[(i64)blockIdx.x * d + j];
}
