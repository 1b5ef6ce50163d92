// MLA decode on Hopper's warpgroup tensor cores (`wgmma.mma_async`, sm_90a only) over a bf16
// latent cache, up to 16 heads per block: the small head counts (Moonlight's 16, 8–16 under
// tensor parallelism) where mla_grouped.cu's mma.sync kernels stay near half the copy rate —
// bound by fragment loads from shared memory and by issue, not by memory (results round 9).
//
// The products run transposed, so that the cache tile — not the few heads — fills the 64 rows
// of a wgmma: scores S^T (64 tokens x 32) = K (the tile, 64 tokens x width) · Q^T, whose 32
// columns are the block's 16 heads' queries as a high and a low bf16 part (hi in column h, lo
// in h + 16; a head's score is the sum of its two columns, the f32 queries' precision as in
// every decode path); values O^T (latent x 32) += V^T (the tile's latent columns, read
// transposed: "M-major") · P^T, the softmax weights again as hi / lo parts in columns h, h + 16.
// Both operands of both products are read by the tensor cores from shared memory (no
// fragment loads; one or two warpgroups a block, below). The cache tile is copied once (cp.async, one tile ahead) in
// the 128-byte swizzle: 64-column chunks of 64 rows x 128 bytes, 16-byte granule c of row r at
// c ^ (r % 8) — K-major for the scores, M-major for the values, one layout.
//
// Accumulator layout (m64nN): warp wr's lane (g, t) holds rows 16wr + g (+ 8) at columns
// 8j + 2t (+ 1), d[4j + 2 · (row half) + (column parity)]. For N = 32 a thread's columns are
// heads 2t, 2t + 1, 8 + 2t, 9 + 2t, each hi (j = 0, 1) and lo (j = 2, 3): the same in S^T and
// O^T, so the rescale of a head's outputs needs no exchange. Softmax per tile: the running max
// per head over all 64 tokens meets in shared memory (one barrier); each thread keeps partial
// sums of its own weights, added up once at the end.
//
// Same inputs, launch grid (block = row · groups + group, y = split), partial outputs and merge
// (mla_combine) as mla_decode_mma; the host (src/mla.rs) takes `mla_decode_wg2_bf16` (two
// warpgroups a block) on sm_90a for bf16 caches whose latent width is a multiple of 64, up to
// 16 heads — one block a row — and `mla_decode_wgs_bf16` (at the end: 64 heads a block, one
// bf16 part of queries and weights) beyond (`WEFT_CUDA_MLA_WGMMA=0` never, `=1`
// `mla_decode_wg_bf16` — one warpgroup —, `=3` `mla_decode_wgh_bf16` — 64 heads, two parts —
// and `=5` `_wgs_` for every head count).
#define MLW_T 64                  // tokens per tile: the m of every product
#define MLW_HB 16                 // heads per block
#define MLW_N (2 * MLW_HB)        // columns of Q^T and P^T: hi and lo part of each head
#define MLW_CHUNK (MLW_T * 128)   // one 64-column chunk of a tile
#define MLW_QCHUNK (MLW_N * 128)  // one 64-column chunk of Q^T

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(WEFT_NO_PTX)
// An M-major operand (the values: 64 latent columns of 128 bytes per token row, 8-row groups
// 1024 bytes apart along k), 128-byte swizzle: leading offset = the next 64 columns' chunk
// (unused by m64), stride = 1024.
__device__ __forceinline__ u64 wg_desc_mn(const void* p) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    return (u64)((a & 0x3ffffu) >> 4) | ((u64)(MLW_CHUNK >> 4) << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
// v (the same in every lane of the warp) as ptxas can see it is: wgmma loop bounds derived from
// the thread index otherwise count as divergent, and every wgmma of the kernel is serialised.
__device__ __forceinline__ u32 wg_uniform(u32 v) { return __shfl_sync(0xffffffffu, v, 0); }
// A descriptor of the operand `bytes` further on (the start address field is in 16-byte units;
// shared addresses stay below 256 KB, so the field does not overflow into the next).
__device__ __forceinline__ u64 wg_desc_add(u64 desc, u32 bytes) { return desc + (bytes >> 4); }
// d (64 x 32) += A (64 x 16 at da; TA = 1: M-major) x B (32 rows x 16 at db, K-major).
template <int TA>
__device__ __forceinline__ void wgmma_n32_ss(float (&d)[16], u64 da, u64 db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, 1, 1, 1, %18, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "n"(TA));
}
// d = A x B (the accumulator's old value ignored: scale-d 0), both K-major.
__device__ __forceinline__ void wgmma_n32_ss_first(float (&d)[16], u64 da, u64 db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, 0, 1, 1, 0, 0;"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
          "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
        : "l"(da), "l"(db));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ u32 wg_uniform(u32 v) { return v; }
__device__ __forceinline__ u64 wg_desc_mn(const void* p) { return (u64)(uintptr_t)p; }
__device__ __forceinline__ u64 wg_desc_add(u64 desc, u32 bytes) { return desc + bytes; }
template <int TA>
__device__ __forceinline__ void wgmma_n32_ss(float (&d)[16], u64 da, u64 db) { emu_wgmma_ss<32>(d, da, db, TA, 0); }
__device__ __forceinline__ void wgmma_n32_ss_first(float (&d)[16], u64 da, u64 db) {
    for (int i = 0; i < 16; i++) d[i] = 0.f;
    emu_wgmma_ss<32>(d, da, db, 0, 0);
}
#else
__device__ __forceinline__ u32 wg_uniform(u32 v) { return v; }
__device__ __forceinline__ u64 wg_desc_mn(const void*) { return 0; }
__device__ __forceinline__ u64 wg_desc_add(u64 desc, u32) { return desc; }
template <int TA>
__device__ __forceinline__ void wgmma_n32_ss(float (&)[16], u64, u64) { WG_TRAP(); }
__device__ __forceinline__ void wgmma_n32_ss_first(float (&)[16], u64, u64) { WG_TRAP(); }
#endif

// Byte offset of 16-column step k in an operand of 64-column chunks `chunk` bytes apart (each
// chunk's 128-byte rows hold four steps of 32 bytes).
__device__ __forceinline__ u32 wg_kstep(u32 k, u32 chunk) { return k / 4 * chunk + 32 * (k % 4); }

// Tokens base..base + T - 1 of the row's context into a tile of 64-column chunks of T · 128
// bytes (rows past `end` zero-filled), by a block of THREADS threads: thread (r = tid / 8,
// c = tid % 8) copies 16-byte granule c of every 64-column chunk of tokens r, r + R, r + 2R, …
// (R = THREADS / 8) — rows whose swizzle (row % 8 = r % 8) is the same, so every copy's shared
// address is one offset plus constants, and the loop is a few instructions per copy. With pages
// of a multiple of T tokens a tile lies in one page (one block-table lookup; see below).
template <int T, int THREADS>
__device__ __forceinline__ void mlw_load(unsigned char* tile, const u16* layer, const u32* table, u32 base, u32 end, u32 page, u32 w) {
    constexpr int R = THREADS / 8;
    static_assert(T % R == 0, "a tile is whole passes of the block's rows");
    const u32 r = threadIdx.x / 8, c = threadIdx.x % 8, gw = w / 8, nc = (w + 63) / 64;
    unsigned char* dst = tile + r * 128 + (c ^ (r % 8)) * 16;
    // One lookup a tile only for 64-token tiles: the 64-head kernel's 32-token tiles measured
    // 2.5 % slower with it (32, 64 and 128 heads, same binary and H100, round 21) — kept per
    // token there. WEFT_MLW_PER_TOKEN: per token for every tile (a comparison variant).
#ifdef WEFT_MLW_PER_TOKEN
    const bool one_page = false;
#else
    const bool one_page = T >= 64 && page % T == 0;
#endif
    const i64 row0 = one_page ? (i64)table[base / page] * page + base % page : 0;
#pragma unroll
    for (int tg = 0; tg < T / R; tg++) {
        const u32 tt = r + R * tg, tok = base + tt;
        const bool in = tok < end;
        const i64 row = one_page ? row0 + tt : in ? (i64)table[tok / page] * page + tok % page : 0;
        const u16* src = in ? layer + row * w + 8 * c : layer;
        const u32 bytes = in ? 16 : 0;
#pragma unroll
        for (int ch = 0; ch < 9; ch++)
            if ((u32)ch < nc && 8 * ch + c < gw) cp_async16(dst + ch * (T * 128) + tg * R * 128, src + 64 * ch, bytes);
    }
    cp_async_commit();
}

// Granule j (8 columns of the cache row's width) of head h's query in the block's group, as f32
// (a: columns 0–3, b: 4–7); zero past the group.
__device__ __forceinline__ void mlw_query_load(const float* q_lat, const float* q_pe, const MlaBlock& B, u32 heads, u32 latent, u32 rd, u32 h, u32 j, float4& a, float4& b) {
    const u32 d = 8 * j;
    a = b = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < B.hg) {
        const i64 qi = (i64)B.row * heads + B.h0 + h;
        const float* src = d < latent ? q_lat + qi * latent + d : q_pe + qi * rd + d - latent;
        a = *(const float4*)src;
        b = *(const float4*)(src + 4);
    }
}
// Those eight values as bf16 hi and lo parts.
__device__ __forceinline__ void mlw_query_split(const float4& a, const float4& b, uint4& hi, uint4& lo) {
    split_bf16x2(a.x, a.y, hi.x, lo.x);
    split_bf16x2(a.z, a.w, hi.y, lo.y);
    split_bf16x2(b.x, b.y, hi.z, lo.z);
    split_bf16x2(b.z, b.w, hi.w, lo.w);
}
// Granule j of head h's query as bf16 hi and lo parts (mlw_query_load, then mlw_query_split).
__device__ __forceinline__ void mlw_query(const float* q_lat, const float* q_pe, const MlaBlock& B, u32 heads, u32 latent, u32 rd, u32 h, u32 j, uint4& hi, uint4& lo) {
    float4 a, b;
    mlw_query_load(q_lat, q_pe, B, heads, latent, rd, h, j, a, b);
    mlw_query_split(a, b, hi, lo);
}

// Element k (a token) of row n of P^T: 128-byte rows, granule k / 8 at (k / 8) ^ (n % 8).
__device__ __forceinline__ u16* mlw_p_at(unsigned char* ps, u32 n, u32 k) { return (u16*)(ps + n * 128 + ((k / 8) ^ (n % 8)) * 16 + (k % 8) * 2); }

// WGS warpgroups a block: each computes the scores over 1 / WGS of the width, the partial sums
// meet in shared memory, each then runs the same softmax, and the values of latent columns
// [512 / WGS · wg, …) — with two, half the products, accumulators and rescales each, and two
// warps per scheduler to hide each other's waits.
template <int WGS>
__device__ __forceinline__ void mla_wg_body(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    constexpr int MB = 8 / WGS;  // 64-column value tiles per warpgroup
    WEFT_DYNAMIC_SHARED(uint4, mlw_smem);
    unsigned char* sm = wg_align1024(mlw_smem);
    const u32 w = latent + rd, gw = w / 8, nc = (w + 63) / 64, nks = w / 16, nmb = latent / 64;
    unsigned char* tiles = sm;                       // [2][nc][MLW_CHUNK]
    unsigned char* qs = tiles + 2 * nc * MLW_CHUNK;  // [nc][MLW_QCHUNK]: Q^T, K-major
    const u32 tid = threadIdx.x, lane = tid % 32, wg = wg_uniform(tid / 128), wr = tid / 32 % 4, g = lane / 4, t = lane % 4;
    unsigned char* ps = qs + nc * MLW_QCHUNK + wg * MLW_N * 128;                 // [MLW_N][128 bytes]: P^T, K-major
    float* red = (float*)(qs + nc * MLW_QCHUNK + WGS * MLW_N * 128) + wg * 64;  // [4 warps][MLW_HB]
    float* xs = (float*)(qs + nc * MLW_QCHUNK + WGS * (MLW_N * 128 + 256));         // [WGS][16][128]: partial scores
    const u64 dq = wg_desc(qs), dp = wg_desc(ps);
    // The 16-column steps of the score product this warpgroup takes: all, or half with two.
    const u32 k0 = wg * nks / WGS, k1 = (wg + 1) * nks / WGS;
    const MlaBlock B = mla_block(MLW_T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 ntiles = (B.t_end - B.t_begin + MLW_T - 1) / MLW_T;
    if (ntiles > 0) mlw_load<MLW_T, 128 * WGS>(tiles, layer, B.table, B.t_begin, B.t_end, page, w);
    // Q^T while the first tile loads: granule j of head h's query as bf16 hi (row h) and lo
    // (row h + 16) parts; heads past the group are zero rows.
    for (u32 e = tid; e < MLW_HB * gw; e += blockDim.x) {
        const u32 h = e / gw, j = e % gw;
        uint4 hi, lo;
        mlw_query(q_lat, q_pe, B, heads, latent, rd, h, j, hi, lo);
        unsigned char* qc = qs + (j / 8) * MLW_QCHUNK;
        *(uint4*)(qc + h * 128 + ((j % 8) ^ (h % 8)) * 16) = hi;
        *(uint4*)(qc + (h + MLW_HB) * 128 + ((j % 8) ^ ((h + MLW_HB) % 8)) * 16) = lo;
    }
    // This thread's heads (slot a: column parity a % 2 of n-tile a / 2) and state.
    u32 hd[4];
#pragma unroll
    for (int a = 0; a < 4; a++) hd[a] = 8 * (a / 2) + 2 * t + a % 2;
    float m_run[4], l_run[4], o[MB][16];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m_run[a] = -WEFT_INF;
        l_run[a] = 0.f;
    }
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int i = 0; i < 16; i++) o[mb][i] = 0.f;

    for (u32 it = 0; it < ntiles; it++) {
        const u32 base = B.t_begin + it * MLW_T, cnt = min((u32)MLW_T, B.t_end - base);
        unsigned char* tile = tiles + (it % 2) * nc * MLW_CHUNK;
        cp_async_wait<0>();
        fence_async_shared();
        __syncthreads();
        // The other buffer's last readers (the previous tile's products) are done: load ahead.
        if (it + 1 < ntiles) mlw_load<MLW_T, 128 * WGS>(tiles + ((it + 1) % 2) * nc * MLW_CHUNK, layer, B.table, base + MLW_T, B.t_end, page, w);
        // (The first product ignores the accumulator: no other instruction defines it, so the
        // chain is not serialised.)
        // (Descriptors as a base plus offsets: the address arithmetic is most of what a warp
        // issues between products.)
        float s[16];
        const u64 dt = wg_desc(tile), dtv = wg_desc_mn(tile);
        wg_fence();
        wgmma_n32_ss_first(s, wg_desc_add(dt, wg_kstep(k0, MLW_CHUNK)), wg_desc_add(dq, wg_kstep(k0, MLW_QCHUNK)));
        u32 k = k0 + 1;
        for (; k % 4 != 0 && k < k1; k++) wgmma_n32_ss<0>(s, wg_desc_add(dt, wg_kstep(k, MLW_CHUNK)), wg_desc_add(dq, wg_kstep(k, MLW_QCHUNK)));
        for (; k + 4 <= k1; k += 4) {  // whole 64-column chunks: 16-column steps 32 bytes apart
            const u64 a = wg_desc_add(dt, k / 4 * MLW_CHUNK), b = wg_desc_add(dq, k / 4 * MLW_QCHUNK);
#pragma unroll
            for (int j = 0; j < 4; j++) wgmma_n32_ss<0>(s, wg_desc_add(a, 32 * j), wg_desc_add(b, 32 * j));
        }
        for (; k < k1; k++) wgmma_n32_ss<0>(s, wg_desc_add(dt, wg_kstep(k, MLW_CHUNK)), wg_desc_add(dq, wg_kstep(k, MLW_QCHUNK)));
        wg_commit();
        wg_wait<0>();
        if constexpr (WGS == 2) {
            // Each warpgroup's half of the reduction through shared memory: both then hold the
            // same sums (a + b and b + a are the same float), hence the same weights.
#pragma unroll
            for (int i = 0; i < 16; i++) xs[(wg * 16 + i) * 128 + tid % 128] = s[i];
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 16; i++) s[i] += xs[((1 - wg) * 16 + i) * 128 + tid % 128];
        }
        // Scores of this thread's heads at tokens 16wr + g (rr = 0) and + 8 (rr = 1).
        float v[4][2], mx[4];
#pragma unroll
        for (int a = 0; a < 4; a++) {
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int i = 4 * (a / 2) + 2 * rr + a % 2;
                v[a][rr] = 16 * wr + g + 8 * rr < cnt ? (s[i] + s[i + 8]) * scale : -WEFT_INF;
            }
            mx[a] = fmaxf(v[a][0], v[a][1]);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) mx[a] = fmaxf(mx[a], lane_xor(mx[a], off));
            if (g == 0) red[wr * MLW_HB + hd[a]] = mx[a];
        }
        __syncthreads();
        float corr[4];
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const float m_new = fmaxf(fmaxf(m_run[a], fmaxf(red[hd[a]], red[MLW_HB + hd[a]])), fmaxf(red[2 * MLW_HB + hd[a]], red[3 * MLW_HB + hd[a]]));
            corr[a] = expf(m_run[a] - m_new);
            m_run[a] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const float p = expf(v[a][rr] - m_new);
                sum += p;
                const u32 k = 16 * wr + g + 8 * rr;
                const u16 h = f32_to_bf16(p);
                *mlw_p_at(ps, hd[a], k) = h;
                *mlw_p_at(ps, hd[a] + MLW_HB, k) = f32_to_bf16(p - bf16_to_f32(h));
            }
            l_run[a] = l_run[a] * corr[a] + sum;
        }
        // Rescale the outputs of heads whose max moved (most tiles move none).
#pragma unroll
        for (int a = 0; a < 4; a++)
            if (corr[a] != 1.f)
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        const int i = 4 * (a / 2) + 2 * rr + a % 2;
                        o[mb][i] *= corr[a];
                        o[mb][i + 8] *= corr[a];
                    }
        fence_async_shared();
        __syncthreads();
        wg_fence();
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
            if (MB * wg + mb < nmb)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_n32_ss<1>(o[mb], wg_desc_add(dtv, (MB * wg + mb) * MLW_CHUNK + kk * 2048), wg_desc_add(dp, 32 * kk));
        wg_commit();
        wg_wait<0>();
    }
    // Each head's sum over the block's threads; its outputs (hi + lo columns) and (max, sum).
    float l_sum[4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        l_sum[a] = l_run[a];
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) l_sum[a] += lane_xor(l_sum[a], off);
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; a++)
        if (g == 0) red[wr * MLW_HB + hd[a]] = l_sum[a];
    __syncthreads();
    const u32 nsplit = gridDim.y;
    const i64 part = ((i64)B.row * heads + B.h0) * nsplit + blockIdx.y;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        if (hd[a] >= B.hg) continue;
        float* out = o_part + (part + (i64)hd[a] * nsplit) * latent;
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
            if (MB * wg + mb < nmb)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int i = 4 * (a / 2) + 2 * rr + a % 2;
                    out[64 * (MB * wg + mb) + 16 * wr + g + 8 * rr] = o[mb][i] + o[mb][i + 8];
                }
        if (wg == 0 && wr == 0 && g == 0) {
            ml_part[(part + (i64)hd[a] * nsplit) * 2] = m_run[a];
            ml_part[(part + (i64)hd[a] * nsplit) * 2 + 1] = red[hd[a]] + red[MLW_HB + hd[a]] + red[2 * MLW_HB + hd[a]] + red[3 * MLW_HB + hd[a]];
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 1) mla_decode_wg_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
    WEFT_PDL_ENTRY();
    mla_wg_body<1>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk);
}
// WEFT_MLA_TRIGGER (a variant for comparisons): the next launch (W_UV with the merge, whose
// blocks prefetch W_UV's rows before their wait) in at this one's start.
extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_wg2_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk) {
#ifdef WEFT_MLA_TRIGGER
    WEFT_PDL_TRIGGER();
#endif
    WEFT_PDL_ENTRY();
    mla_wg_body<2>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk);
}

// ---- Up to 64 heads a block (mla_decode_wgh_bf16): the heads fill the wgmma's 64 rows ----
//
// At 40–128 heads the transposed kernel above runs a block per 16 heads, each reading the tile
// (and the grouped kernels are bound by fragment loads). Here the products run the other way:
// scores S (64 heads x 32 tokens) = Q (64 rows, hi and lo bf16 parts, each a K-major operand
// in shared memory) · K^T (the tile, K-major), two products into one accumulator — the f32
// queries' precision as in every decode path, without doubling the accumulator. Each of the
// two warpgroups takes half the width's 16-column steps; the partial sums meet in shared
// memory in two phases (warpgroup 1's half to warpgroup 0, the sum back: both then hold the
// same scores, hence the same weights). The softmax of a head is a row of the accumulator, so
// its max and sum are a thread's 8 values and two shuffles — no barrier. The weights stay in
// registers as the A operand of the value product (the accumulator's layout is the A
// fragment's), O (64 heads x 256 latent columns a warpgroup, 4 products of 64) += P (hi, then
// lo) · V, V the tile's latent columns read N-major. Shared memory: two 32-token tiles (36 KB
// each at width 576), Q's two parts (72 KB each) and the 8 KB exchange — 225 KB, one block an
// SM. Tiles of 32 tokens (the n of the scores) because a third Q-sized buffer does not fit.
#define MLH_T 32                  // tokens per tile
#define MLH_CHUNK (MLH_T * 128)   // one 64-column chunk of a tile
#define MLH_QCHUNK (64 * 128)     // one 64-column chunk of a query part (64 head rows)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(WEFT_NO_PTX)
// d (64 x 64) += A (64 x 16: this thread's fragment, rows 16 · warp + g (+ 8), columns 2t (+ 1)
// in a[0] / a[1] and 8 + 2t (+ 1) in a[2] / a[3]) x B (16 x 64 at db, N-major).
__device__ __forceinline__ void wgmma_n64_rs(float (&d)[32], const u32 (&a)[4], u64 db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ void wgmma_n64_rs(float (&d)[32], const u32 (&a)[4], u64 db) { emu_wgmma_rs<64>(d, a, db, 1); }
#else
__device__ __forceinline__ void wgmma_n64_rs(float (&)[32], const u32 (&)[4], u64) { WG_TRAP(); }
#endif

// Row rr of this thread's score accumulator (m64nN: s[4j + 2rr + c] is column 8j + 2t + c)
// scaled, its columns from `cnt` on (counting from column `c0`) masked to -inf, and the row's
// maximum over the quad (its N values).
template <int N>
__device__ __forceinline__ float wg_masked_row_max(float (&s)[N / 2], int rr, u32 c0, u32 cnt, float scale, u32 t) {
    float mx = -WEFT_INF;
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int i = 4 * j + 2 * rr + c;
            s[i] = c0 + 8 * j + 2 * t + c < cnt ? s[i] * scale : -WEFT_INF;
            mx = fmaxf(mx, s[i]);
        }
    mx = fmaxf(mx, lane_xor(mx, 1));
    return fmaxf(mx, lane_xor(mx, 2));
}

// The 64-head kernels' queries (mla_decode_wgh_bf16, mla_decode_wgs_bf16): granule j of head h
// of the block's group as bf16 parts, hi into `qh` and (PARTS = 2) lo into `ql`, each 64 rows
// of 128 bytes a 64-column chunk; rows past the group zero.
// MLH_QB granules a thread are loaded before any is converted and stored. One at a time, each
// load waits behind the store before it (a global round trip per granule, 18 a thread at
// DeepSeek's width: 11 % of the 64-head ping-pong kernel's stall samples, round 25);
// six at a time measured 1.03× at 64 heads (149.5 against 154.6 µs, 64 × 4096), 1.02× at 32
// and 128 (round 26); WEFT_MLH_Q_ONE keeps one at a time, for comparisons.
#ifdef WEFT_MLH_Q_ONE
#define MLH_QB 1
#else
#define MLH_QB 6
#endif
template <int PARTS>
__device__ __forceinline__ void mlh_queries(unsigned char* qh, unsigned char* ql, const float* q_lat, const float* q_pe, const MlaBlock& B, u32 heads, u32 latent, u32 rd, u32 gw) {
    const u32 n = 64 * gw;
    for (u32 e0 = threadIdx.x; e0 < n; e0 += MLH_QB * blockDim.x) {
        float4 a[MLH_QB], b[MLH_QB];
#pragma unroll
        for (int q = 0; q < MLH_QB; q++) {
            const u32 e = e0 + q * blockDim.x;
            if (e < n) mlw_query_load(q_lat, q_pe, B, heads, latent, rd, e / gw, e % gw, a[q], b[q]);
        }
#pragma unroll
        for (int q = 0; q < MLH_QB; q++) {
            const u32 e = e0 + q * blockDim.x, h = e / gw, j = e % gw;
            if (e >= n) continue;
            uint4 hi, lo;
            mlw_query_split(a[q], b[q], hi, lo);
            const u32 off = (j / 8) * MLH_QCHUNK + h * 128 + ((j % 8) ^ (h % 8)) * 16;
            *(uint4*)(qh + off) = hi;
            if (PARTS == 2) *(uint4*)(ql + off) = lo;
        }
    }
}

// ---- The 64-head kernels' outputs: partials for mla_combine, or merged in the kernel ----
//
// Without `out`, every block writes its split's partial outputs (unnormalised rows, each row's
// maximum and sum) and mla_combine merges them in a second launch. With `out` (the host's
// in-kernel merge), the splits of a row and head group share their merge: split s merges the
// 64-column tiles k with k % nsplit == s. Each block writes the partials of the tiles the
// others merge, with its rows' maxima and sums, fences and counts itself in
// `sem[2 · blockIdx.x]`; once all nsplit have, it merges its own tiles — its registers and the
// others' partials — with mla_combine's arithmetic (weights expf(m_s − M), their products with
// the outputs summed from zero in split order, divided by L = Σ weight · l_s with the products
// rounded as the combine's block sum adds them) into `out`. The last block past the wait
// (`sem[2 · blockIdx.x + 1]`) resets both counters for the next launch. The wait is on blocks
// of the same launch, so the host merges several splits only where the whole grid is resident
// at once (one block an SM). One split: no partial, no counter — o / l straight out, the
// combine's (0 + 1 · o) / (1 · l). Bit for bit the combine's up to two splits (the order of
// L's additions differs past that). Against the combine this saves its launch, the partials of
// the tiles a block merges itself, and the re-reading of the rest from memory rather than L2:
// 1.07× (H100) / 1.09× (H200) at 64 heads × 64 rows × 4096 (two splits). A merging thread reads
// the other splits one after another (an L2 round trip each), so many splits lose to the
// combine's whole-GPU pass (16 splits of one row: 40 against 20 µs; four at a time in flight,
// 255 registers, 47 → 39 µs there but slower at two) — the host merges at most two by default,
// and several only for head groups above 32 (results, round 27).

// A float2 of another block's partial, written during this launch: from L2 (ld.global.cg),
// never from this SM's L1.
__device__ __forceinline__ float2 mlh_ld2(const float* p) {
#if !defined(WEFT_NO_PTX)
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
    return v;
#else
    const volatile float* q = p;
    return make_float2(q[0], q[1]);
#endif
}

// After this block's partials are stored: counts it in, waits until every split of its row and
// head group has, and lets the last one past the wait reset both counters.
__device__ __forceinline__ void mlh_wait_splits(u32* sem) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* c = sem + 2 * blockIdx.x;
        atomicAdd(c, 1u);
        const volatile u32* n = c;
#if defined(WEFT_EMU)
        for (unsigned long long k = 0; *n < gridDim.y;) emu_spin(k, "merge counter");
#else
        while (*n < gridDim.y) {
        }
#endif
        __threadfence();
        if (atomicAdd(c + 1, 1u) == gridDim.y - 1) {
            c[0] = 0u;
            c[1] = 0u;
        }
    }
    __syncthreads();
}

// Their outputs (see above): warpgroup wg's 256 latent columns of this thread's rows (heads
// 16 · wr + g + 8rr; accumulator element 4j + 2rr + c is column 8j + 2t + c of 64-column tile
// 4 · wg + mb), and each row's maximum and sum `l` (the same in every thread of the row).
__device__ __forceinline__ void mlh_store(const float (&o)[4][32], const float (&m_run)[2], const float (&l)[2], const MlaBlock& B, float* o_part, float* ml_part, float* out, u32* sem, u32 heads, u32 latent, u32 nmb, u32 wg, u32 wr, u32 g, u32 t) {
    const u32 nsplit = gridDim.y, me = blockIdx.y;
    const i64 part = ((i64)B.row * heads + B.h0) * nsplit;  // split 0 of the group's first head
    if (!out || nsplit > 1) {
        // The partials: every tile for the combine, else the tiles other splits merge.
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const u32 h = 16 * wr + g + 8 * rr;
            if (h >= B.hg) continue;
            float* dst = o_part + (part + (i64)h * nsplit + me) * latent;
#pragma unroll
            for (int mb = 0; mb < 4; mb++) {
                const u32 k = 4 * wg + mb;
                if (k < nmb && !(out && k % nsplit == me))
#pragma unroll
                    for (int j = 0; j < 8; j++) *(float2*)(dst + 64 * k + 8 * j + 2 * t) = make_float2(o[mb][4 * j + 2 * rr], o[mb][4 * j + 2 * rr + 1]);
            }
            if (wg == 0 && t == 0) *(float2*)(ml_part + (part + (i64)h * nsplit + me) * 2) = make_float2(m_run[rr], l[rr]);
        }
    }
    if (!out) return;
    if (nsplit > 1) mlh_wait_splits(sem);
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const u32 h = 16 * wr + g + 8 * rr;
        if (h >= B.hg) continue;
        const float* ml = ml_part + (part + (i64)h * nsplit) * 2;
        const float* op = o_part + (part + (i64)h * nsplit) * latent;
        float M = -WEFT_INF, L = 0.f;
        for (u32 s = 0; s < nsplit; s++) M = fmaxf(M, s == me ? m_run[rr] : mlh_ld2(ml + 2 * s).x);
        for (u32 s = 0; s < nsplit; s++) {
            const float2 m_l = s == me ? make_float2(m_run[rr], l[rr]) : mlh_ld2(ml + 2 * s);
            L += __fmul_rn(mla_split_weight(m_l.x, M), m_l.y);
        }
        float* dst = out + ((i64)B.row * heads + B.h0 + h) * latent;
#pragma unroll
        for (int mb = 0; mb < 4; mb++) {
            const u32 k = 4 * wg + mb;
            if (k >= nmb || k % nsplit != me) continue;
            float a[16];
#pragma unroll
            for (int i = 0; i < 16; i++) a[i] = 0.f;
            for (u32 s = 0; s < nsplit; s++) {
                const float m = s == me ? m_run[rr] : mlh_ld2(ml + 2 * s).x;
                float2 v[8];
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = s == me ? make_float2(o[mb][4 * j + 2 * rr], o[mb][4 * j + 2 * rr + 1]) : mlh_ld2(op + (i64)s * latent + 64 * k + 8 * j + 2 * t);
                const float e = mla_split_weight(m, M);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    a[2 * j] += e * v[j].x;
                    a[2 * j + 1] += e * v[j].y;
                }
            }
#pragma unroll
            for (int j = 0; j < 8; j++) *(float2*)(dst + 64 * k + 8 * j + 2 * t) = make_float2(a[2 * j] / L, a[2 * j + 1] / L);
        }
    }
}

// An empty split of the 64-head kernels merges as nothing: zero outputs, no maximum, no sum.
// (Its own zeros, not the loop's accumulators: a path around the loop that reaches them makes
// ptxas serialise every wgmma.)
__device__ __forceinline__ void mlh_empty(const MlaBlock& B, u32 heads, u32 latent, float* o_part, float* ml_part, float* out, u32* sem) {
    const u32 tid = threadIdx.x, lane = tid % 32;
    float z[4][32];
#pragma unroll
    for (int mb = 0; mb < 4; mb++)
#pragma unroll
        for (int i = 0; i < 32; i++) z[mb][i] = 0.f;
    const float m[2] = {-WEFT_INF, -WEFT_INF}, l[2] = {0.f, 0.f};
    mlh_store(z, m, l, B, o_part, ml_part, out, sem, heads, latent, latent / 64, tid / 128, tid / 32 % 4, lane / 4, lane % 4);
}

// This thread's accumulator rows (rr = 0, 1: elements 4j + 2rr + c of each 64-column tile)
// times f[rr], skipped for a row whose factor is 1 (the running max did not move).
__device__ __forceinline__ void mlh_rescale(float (&o)[4][32], const float (&f)[2]) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
        if (f[rr] != 1.f)
#pragma unroll
            for (int mb = 0; mb < 4; mb++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    o[mb][4 * j + 2 * rr] *= f[rr];
                    o[mb][4 * j + 2 * rr + 1] *= f[rr];
                }
}

// Each of this thread's rows' sum over both warpgroups of the 64-head kernels: the quad's partial
// sums `l_run` added, then the other warpgroup's through `xm` (128 floats of shared memory).
__device__ __forceinline__ void mlh_sums(const float (&l_run)[2], float* xm, u32 wg, u32 wr, u32 g, u32 t, float (&l)[2]) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] = l_run[rr];
        l[rr] += lane_xor(l[rr], 1);
        l[rr] += lane_xor(l[rr], 2);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
        if (t == 0) xm[wg * 64 + 16 * wr + g + 8 * rr] = l[rr];
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; rr++) l[rr] = xm[16 * wr + g + 8 * rr] + xm[64 + 16 * wr + g + 8 * rr];
}

// Same inputs, grid and partial outputs as mla_decode_wg2_bf16; blocks of 256 threads, head
// groups of at most 64 (gsize), latent at most 512 in whole 64-column tiles. PARTS = 2: queries
// and weights as hi and lo bf16 parts (the default's precision); 1: both rounded to bf16 once
// (FlashMLA's numerics, ~1e-3 from the f32 reference; opt-in `mla_decode_wgh1_bf16`, for
// measuring what the second parts cost — no lo buffer, half the products: 185 against 220 µs
// at 64 heads, so the products are not what bounds it; four tiles in flight in the space freed
// measured no faster, 189).
template <int PARTS>
__device__ __forceinline__ void mla_wgh_body(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk, float* out, u32* sem) {
    WEFT_DYNAMIC_SHARED(uint4, mlh_smem);
    unsigned char* sm = wg_align1024(mlh_smem);
    const u32 w = latent + rd, gw = w / 8, nc = (w + 63) / 64, nks = w / 16, nmb = latent / 64;
    unsigned char* tiles = sm;                       // [2][nc][MLH_CHUNK]
    unsigned char* qh = tiles + 2 * nc * MLH_CHUNK;  // [nc][MLH_QCHUNK]: queries' hi part, K-major
    unsigned char* ql = qh + nc * MLH_QCHUNK;        // the lo part (two parts)
    float* xs = (float*)(ql + (PARTS - 1) * nc * MLH_QCHUNK);  // [16][128]: the scores' exchange
    const u32 tid = threadIdx.x, lane = tid % 32, wg = wg_uniform(tid / 128), wr = tid / 32 % 4, g = lane / 4, t = lane % 4;
    const u32 k0 = wg * nks / 2, k1 = (wg + 1) * nks / 2;
    const MlaBlock B = mla_block(MLH_T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 ntiles = (B.t_end - B.t_begin + MLH_T - 1) / MLH_T;
    if (ntiles > 0) mlw_load<MLH_T, 256>(tiles, layer, B.table, B.t_begin, B.t_end, page, w);
    // Queries while the first tile loads.
    mlh_queries<PARTS>(qh, ql, q_lat, q_pe, B, heads, latent, rd, gw);
    // This thread's rows: heads 16 · wr + g (rr = 0) and + 8 (rr = 1); accumulator element
    // 4j + 2rr + c is column 8j + 2t + c.
    float m_run[2] = {-WEFT_INF, -WEFT_INF}, l_run[2] = {0.f, 0.f}, o[4][32];
#pragma unroll
    for (int mb = 0; mb < 4; mb++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[mb][i] = 0.f;
    const u64 dqh = wg_desc(qh), dql = wg_desc(ql);

    for (u32 it = 0; it < ntiles; it++) {
        const u32 base = B.t_begin + it * MLH_T, cnt = min((u32)MLH_T, B.t_end - base);
        unsigned char* tile = tiles + (it % 2) * nc * MLH_CHUNK;
        cp_async_wait<0>();
        fence_async_shared();
        __syncthreads();
        // The other buffer's readers (the previous tile's products) are done: load ahead.
        if (it + 1 < ntiles) mlw_load<MLH_T, 256>(tiles + ((it + 1) % 2) * nc * MLH_CHUNK, layer, B.table, base + MLH_T, B.t_end, page, w);
        float s[16];
        const u64 dt = wg_desc(tile), dtv = wg_desc_mn(tile);
        wg_fence();
        wgmma_n32_ss_first(s, wg_desc_add(dqh, wg_kstep(k0, MLH_QCHUNK)), wg_desc_add(dt, wg_kstep(k0, MLH_CHUNK)));
        if (PARTS == 2) wgmma_n32_ss<0>(s, wg_desc_add(dql, wg_kstep(k0, MLH_QCHUNK)), wg_desc_add(dt, wg_kstep(k0, MLH_CHUNK)));
        for (u32 k = k0 + 1; k < k1; k++) {
            const u64 b = wg_desc_add(dt, wg_kstep(k, MLH_CHUNK));
            const u32 qa = wg_kstep(k, MLH_QCHUNK);
            wgmma_n32_ss<0>(s, wg_desc_add(dqh, qa), b);
            if (PARTS == 2) wgmma_n32_ss<0>(s, wg_desc_add(dql, qa), b);
        }
        wg_commit();
        wg_wait<0>();
        // Warpgroup 1's partial sums to warpgroup 0, which adds them and hands the sums back.
        if (wg == 1)
#pragma unroll
            for (int i = 0; i < 16; i++) xs[i * 128 + tid % 128] = s[i];
        __syncthreads();
        if (wg == 0)
#pragma unroll
            for (int i = 0; i < 16; i++) xs[i * 128 + tid] = s[i] += xs[i * 128 + tid];
        __syncthreads();
        if (wg == 1)
#pragma unroll
            for (int i = 0; i < 16; i++) s[i] = xs[i * 128 + tid % 128];
        // Softmax along this thread's two rows: its 8 columns, then the quad's.
        float corr[2];
        u32 ph[2][4], pl[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const float mx = wg_masked_row_max<32>(s, rr, 0, cnt, scale, t);
            const float m_new = fmaxf(m_run[rr], mx);
            corr[rr] = expf(m_run[rr] - m_new);
            m_run[rr] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int i = 4 * j + 2 * rr + c;
                    s[i] = expf(s[i] - m_new);
                    sum += s[i];
                }
            l_run[rr] = l_run[rr] * corr[rr] + sum;
        }
        // The weights as A fragments of the value product's two 16-token steps: register q
        // holds row (q % 2 ? g + 8 : g), tokens 16kk + 8 · (q / 2) + 2t (+ 1).
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int i = 4 * (2 * kk + q / 2) + 2 * (q % 2);
                split_bf16x2(s[i], s[i + 1], ph[kk][q], pl[kk][q]);
            }
        mlh_rescale(o, corr);
        wg_fence();
#pragma unroll
        for (int mb = 0; mb < 4; mb++)
            if (4 * wg + mb < nmb)
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const u64 b = wg_desc_add(dtv, (4 * wg + mb) * MLH_CHUNK + kk * 2048);
                    wgmma_n64_rs(o[mb], ph[kk], b);
                    if (PARTS == 2) wgmma_n64_rs(o[mb], pl[kk], b);
                }
        wg_commit();
        wg_wait<0>();
    }
    // Each row's sum over its quad.
    float l[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] = l_run[rr];
        l[rr] += lane_xor(l[rr], 1);
        l[rr] += lane_xor(l[rr], 2);
    }
    mlh_store(o, m_run, l, B, o_part, ml_part, out, sem, heads, latent, nmb, wg, wr, g, t);
}
extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_wgh_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk, float* out, u32* sem) {
    WEFT_PDL_ENTRY();
    mla_wgh_body<2>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk, out, sem);
}
extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_wgh1_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk, float* out, u32* sem) {
    WEFT_PDL_ENTRY();
    mla_wgh_body<1>(layer, q_lat, q_pe, bt, bt_off, ctx, o_part, ml_part, heads, groups, gsize, latent, rd, page, scale, chunk, out, sem);
}

// ---- The tile's tokens split between the warpgroups (mla_decode_wgs_bf16): up to 64 heads ----
//
// The 64-head kernel above is bound by its per-tile chain, not by memory or the tensor cores:
// both warpgroups take half the width of one 32-token tile's scores, meet to add them, run the
// same softmax and then split the values — three barriers and a drained tensor pipe every 32
// tokens — and the queries' and weights' two bf16 parts fill shared memory with Q, leaving room
// for two 32-token tiles only. Here, as FlashMLA does, the queries and the weights are one bf16
// part each (rounded once: ~1e-3 from the f32 paths, within the bf16 cache's own tolerance;
// half the products), which frees room for 64-token tiles, two in flight; and each warpgroup
// scores its own 32 tokens of the tile over the full width — S_w (64 heads x 32) = Q · K_w^T —
// so no partial scores are exchanged. The row maxima meet in shared memory (64 floats a
// warpgroup, one barrier: both then hold the same maximum, a max of the same values), each
// warpgroup writes its weights (bf16) into its half of a 64 x 64 P in shared memory (a second
// barrier), and each multiplies all 64 tokens' weights into its 256 latent columns: O_w (64 x
// 256) += P · V[:, 256w ..], both operands from shared memory. The value products are not
// waited for where they are issued: they drain while the next tile's wait and barrier run, and
// the tile after next is requested as soon as every warp has passed that barrier — a tile of
// memory in flight for nearly the whole step. Shared memory: two 64-token tiles (72 KB each at
// width 576), Q (72 KB), P (8 KB), the maxima (512 bytes) — 226 KB.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(WEFT_NO_PTX)
// d (64 x 64) += A (64 x 16 at da, K-major) x B (16 x 64 at db, N-major: transposed).
__device__ __forceinline__ void wgmma_n64_ss_tb(float (&d)[32], u64 da, u64 db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ void wgmma_n64_ss_tb(float (&d)[32], u64 da, u64 db) { emu_wgmma_ss<64>(d, da, db, 0, 1); }
#else
__device__ __forceinline__ void wgmma_n64_ss_tb(float (&)[32], u64, u64) { WG_TRAP(); }
#endif

// Same inputs, grid and partial outputs as mla_decode_wgh_bf16 (blocks of 256 threads, head
// groups of at most 64, latent at most 512 in whole 64-column tiles); tiles of MLW_T tokens.
extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_wgs_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk, float* out, u32* sem) {
    WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(uint4, mls_smem);
    unsigned char* sm = wg_align1024(mls_smem);
    const u32 w = latent + rd, gw = w / 8, nc = (w + 63) / 64, nks = w / 16, nmb = latent / 64;
    unsigned char* tiles = sm;                       // [2][nc][MLW_CHUNK]
    unsigned char* qs = tiles + 2 * nc * MLW_CHUNK;  // [nc][MLH_QCHUNK]: the queries, K-major
    unsigned char* ps = qs + nc * MLH_QCHUNK;        // [64 heads][128 bytes]: P, K-major
    float* xm = (float*)(ps + 64 * 128);             // [2][64]: each warpgroup's row maxima, then sums
    const u32 tid = threadIdx.x, lane = tid % 32, wg = wg_uniform(tid / 128), wr = tid / 32 % 4, g = lane / 4, t = lane % 4;
    const MlaBlock B = mla_block(MLW_T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 ntiles = (B.t_end - B.t_begin + MLW_T - 1) / MLW_T;
    if (ntiles == 0) {
        // (Returning here keeps the loop's value products the only definitions of the
        // accumulators after it — a path around the loop made ptxas serialise every wgmma.)
        mlh_empty(B, heads, latent, o_part, ml_part, out, sem);
        return;
    }
    mlw_load<MLW_T, 256>(tiles, layer, B.table, B.t_begin, B.t_end, page, w);
    // Queries while the first tile loads, rounded to bf16.
    mlh_queries<1>(qs, nullptr, q_lat, q_pe, B, heads, latent, rd, gw);
    // This thread's rows: heads 16 · wr + g (rr = 0) and + 8 (rr = 1); accumulator element
    // 4j + 2rr + c is column 8j + 2t + c (a token of this warpgroup's half in S, a latent
    // column of its 64-column tile in O).
    float m_run[2] = {-WEFT_INF, -WEFT_INF}, l_run[2] = {0.f, 0.f}, o[4][32];
#pragma unroll
    for (int mb = 0; mb < 4; mb++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[mb][i] = 0.f;
    const u64 dq = wg_desc(qs), dp = wg_desc(ps);

    for (u32 it = 0; it < ntiles; it++) {
        const u32 base = B.t_begin + it * MLW_T, cnt = min((u32)MLW_T, B.t_end - base);
        unsigned char* tile = tiles + (it % 2) * nc * MLW_CHUNK;
        // The previous tile's value products (this warpgroup's) are done, this tile is here.
        wg_wait<0>();
        cp_async_wait<0>();
        fence_async_shared();
        __syncthreads();
        // Every warp is past the previous tile's products: its buffer takes the next tile.
        if (it + 1 < ntiles) mlw_load<MLW_T, 256>(tiles + ((it + 1) % 2) * nc * MLW_CHUNK, layer, B.table, base + MLW_T, B.t_end, page, w);
        // S_w: this warpgroup's 32 tokens (rows 32w.. of the tile) over the full width.
        float s[16];
        const u64 dt = wg_desc(tile + wg * 32 * 128);
        wg_fence();
        wgmma_n32_ss_first(s, dq, dt);
        for (u32 k = 1; k < nks; k++) wgmma_n32_ss<0>(s, wg_desc_add(dq, wg_kstep(k, MLH_QCHUNK)), wg_desc_add(dt, wg_kstep(k, MLW_CHUNK)));
        wg_commit();
        wg_wait<0>();
        // Row maxima of this warpgroup's tokens: a thread's 8 values, then its quad's.
        float mx[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            mx[rr] = wg_masked_row_max<32>(s, rr, 32 * wg, cnt, scale, t);
            if (t == 0) xm[wg * 64 + 16 * wr + g + 8 * rr] = mx[rr];
        }
        __syncthreads();
        // The tile's maximum (both warpgroups compute the same), the weights into this
        // warpgroup's half of P, the sums of the rounded weights, the outputs rescaled.
        float corr[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const u32 h = 16 * wr + g + 8 * rr;
            const float m_new = fmaxf(m_run[rr], fmaxf(mx[rr], xm[(1 - wg) * 64 + h]));
            corr[rr] = expf(m_run[rr] - m_new);
            m_run[rr] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = 4 * j + 2 * rr;
                const u32 pk = bf16x2(expf(s[i] - m_new), expf(s[i + 1] - m_new));
                sum += __uint_as_float(pk << 16) + __uint_as_float(pk & 0xffff0000u);
                *(u32*)mlw_p_at(ps, h, 32 * wg + 8 * j + 2 * t) = pk;
            }
            l_run[rr] = l_run[rr] * corr[rr] + sum;
        }
        mlh_rescale(o, corr);
        fence_async_shared();
        __syncthreads();
        // O_w += P · V[:, this warpgroup's columns], all 64 tokens; waited for at the next tile.
        // (Its own 32 tokens' weights as the A operand from registers, as `_wgh_` does, measured
        // slower: 157.5 against 155.2 µs at 64 heads, more time stalled on the tensor cores.)
        const u64 dtv = wg_desc_mn(tile);
        wg_fence();
#pragma unroll
        for (int mb = 0; mb < 4; mb++)
            if (4 * wg + mb < nmb)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_n64_ss_tb(o[mb], wg_desc_add(dp, 32 * kk), wg_desc_add(dtv, (4 * wg + mb) * MLW_CHUNK + kk * 2048));
        wg_commit();
    }
    wg_wait<0>();
    // Each row's sum (the same maxima rescaled both warpgroups' sums).
    float l[2];
    mlh_sums(l_run, xm, wg, wr, g, t, l);
    mlh_store(o, m_run, l, B, o_part, ml_part, out, sem, heads, latent, nmb, wg, wr, g, t);
}
