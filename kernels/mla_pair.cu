// MLA decode, 64 heads a block, two 64-token tiles a step in ping-pong between the warpgroups
// (`mla_decode_wgp_bf16`, sm_90a, bf16 cache of DeepSeek-V3 / Kimi-K2 width: latent 512 + rope
// 64). Same inputs, grid and partial outputs as mla_wgmma.cu's 64-head kernels.
//
// mla_decode_wgs_bf16 runs both warpgroups in lockstep over one tile: scores, softmax, two
// barriers, value products — the tensor cores idle while both run the softmax, the loads of a
// tile wait until both have multiplied the one before, and 40 % of a tile's time is products.
// Here (after FlashMLA's "seesaw") warpgroup 0 owns tile A = 2k of step k and warpgroup 1 tile
// B = 2k + 1, each scoring its whole tile (S = Q · K^T, m64n64, 36 steps), and each owns half the
// output columns (O_L: latent 0–255, O_R: 256–511; m64n256 value products, the weights read once
// per 16 tokens instead of four times):
//   WG0: softmax of A against the running max M (-> M_a, c0 = 2^(M - M_a), bf16 P_A into shared
//        memory for WG1), O_L · c0, O_L += P_A · V_A[:, L] (P_A from registers); once WG1 has
//        c1 and P_B: O_L · c1, O_L += P_B · V_B[:, L] (P_B from shared memory); the next A's
//        scores.
//   WG1: O_R · c0, O_R += P_A · V_A[:, R] issued first, so that it runs during WG1's own softmax
//        of B (against M_a: M_b, c1 = 2^(M_a - M_b), bf16 P_B into shared memory for WG0); then
//        O_R · c1, O_R += P_B · V_B[:, R] (registers); the next B's scores.
// Both end a step relative to M_b; each keeps the sum of the weights it computed, added at the
// end. (FlashMLA's own order — WG0 scaling P_A by c1 before WG1 multiplies it — measured 237
// against 222 µs at 128 heads, round 25.) Max, scales and the two P tiles meet in shared memory
// behind two named barriers a step (bar.arrive / bar.sync between the two warpgroups only; no
// block barrier in the loop).
//
// Loads: each tile buffer has two halves — columns 0–255 (chunks 0–3), loaded by warpgroup 0's
// threads, and 256–575 (chunks 4–8), by warpgroup 1's — each with an mbarrier that the loading
// threads' cp.asyncs arrive on (cp.async.mbarrier.arrive.noinc). A half is refilled with the
// next step's tile as soon as the last product reading it is done (its owner's value product:
// V[:, L] is read by warpgroup 0 only, V[:, R] and the rope part by warpgroup 1 and the other's
// scores, done earlier), not at a block-wide barrier. Scores start on a tile's first half while
// its second is still arriving.
//
// Shared memory: the two tiles (72 KB each), Q (72 KB; its rope chunk then holds P_B: that
// chunk of the queries lives in registers, the A operand of the last four score steps), P_A
// (8 KB), M and the scales (768 bytes), four mbarriers — 226.3 KB with the alignment slack.
// Numerics as mla_decode_wgs_bf16: queries and weights one bf16 part each (FlashMLA's), the
// softmax in base 2 (scores scaled by scale · log2 e; the max written out times ln 2), sums of
// the unrounded weights.
#define MLP_T 64                       // tokens per tile
#define MLP_NC 9                       // 64-column chunks of a cache row (576 columns)
#define MLP_CHUNK (MLP_T * 128)        // one 64-column chunk of a tile (and of Q)
#define MLP_TILE (MLP_NC * MLP_CHUNK)  // one tile buffer
// Named barriers between the warpgroups (0 is __syncthreads): each is arrived at by one
// warpgroup and waited at by the other, once a step.
#define MLP_BAR_SCALE0 1  // WG0 wrote M_a, c0 and P_A
#define MLP_BAR_SCALE1 2  // WG1 wrote M_b, c1 and P_B
// A warpgroup's own barrier (3 + its index, 128 threads): between its wait for a product and
// refilling what that product read — each warp waits for its own share of the product, and each
// refills rows that every warp's share reads.
#define MLP_BAR_WG 3
// mbarriers a tile buffer: one a half (chunks 0–3, loaded by warpgroup 0; 4–8, by warpgroup 1).
// One a chunk, so that scores start on each chunk as it lands, measured slower (round 25: 235
// against 224 µs at 128 heads, the same at 64).
#define MLP_NB 2
// The mbarrier of chunk ch among a buffer's MLP_NB.
__device__ __forceinline__ constexpr int mlp_bar(int ch) { return ch >= 4; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(WEFT_NO_PTX)
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b, u32 n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(n) : "memory"); }
// Waits until the phase of parity `parity` has completed; then makes what the arrivals wrote
// (cp.async into shared memory) visible to this thread's tensor-core reads.
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nMBW_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra MBW_WAIT;\n}" ::"r"(smem_u32(b)),
        "r"(parity)
        : "memory");
    fence_async_shared();
}
// The mbarrier's arrival once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(u64* b) { asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b)) : "memory"); }
__device__ __forceinline__ void bar_sync_n(u32 id, u32 n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive_n(u32 id, u32 n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
#define MLP_F4(a, i) "+f"(a[i]), "+f"(a[i + 1]), "+f"(a[i + 2]), "+f"(a[i + 3])
#define MLP_F32(a) MLP_F4(a, 0), MLP_F4(a, 4), MLP_F4(a, 8), MLP_F4(a, 12), MLP_F4(a, 16), MLP_F4(a, 20), MLP_F4(a, 24), MLP_F4(a, 28)
#define MLP_D128                                                                                                                                                                                                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
    "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "   \
    "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define MLP_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
// o (64 x 256: four 64-column tiles) += A (64 x 16 from this thread's fragment registers, as
// wgmma_n64_rs) x B (16 x 256 at db, N-major: 64-column chunks MLP_CHUNK apart — wg_desc_mn's
// leading offset).
__device__ __forceinline__ void wgmma_n256_rs_tb(float (&o)[4][32], const u32 (&a)[4], u64 db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLP_D128 ", {%128, %129, %130, %131}, %132, 1, 1, 1, 1;"
                 : MLP_F32(o[0]), MLP_F32(o[1]), MLP_F32(o[2]), MLP_F32(o[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// The same with A (64 x 16 at da, K-major) from shared memory.
__device__ __forceinline__ void wgmma_n256_ss_tb(float (&o)[4][32], u64 da, u64 db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLP_D128 ", %128, %129, 1, 1, 1, 0, 1;" : MLP_F32(o[0]), MLP_F32(o[1]), MLP_F32(o[2]), MLP_F32(o[3]) : "l"(da), "l"(db));
}
// s (64 x 64) += A (64 x 16 at da, K-major) x B (64 rows x 16 at db, K-major): the scores.
__device__ __forceinline__ void wgmma_n64_ss_kb(float (&s)[32], u64 da, u64 db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLP_D32 ", %32, %33, 1, 1, 1, 0, 0;" : MLP_F32(s) : "l"(da), "l"(db));
}
// The same with A from this thread's fragment registers.
__device__ __forceinline__ void wgmma_n64_rs_kb(float (&s)[32], const u32 (&a)[4], u64 db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLP_D32 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;" : MLP_F32(s) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#elif defined(WEFT_EMU)
__device__ __forceinline__ void mbar_init(u64* b, u32 n) { emu_mbar_init(b, n); }
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) { emu_mbar_wait(b, parity); }
__device__ __forceinline__ void cp_async_mbar_arrive(u64* b) { emu_mbar_arrive(b); }
__device__ __forceinline__ void bar_sync_n(u32 id, u32 n) { emu_bar_sync(id, n); }
__device__ __forceinline__ void bar_arrive_n(u32 id, u32 n) { emu_bar_arrive(id, n); }
__device__ __forceinline__ void wgmma_n256_rs_tb(float (&o)[4][32], const u32 (&a)[4], u64 db) { emu_wgmma_rs<256>(*(float(*)[128])o, a, db, 1); }
__device__ __forceinline__ void wgmma_n256_ss_tb(float (&o)[4][32], u64 da, u64 db) { emu_wgmma_ss<256>(*(float(*)[128])o, da, db, 0, 1); }
__device__ __forceinline__ void wgmma_n64_ss_kb(float (&s)[32], u64 da, u64 db) { emu_wgmma_ss<64>(s, da, db, 0, 0); }
__device__ __forceinline__ void wgmma_n64_rs_kb(float (&s)[32], const u32 (&a)[4], u64 db) { emu_wgmma_rs<64>(s, a, db, 0); }
#else
__device__ __forceinline__ void mbar_init(u64*, u32) { WG_TRAP(); }
__device__ __forceinline__ void mbar_wait(u64*, u32) { WG_TRAP(); }
__device__ __forceinline__ void cp_async_mbar_arrive(u64*) { WG_TRAP(); }
__device__ __forceinline__ void bar_sync_n(u32, u32) { WG_TRAP(); }
__device__ __forceinline__ void bar_arrive_n(u32, u32) { WG_TRAP(); }
__device__ __forceinline__ void wgmma_n256_rs_tb(float (&)[4][32], const u32 (&)[4], u64) { WG_TRAP(); }
__device__ __forceinline__ void wgmma_n256_ss_tb(float (&)[4][32], u64, u64) { WG_TRAP(); }
__device__ __forceinline__ void wgmma_n64_ss_kb(float (&)[32], u64, u64) { WG_TRAP(); }
__device__ __forceinline__ void wgmma_n64_rs_kb(float (&)[32], const u32 (&)[4], u64) { WG_TRAP(); }
#endif

// The block-table entry of the page holding tokens base..base + 63 where pages are whole tiles
// (read a step before the tile is loaded, so the copies do not wait for it), else 0.
__device__ __forceinline__ u32 mlp_page(const u32* table, u32 base, u32 end, u32 page) { return page % MLP_T == 0 && base < end ? table[base / page] : 0u; }

// Chunks C0..C1 - 1 (one half) of tokens base..base + 63 of the row's context into `tile` (rows
// past `end` zero-filled; a tile wholly past it is all zeros and costs no memory reads), by one
// warpgroup: thread (r = i / 8, c = i % 8) copies granule c of tokens r, r + 16, r + 32, r + 48
// (the same swizzle row), then arrives on the half's mbarrier in `bars` (the buffer's MLP_NB)
// once its copies have landed. `pg`: mlp_page's entry (pages of other sizes look each token up).
template <int C0, int C1>
__device__ __forceinline__ void mlp_load(unsigned char* tile, u64* bars, const u16* layer, const u32* table, u32 base, u32 end, u32 page, u32 pg) {
    const u32 i = threadIdx.x % 128, r = i / 8, c = i % 8;
    unsigned char* dst = tile + r * 128 + (c ^ (r % 8)) * 16;
    const bool one_page = page % MLP_T == 0;
    const i64 row0 = (i64)pg * page + base % page;
    const u16* src[MLP_T / 16];
    u32 bytes[MLP_T / 16];
#pragma unroll
    for (int tg = 0; tg < MLP_T / 16; tg++) {
        const u32 tt = r + 16 * tg, tok = base + tt;
        const bool in = tok < end;
        const i64 row = one_page ? row0 + tt : in ? (i64)table[tok / page] * page + tok % page : 0;
        src[tg] = in ? layer + row * (MLP_NC * 64) + 8 * c : layer;
        bytes[tg] = in ? 16 : 0;
    }
#pragma unroll
    for (int ch = C0; ch < C1; ch++)
#pragma unroll
        for (int tg = 0; tg < MLP_T / 16; tg++) cp_async16(dst + ch * MLP_CHUNK + tg * 16 * 128, src[tg] + 64 * ch, bytes[tg]);
    cp_async_mbar_arrive(bars + mlp_bar(C0));
}

// Scores S (64 heads x 64 tokens) = Q · K^T of `tile`, in two commit groups: chunks 0–3 once
// that half's mbarrier (of the buffer's `bars`) has completed the phase of parity `parity`,
// then chunks 4–7 and the rope chunk (its queries `rq` in registers) once the other half's has.
__device__ __forceinline__ void mlp_scores_lo(float (&s)[32], u64 dq, const unsigned char* tile, u64* bars, u32 parity) {
    mbar_wait(bars + mlp_bar(0), parity);
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
    const u64 dt = wg_desc(tile);
    wg_fence();
#pragma unroll 4
    for (int k = 0; k < 16; k++) wgmma_n64_ss_kb(s, wg_desc_add(dq, wg_kstep(k, MLP_CHUNK)), wg_desc_add(dt, wg_kstep(k, MLP_CHUNK)));
    wg_commit();
}
__device__ __forceinline__ void mlp_scores_hi(float (&s)[32], u64 dq, const u32 (&rq)[4][4], const unsigned char* tile, u64* bars, u32 parity) {
    mbar_wait(bars + mlp_bar(4), parity);
    const u64 dt = wg_desc(tile);
    wg_fence();
#pragma unroll 4
    for (int k = 16; k < 32; k++) wgmma_n64_ss_kb(s, wg_desc_add(dq, wg_kstep(k, MLP_CHUNK)), wg_desc_add(dt, wg_kstep(k, MLP_CHUNK)));
#pragma unroll
    for (int k = 0; k < 4; k++) wgmma_n64_rs_kb(s, rq[k], wg_desc_add(dt, wg_kstep(32 + k, MLP_CHUNK)));
    wg_commit();
}

// The tile's scores (this thread's rows h = 16 · wr + g + 8 · rr; s[4j + 2rr + c] is token
// 8j + 2t + c) to base-2 weights against the new running max of each row: masks tokens past
// `cnt`, takes the row max (a quad's 16 values), m_new = max(m_old, it) for m_old = sm[h] (read
// before the quad's shuffles, written by its t = 0 lane after them), s = 2^(s · sl2 - m_new),
// returns each row's sum in `sum` and writes m_new to sm.
__device__ __forceinline__ void mlp_softmax(float (&s)[32], float* sm, u32 cnt, float sl2, u32 wr, u32 g, u32 t, float (&m_old)[2], float (&m_new)[2], float (&sum)[2]) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const u32 h = 16 * wr + g + 8 * rr;
        m_old[rr] = sm[h];
        const float mx = wg_masked_row_max<64>(s, rr, 0, cnt, sl2, t);
        m_new[rr] = fmaxf(m_old[rr], mx);
        if (t == 0) sm[h] = m_new[rr];
        float l = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int i = 4 * j + 2 * rr + c;
                s[i] = exp2f(s[i] - m_new[rr]);
                l += s[i];
            }
        sum[rr] = l;
    }
}

// The weights as bf16: the A fragments of the value product's four 16-token steps (step k:
// tokens 16k + 2t (+ 1) in pa[k][0] (row g) / pa[k][1] (row g + 8), 16k + 8 + 2t (+ 1) in
// pa[k][2] / pa[k][3]).
__device__ __forceinline__ void mlp_pack(const float (&s)[32], u32 (&pa)[4][4]) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) pa[j / 2][2 * (j % 2) + rr] = bf16x2(s[4 * j + 2 * rr], s[4 * j + 2 * rr + 1]);
}
// Those weights times f[rr] (rounded again where f is not 1) as rows of P in shared memory
// (128-byte swizzled rows: the K-major A operand of the other warpgroup's product).
__device__ __forceinline__ void mlp_store(const u32 (&pa)[4][4], const float (&f)[2], unsigned char* ps, u32 wr, u32 g, u32 t) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            u32 pk = pa[j / 2][2 * (j % 2) + rr];
            if (f[rr] != 1.f) pk = bf16x2(__uint_as_float(pk << 16) * f[rr], __uint_as_float(pk & 0xffff0000u) * f[rr]);
            *(u32*)mlw_p_at(ps, 16 * wr + g + 8 * rr, 8 * j + 2 * t) = pk;
        }
}

extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_wgp_bf16(const u16* layer, const float* q_lat, const float* q_pe, const u32* bt, const u32* bt_off, const u32* ctx, float* o_part, float* ml_part, u32 heads, u32 groups, u32 gsize, u32 latent, u32 rd, u32 page, float scale, u32 chunk, float* out, u32* sem) {
    WEFT_PDL_ENTRY();
    WEFT_DYNAMIC_SHARED(uint4, mlp_smem);
    unsigned char* sm8 = wg_align1024(mlp_smem);
    unsigned char* tiles = sm8;                 // [2][MLP_TILE]
    unsigned char* qs = tiles + 2 * MLP_TILE;   // [MLP_NC][MLP_CHUNK]: Q, K-major
    unsigned char* p1 = qs + 8 * MLP_CHUNK;     // P_B, in Q's rope chunk once that is in registers
    unsigned char* p0 = qs + MLP_NC * MLP_CHUNK;  // P_A · c1
    float* sm = (float*)(p0 + MLP_CHUNK);       // [64] running max (base 2)
    float* sc0 = sm + 64;                       // [64] c0, then the sums' exchange (with sc1)
    float* sc1 = sc0 + 64;                      // [64] c1
    u64* bars = (u64*)(sc1 + 64);               // [2 tiles][MLP_NB]
    const u32 tid = threadIdx.x, lane = tid % 32, wg = wg_uniform(tid / 128), wr = tid / 32 % 4, g = lane / 4, t = lane % 4;
    const MlaBlock B = mla_block(MLP_T, ctx, bt, bt_off, heads, groups, gsize, chunk);
    const u32 ntiles = (B.t_end - B.t_begin + MLP_T - 1) / MLP_T, npairs = (ntiles + 1) / 2;
    if (ntiles == 0) {
        mlh_empty(B, heads, latent, o_part, ml_part, out, sem);
        return;
    }
    if (tid < 2 * MLP_NB) mbar_init(bars + tid, 128);
    if (tid < 64) sm[tid] = -WEFT_INF;
    __syncthreads();
    // Step 0's tiles: warpgroup 0 their first halves, warpgroup 1 their second.
    const u32 base0 = B.t_begin, base1 = B.t_begin + MLP_T;
    {
        const u32 pg0 = mlp_page(B.table, base0, B.t_end, page), pg1 = mlp_page(B.table, base1, B.t_end, page);
        if (wg == 0) {
            mlp_load<0, 4>(tiles, bars, layer, B.table, base0, B.t_end, page, pg0);
            mlp_load<0, 4>(tiles + MLP_TILE, bars + MLP_NB, layer, B.table, base1, B.t_end, page, pg1);
        } else {
            mlp_load<4, MLP_NC>(tiles, bars, layer, B.table, base0, B.t_end, page, pg0);
            mlp_load<4, MLP_NC>(tiles + MLP_TILE, bars + MLP_NB, layer, B.table, base1, B.t_end, page, pg1);
        }
    }
    mlh_queries<1>(qs, nullptr, q_lat, q_pe, B, heads, latent, rd, MLP_NC * 8);
    fence_async_shared();
    __syncthreads();
    // Q's rope chunk as the A fragments of the last four score steps (rows 16 · wr + g (+ 8),
    // columns 16k + 2t (+ 1) and 16k + 8 + 2t (+ 1)); its shared memory then holds P_B.
    u32 rq[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) rq[k][e] = *(const u32*)mlw_p_at(p1, 16 * wr + g + 8 * (e % 2), 16 * k + 8 * (e / 2) + 2 * t);
    __syncthreads();

    const float sl2 = scale * 1.4426950408889634f;
    const u64 dq = wg_desc(qs);
    float o[4][32], s[32], l[2] = {0.f, 0.f};
#pragma unroll
    for (int mb = 0; mb < 4; mb++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[mb][i] = 0.f;
    u32 pa[4][4];
    unsigned char* mine = tiles + wg * MLP_TILE;  // this warpgroup's tile of each step
    u64* my_bars = bars + MLP_NB * wg;
    mlp_scores_lo(s, dq, mine, my_bars, 0);
    mlp_scores_hi(s, dq, rq, mine, my_bars, 0);
    wg_wait<0>();
    if (wg == 0) {
        const u64 dva = wg_desc_mn(tiles), dvb = wg_desc_mn(tiles + MLP_TILE), dp1 = wg_desc(p1);
        for (u32 k = 0; k < npairs; k++) {
            const u32 base = B.t_begin + 2 * k * MLP_T, ph = k & 1;
            const u32 pga = mlp_page(B.table, base + 2 * MLP_T, B.t_end, page), pgb = mlp_page(B.table, base + 3 * MLP_T, B.t_end, page);
            // Softmax of A: M_a, c0 and P_A for WG1; O_L · c0, O_L += P_A · V_A[:, L].
            float m_old[2], m_new[2], sum[2], c[2];
            mlp_softmax(s, sm, min((u32)MLP_T, B.t_end - base), sl2, wr, g, t, m_old, m_new, sum);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                c[rr] = exp2f(m_old[rr] - m_new[rr]);
                if (t == 0) sc0[16 * wr + g + 8 * rr] = c[rr];
                l[rr] = l[rr] * c[rr] + sum[rr];
            }
            mlp_pack(s, pa);
            const float one[2] = {1.f, 1.f};
            mlp_store(pa, one, p0, wr, g, t);
            fence_async_shared();
            bar_arrive_n(MLP_BAR_SCALE0, 256);
            mlh_rescale(o, c);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_n256_rs_tb(o, pa[kk], wg_desc_add(dva, kk * 2048));
            wg_commit();
            wg_wait<0>();
            bar_sync_n(MLP_BAR_WG, 128);
            // V_A[:, L] is read: the half takes the next step's A.
            if (k + 1 < npairs) mlp_load<0, 4>(tiles, bars, layer, B.table, base + 2 * MLP_T, B.t_end, page, pga);
            // WG1's c1 and P_B: O_L · c1, O_L += P_B · V_B[:, L].
            bar_sync_n(MLP_BAR_SCALE1, 256);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                c[rr] = sc1[16 * wr + g + 8 * rr];
                l[rr] *= c[rr];
            }
            mlh_rescale(o, c);
            mbar_wait(bars + MLP_NB + mlp_bar(3), ph);  // V_B[:, L]: this warpgroup's own copies
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_n256_ss_tb(o, wg_desc_add(dp1, 32 * kk), wg_desc_add(dvb, kk * 2048));
            wg_commit();
            // The next A's scores; once P_B · V_B[:, L] is done, its half takes the next B.
            if (k + 1 < npairs) {
                mlp_scores_lo(s, dq, tiles, bars, ph ^ 1);
                wg_wait<1>();
                bar_sync_n(MLP_BAR_WG, 128);
                mlp_load<0, 4>(tiles + MLP_TILE, bars + MLP_NB, layer, B.table, base + 3 * MLP_T, B.t_end, page, pgb);
                mlp_scores_hi(s, dq, rq, tiles, bars, ph ^ 1);
            }
            wg_wait<0>();
        }
    } else {
        const u64 dva = wg_desc_mn(tiles + 4 * MLP_CHUNK), dvb = wg_desc_mn(tiles + MLP_TILE + 4 * MLP_CHUNK), dp0 = wg_desc(p0);
        for (u32 k = 0; k < npairs; k++) {
            const u32 base = B.t_begin + (2 * k + 1) * MLP_T, ph = k & 1;
            const u32 pga = mlp_page(B.table, base + MLP_T, B.t_end, page), pgb = mlp_page(B.table, base + 2 * MLP_T, B.t_end, page);
            // WG0's c0 and P_A: O_R · c0, O_R += P_A · V_A[:, R] while B's softmax runs.
            bar_sync_n(MLP_BAR_SCALE0, 256);
            float m_old[2], m_new[2], sum[2], c[2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) c[rr] = sc0[16 * wr + g + 8 * rr];
            mlh_rescale(o, c);
            mbar_wait(bars + mlp_bar(7), ph);  // V_A[:, R]: this warpgroup's own copies
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_n256_ss_tb(o, wg_desc_add(dp0, 32 * kk), wg_desc_add(dva, kk * 2048));
            wg_commit();
            // Softmax of B against M_a: M_b, c1 and P_B for WG0.
            mlp_softmax(s, sm, base < B.t_end ? min((u32)MLP_T, B.t_end - base) : 0u, sl2, wr, g, t, m_old, m_new, sum);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const float c1 = exp2f(m_old[rr] - m_new[rr]);
                if (t == 0) sc1[16 * wr + g + 8 * rr] = c1;
                l[rr] = l[rr] * c[rr] * c1 + sum[rr];
                c[rr] = c1;
            }
            mlp_pack(s, pa);
            const float one[2] = {1.f, 1.f};
            mlp_store(pa, one, p1, wr, g, t);
            fence_async_shared();
            bar_arrive_n(MLP_BAR_SCALE1, 256);
            // V_A[:, R] is read: the half takes the next step's A. Then O_R · c1,
            // O_R += P_B · V_B[:, R]; once read, V_B[:, R]'s half takes the next B.
            wg_wait<0>();
            bar_sync_n(MLP_BAR_WG + 1, 128);
            if (k + 1 < npairs) mlp_load<4, MLP_NC>(tiles, bars, layer, B.table, base + MLP_T, B.t_end, page, pga);
            mlh_rescale(o, c);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_n256_rs_tb(o, pa[kk], wg_desc_add(dvb, kk * 2048));
            wg_commit();
            wg_wait<0>();
            bar_sync_n(MLP_BAR_WG + 1, 128);
            if (k + 1 < npairs) {
                mlp_load<4, MLP_NC>(tiles + MLP_TILE, bars + MLP_NB, layer, B.table, base + 2 * MLP_T, B.t_end, page, pgb);
                mlp_scores_lo(s, dq, tiles + MLP_TILE, bars + MLP_NB, ph ^ 1);
                mlp_scores_hi(s, dq, rq, tiles + MLP_TILE, bars + MLP_NB, ph ^ 1);
            }
            wg_wait<0>();
        }
    }
    // Each row's sum over both warpgroups; the max is sm's (base 2).
    float lt[2], m_run[2];
    mlh_sums(l, sc0, wg, wr, g, t, lt);
#pragma unroll
    for (int rr = 0; rr < 2; rr++) m_run[rr] = sm[16 * wr + g + 8 * rr] * 0.6931471805599453f;
    mlh_store(o, m_run, lt, B, o_part, ml_part, out, sem, heads, latent, 8, wg, wr, g, t);
}
