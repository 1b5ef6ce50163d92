// Prefill attention per head in one pass (flash-style; NVIDIA mma.sync m16n8k16 with ldmatrix,
// emulated on the CPU): the one-bf16-part rows of a prompt run (runtime/backend-cuda/src/
// mla_prefill.rs, `precision.rs`) attend over their decompressed keys and values without the
// scores ever leaving the SM. The path it replaces wrote f32 scores per head to memory, read
// them back for the causal softmax, wrote the weights as bf16 and read them again for P·V
// (cuBLAS, the whole query-tile × key rectangle); here each block keeps its rows' running
// maximum and sum in registers and rescales its output accumulators per key tile.
//
// Operands: queries as the model makes them, f32 q_nope [rows][heads][FA_NOPE] and q_pe
// [rows][heads][FA_KW − FA_NOPE], rounded to bf16 as the block loads them (the bits
// mla_q_split would give); keys bf16 [keys][heads][FA_KW] (k_nope, then the shared rotary
// part: the DeepSeek-V3 / Kimi-K2 widths 128 + 64), values bf16 [keys][heads][FA_VW]; row i of
// the run sees keys 0..=ctx0 + i. Output f32 [rows][out_ld] at head h's FA_VW columns.
//
// Block (x, y): 64 query rows of head y, 4 warps of 16 rows; x counts from the last query tile,
// so the blocks that see the most keys start first. Key tiles of 64 keys, two in shared memory
// (cp.async: the next arrives while this one is used). A warp holds its 16 rows' query fragments
// (12 k-steps of 16 columns) in registers for the whole pass; per key tile it forms S (16 × 64,
// f32), masks keys past each row's position on the diagonal tiles, takes the new row maxima
// (scaled by log2 e, so exp2), rescales O and the partial sums, rounds P = exp2(S − m) to bf16 in
// the A-fragment layout straight from the accumulators, and adds P·V (values read transposed by
// ldmatrix.trans). The rows' sums are of the f32 weights; O is divided by them at the end.
// Precision: the bf16-grade of the path it replaces (whose weights were normalised before their
// rounding; here they are rounded before it), f32 accumulation throughout.
#define FA_BM 64
// Variants for measurements (WEFT_CUDA_KERNEL_DEFINES; mla_prefill.rs sizes shared memory by
// WEFT_FA_BN): keys per tile (64, or 32: half the S and P registers, 69 KB of shared memory),
// blocks per SM the registers are capped for (WEFT_FA_MINB, default 2), and the query fragments
// read from shared memory at every k-step instead of held in registers (WEFT_FA_QSMEM).
#ifdef WEFT_FA_BN
#define FA_BN WEFT_FA_BN
#else
#define FA_BN 64
#endif
#ifdef WEFT_FA_MINB
#define FA_MINB WEFT_FA_MINB
#else
#define FA_MINB 2
#endif
#define FA_KW 192
#define FA_NOPE 128
#define FA_VW 128
#define FA_KLD (FA_KW + 8)  // shared row strides in bf16: 400 and 272 bytes, ≡ 16 (mod 128), so
#define FA_VLD (FA_VW + 8)  // the eight rows of an ldmatrix phase fall in distinct bank groups
#define FA_STAGE (FA_BN * FA_KLD + FA_BN * FA_VLD)
// Shared memory of a block in bytes (the host's launch asks for the same).
#define FA_SMEM_BYTES (2 * (FA_BM * FA_KLD + 2 * FA_STAGE))

extern "C" __global__ void __launch_bounds__(128, FA_MINB)
    mla_flash_bf16(const float* __restrict__ qn, const float* __restrict__ qp, const u16* __restrict__ k, const u16* __restrict__ v, float* __restrict__ out, u32 rows, u32 ctx0, u32 heads, u32 out_ld, float scale) {
    WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(uint4, fa_smem);
    u16* sq = (u16*)fa_smem;
    const u32 tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    const u32 h = blockIdx.y, i0 = (gridDim.x - 1 - blockIdx.x) * FA_BM;
    const i64 kld = (i64)heads * FA_KW, vld = (i64)heads * FA_VW;
    const u32 last = ctx0 + min(i0 + FA_BM, rows);  // keys the block's last row sees: 0..last - 1
    const u32 tiles = (last + FA_BN - 1) / FA_BN;
    for (u32 j = tid; j < FA_BM * (FA_KW / 8); j += 128) {
        const u32 r = j / (FA_KW / 8), c = j % (FA_KW / 8);
        uint4 b = make_uint4(0u, 0u, 0u, 0u);
        if (i0 + r < rows) {
            const i64 qr = (i64)(i0 + r) * heads + h;
            const float* src = c < FA_NOPE / 8 ? qn + qr * FA_NOPE + 8 * c : qp + qr * (FA_KW - FA_NOPE) + 8 * (c - FA_NOPE / 8);
            const float4 a = *(const float4*)src, e = *(const float4*)(src + 4);
            b = make_uint4(bf16x2(a.x, a.y), bf16x2(a.z, a.w), bf16x2(e.x, e.y), bf16x2(e.z, e.w));
        }
        *(uint4*)(sq + r * FA_KLD + 8 * c) = b;
    }
    // Key tile `it` into stage `it % 2`; keys past `last` as zeros (masked for every stored row).
    auto load = [&](u32 it) {
        u16* sk = sq + FA_BM * FA_KLD + (it % 2) * FA_STAGE;
        u16* sv = sk + FA_BN * FA_KLD;
        const u32 key0 = it * FA_BN;
        for (u32 j = tid; j < FA_BN * (FA_KW / 8); j += 128) {
            const u32 r = j / (FA_KW / 8), c = j % (FA_KW / 8);
            const bool ok = key0 + r < last;
            cp_async16(sk + r * FA_KLD + 8 * c, k + (ok ? (key0 + r) * kld : 0) + h * FA_KW + 8 * c, ok ? 16u : 0u);
        }
        for (u32 j = tid; j < FA_BN * (FA_VW / 8); j += 128) {
            const u32 r = j / (FA_VW / 8), c = j % (FA_VW / 8);
            const bool ok = key0 + r < last;
            cp_async16(sv + r * FA_VLD + 8 * c, v + (ok ? (key0 + r) * vld : 0) + h * FA_VW + 8 * c, ok ? 16u : 0u);
        }
    };
    load(0);
    cp_async_commit();
#ifndef WEFT_FA_QSMEM
    u32 qf[FA_KW / 16][4];
#endif
    float o[FA_VW / 8][4];
#pragma unroll
    for (int d = 0; d < FA_VW / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m[2] = {-WEFT_INF, -WEFT_INF}, l[2] = {0.f, 0.f};
    const float sl2 = scale * 1.4426950408889634f;
    const u32 row0 = i0 + warp * 16 + g;  // this lane's rows: row0 (c0, c1) and row0 + 8 (c2, c3)
    for (u32 it = 0; it < tiles; it++) {
        if (it + 1 < tiles) load(it + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const u16* qrow = sq + (warp * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * FA_KLD + 8 * (lane / 16);
#ifndef WEFT_FA_QSMEM
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < FA_KW / 16; kk++) ldsm_x4(qf[kk], qrow + kk * 16);
        }
#endif
        const u16* sk = sq + FA_BM * FA_KLD + (it % 2) * FA_STAGE;
        const u16* sv = sk + FA_BN * FA_KLD;
        float s[FA_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FA_KW / 16; kk++) {
#ifdef WEFT_FA_QSMEM
            u32 qk[4];
            ldsm_x4(qk, qrow + kk * 16);
#else
            const u32(&qk)[4] = qf[kk];
#endif
#pragma unroll
            for (int np = 0; np < FA_BN / 16; np++) {
                u32 b[4];
                ldsm_x4(b, sk + (np * 16 + 8 * (lane / 16) + lane % 8) * FA_KLD + kk * 16 + 8 * ((lane / 8) % 2));
                mma_bf16_16816(s[2 * np], qk[0], qk[1], qk[2], qk[3], b[0], b[1]);
                mma_bf16_16816(s[2 * np + 1], qk[0], qk[1], qk[2], qk[3], b[2], b[3]);
            }
        }
        // Scale, mask the diagonal tiles, new maxima over the row's four lanes.
        const u32 key0 = it * FA_BN;
        const bool diag = key0 + FA_BN - 1 > ctx0 + i0;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[n][e] * sl2;
                if (diag && key0 + 8 * n + 2 * t + (e & 1) > ctx0 + row0 + 8 * (e >> 1)) x = -WEFT_INF;
                s[n][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], lane_xor(mx[i], 1));
            mx[i] = fmaxf(mx[i], lane_xor(mx[i], 2));
            corr[i] = exp2f(m[i] - mx[i]);  // 0 on the first tile (m = -inf; mx is finite: key 0)
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int d = 0; d < FA_VW / 8; d++) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
        // P = exp2(S − m) as A fragments: keys 16kk..16kk + 15 are n-tiles 2kk and 2kk + 1.
        u32 pa[FA_BN / 16][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++) {
            const float p0 = exp2f(s[n][0] - m[0]), p1 = exp2f(s[n][1] - m[0]);
            const float p2 = exp2f(s[n][2] - m[1]), p3 = exp2f(s[n][3] - m[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            pa[n / 2][2 * (n % 2)] = bf16x2(p0, p1);
            pa[n / 2][2 * (n % 2) + 1] = bf16x2(p2, p3);
        }
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < FA_VW / 16; dp++) {
                u32 b[4];
                ldsm_x4_trans(b, sv + (kk * 16 + 8 * ((lane / 8) % 2) + lane % 8) * FA_VLD + dp * 16 + 8 * (lane / 16));
                mma_bf16_16816(o[2 * dp], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[0], b[1]);
                mma_bf16_16816(o[2 * dp + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += lane_xor(l[i], 1);
        l[i] += lane_xor(l[i], 2);
        inv[i] = 1.0f / l[i];
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 r = row0 + 8 * i;
        if (r >= rows) continue;
        float* dst = out + (i64)r * out_ld + h * FA_VW + 2 * t;
#pragma unroll
        for (int d = 0; d < FA_VW / 8; d++) *(float2*)(dst + 8 * d) = make_float2(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]);
    }
}
