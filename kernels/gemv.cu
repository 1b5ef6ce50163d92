// Weight-streaming matrix-vector kernels for decode-sized batches (a few rows of activations):
// one sub-group per weight row, 16-byte loads along the row, every activation row multiplied
// with the weights while they are in registers, so each weight byte is read once per call.
// Weights are bf16, or fp8 e4m3 with per-block f32 scales (read as fp8, scaled per 16 values),
// or f32 (router gates); they are streamed past L1 (`ld_stream`). Activations are f32, read
// through the cache (they are small and shared by every block).
#define GEMV_TB 8

struct WeightRef {
    const void* w;      // bf16 (u16) or fp8 (u8) rows, `cols` contiguous
    const float* sc;    // fp8 only: [ceil(rows/br), sc_cols] scales
    u32 sc_cols, br, bc;
};

// Weight element kinds: bf16, fp8 e4m3 with block scales, f32 (the MoE router gate).
#define WK_BF16 0
#define WK_FP8 1
#define WK_F32 2

// acc[q][t] = W[rix[q], :] · X[xrow[t], :] for q < nr (<= R) rows, t < nt (<= T) activation
// rows `xstride` apart from `x`; summed over the sub-group, every lane ends with the totals.
// Each lane keeps 8 sixteen-byte weight loads in flight (U chunks of R rows) before it does any
// arithmetic, so a sub-group has 4 KB of weights in flight; the activation chunk of a column is
// read once and used for all R rows (R > 1 cuts the activation traffic through L1 by R, which
// is what limits batches of several rows). T, the activation rows per pass, is 1 for a single
// decoding sequence (fewer registers, more resident sub-groups) and GEMV_TB otherwise.
// U (chunks a lane loads per row and pass) may be set by a caller whose rows are a little
// longer than one pass of the default (Moonlight's down rows: 176 chunks against 128).
// One pass of rows_dot over R rows: lane's chunks c0 + u · sub-group (u < U) of each row (and
// their fp8 scales), loaded before any is used.
template <int KIND, int R, int U>
struct RowsPass {
    const uint4* rowp[R];
    const float* srow[R];
    uint4 v[U][R];
    float s[U][R];
    // Elements a 16-byte chunk holds.
    static constexpr int E = KIND == WK_FP8 ? 16 : KIND == WK_F32 ? 4 : 8;

    __device__ __forceinline__ RowsPass(WeightRef W, const u32* rix, u32 nr, u32 cols) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            u32 r = q < (int)nr ? rix[q] : rix[0];
            rowp[q] = (const uint4*)((const unsigned char*)W.w + (i64)r * cols * (16 / E));
            srow[q] = KIND == WK_FP8 ? W.sc + (i64)(r / W.br) * W.sc_cols : 0;
        }
    }

    __device__ __forceinline__ void load(WeightRef W, u32 c0, u32 n, u32 nr) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            u32 c = c0 + u * WEFT_WARP;
#pragma unroll
            for (int q = 0; q < R; q++) {
                bool ok = c < n && q < (int)nr;
                v[u][q] = ok ? ld_stream(rowp[q] + c) : make_uint4(0u, 0u, 0u, 0u);
                s[u][q] = KIND == WK_FP8 && ok ? srow[q][(c * E) / W.bc] : 1.f;
            }
        }
    }

    // acc[q][t] += the loaded chunks times the activation rows' (rows_dot's order).
    template <int T>
    __device__ __forceinline__ void dot(u32 c0, u32 n, const float* x, i64 xstride, const u32* xrow, u32 nt, float (&acc)[R][T]) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            u32 c = c0 + u * WEFT_WARP;
            if (c >= n) break;
            float w[R][E];
#pragma unroll
            for (int q = 0; q < R; q++) {
                u32 p[4] = {v[u][q].x, v[u][q].y, v[u][q].z, v[u][q].w};
                float f4[4];
#pragma unroll
                for (int i = 0; i < E; i++) {
                    if (KIND == WK_BF16) w[q][i] = __uint_as_float(i % 2 ? p[i / 2] & 0xffff0000u : p[i / 2] << 16);
                    else if (KIND == WK_FP8) {
                        if (i % 4 == 0) fp8x4_to_f32(p[i / 4], f4);
                        w[q][i] = f4[i % 4] * s[u][q];
                    } else w[q][i] = __uint_as_float(p[i]);
                }
            }
#pragma unroll
            for (int t = 0; t < T; t++)
                if (t < (int)nt) {
                    const float* xp = x + xrow[t] * xstride + (i64)c * E;
#pragma unroll
                    for (int i = 0; i < E; i += 4) {
                        float4 a = *(const float4*)(xp + i);
#pragma unroll
                        for (int q = 0; q < R; q++) acc[q][t] += w[q][i] * a.x + w[q][i + 1] * a.y + w[q][i + 2] * a.z + w[q][i + 3] * a.w;
                    }
                }
        }
    }
};

// acc[q][t] = W[rix[q], :] · X[xrow[t], :] for q < nr (<= R) rows, t < nt (<= T) activation
// rows `xstride` apart from `x`; summed over the sub-group, every lane ends with the totals.
// Each lane keeps 8 sixteen-byte weight loads in flight (U chunks of R rows) before it does any
// arithmetic, so a sub-group has 4 KB of weights in flight; the activation chunk of a column is
// read once and used for all R rows (R > 1 cuts the activation traffic through L1 by R, which
// is what limits batches of several rows). T, the activation rows per pass, is 1 for a single
// decoding sequence (fewer registers, more resident sub-groups) and GEMV_TB otherwise.
// U (chunks a lane loads per row and pass) may be set by a caller whose rows are a little
// longer than one pass of the default (Moonlight's down rows: 176 chunks against 128).
// `first`: the first pass already loaded (gemv_body, before its wait), else null.
template <int KIND, int R, int T, int U = 8 / R>
__device__ __forceinline__ void rows_dot(WeightRef W, const u32* rix, u32 nr, u32 cols, const float* x, i64 xstride, const u32* xrow, u32 nt, float (&acc)[R][T], const RowsPass<KIND, R, U>* first = nullptr) {
    constexpr int E = RowsPass<KIND, R, U>::E;
    const u32 lane = threadIdx.x % WEFT_WARP, n = cols / E;
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[q][t] = 0.f;
    if (first) first->template dot<T>(lane, n, x, xstride, xrow, nt, acc);
    RowsPass<KIND, R, U> p(W, rix, nr, cols);
    for (u32 c0 = first ? lane + WEFT_WARP * U : lane; c0 < n; c0 += WEFT_WARP * U) {
        p.load(W, c0, n, nr);
        p.template dot<T>(c0, n, x, xstride, xrow, nt, acc);
    }
#pragma unroll
    for (int q = 0; q < R; q++)
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t < (int)nt) acc[q][t] = warp_sum(acc[q][t]);
}

// Rows [r0, r0 + n) of W (clipped to `rows`) towards L2, at most WEFT_PREFETCH_MAX bytes; only
// when the range is whole 16-byte units (the bulk prefetch's granule).
template <int KIND>
__device__ __forceinline__ void prefetch_rows(WeightRef W, u32 r0, u32 n, u32 rows, u32 cols) {
    if (r0 >= rows) return;
    u64 row_bytes = (u64)cols * (KIND == WK_FP8 ? 1 : KIND == WK_F32 ? 4 : 2);
    u64 bytes = (u64)min(n, rows - r0) * row_bytes;
    const unsigned char* p = (const unsigned char*)W.w + (u64)r0 * row_bytes;
    if (bytes % 16 == 0 && ((u64)p) % 16 == 0) weft_prefetch_l2(p, (u32)min(bytes, (u64)WEFT_PREFETCH_MAX));
}

// Activation rows t0.. (T of them, clipped to m) of gemv_rows.
template <int KIND, int R, int T>
__device__ __forceinline__ void gemv_rows_at(WeightRef W, const float* xg, u32 xstride, float* out, u32 m, u32 rows, u32 cols, u32 r0, u32 t0, const RowsPass<KIND, R, 8 / R>* first) {
    const u32 nr = min((u32)R, rows - r0);
    u32 rix[R];
#pragma unroll
    for (int q = 0; q < R; q++) rix[q] = r0 + q;
    u32 idx[T];
#pragma unroll
    for (int t = 0; t < T; t++) idx[t] = t0 + t;
    float acc[R][T];
    const u32 nt = min((u32)T, m - t0);
    rows_dot<KIND, R, T>(W, rix, nr, cols, xg, xstride, idx, nt, acc, first);
    if (threadIdx.x % WEFT_WARP == 0)
        for (u32 t = 0; t < nt; t++)
#pragma unroll
            for (int q = 0; q < R; q++)
                if (q < (int)nr) out[(i64)(t0 + t) * rows + r0 + q] = acc[q][t];
}

// The calling sub-group's rows r0.. (R of them, clipped to `rows`) times the m activation rows
// `xstride` apart from `xg`, into out[i, r] (rows `rows` wide).
// `first`: the sub-group's first pass over its rows, loaded before the caller's wait (used for
// the first T activation rows). Its pass is peeled off the loop, so that `first` is the
// caller's object at compile time: a pointer chosen at run time (first or null) puts the pass
// in local memory (176 bytes a thread, measured +0.45 ms a Moonlight step: results round 31).
template <int KIND, int R, int T>
__device__ __forceinline__ void gemv_rows(WeightRef W, const float* xg, u32 xstride, float* out, u32 m, u32 rows, u32 cols, u32 r0, const RowsPass<KIND, R, 8 / R>* first = nullptr) {
    u32 t0 = 0;
    if (first) {
        gemv_rows_at<KIND, R, T>(W, xg, xstride, out, m, rows, cols, r0, 0, first);
        t0 = T;
    }
    for (; t0 < m; t0 += T) gemv_rows_at<KIND, R, T>(W, xg, xstride, out, m, rows, cols, r0, t0, nullptr);
}

// out[i, r] = W[r, :] · x[i, g(r)] for i < m; rows are grouped `group_rows` per group (heads of
// a per-head linear), group g reads columns g*cols.. of x rows `xstride` wide. Each sub-group
// takes R consecutive rows of one group (the host picks R dividing group_rows). Blocks from b0
// on take this weight (0 unless a launch serves two: gemv2_*).
template <int KIND, int R, int T>
__device__ void gemv_body(WeightRef W, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride, u32 b0 = 0) {
    u32 warps = blockDim.x / WEFT_WARP;
    u32 b = blockIdx.x - b0;
    // This block's rows are one contiguous range of the (static) weights: on their way to L2
    // while the previous kernel finishes.
    if (threadIdx.x == 0) prefetch_rows<KIND>(W, b * warps * R, warps * R, rows, cols);
    const u32 r0 = (b * warps + threadIdx.x / WEFT_WARP) * R;
#ifdef WEFT_GEMV_PRELOAD
    // (A variant, ±0 on an H100: Moonlight batch 1 2.804 / 2.802 ms against 2.807 / 2.813,
    // results round 31.) A single token's sub-group
    // loads its first pass (the whole row of up to 2,048 bf16 values) into registers before
    // the wait — static weights: a block resident while the kernel before still runs (a
    // single-row norm lets this launch in at its start, ops.rs `norm_trigger`) has its rows in
    // hand when the wait returns. Same order, same bits; 8 more registers a thread (64 / 72
    // for one / two rows a sub-group). The emulator builds the default kernels (what ships);
    // the pre-loaded pass itself is checked there through gemv_f32_pre_t1.
    if (T == 1 && r0 < rows) {
        u32 rix[R];
#pragma unroll
        for (int q = 0; q < R; q++) rix[q] = r0 + q;
        const u32 nr = min((u32)R, rows - r0), n = cols / RowsPass<KIND, R, 8 / R>::E;
        RowsPass<KIND, R, 8 / R> first(W, rix, nr, cols);
        first.load(W, threadIdx.x % WEFT_WARP, n, nr);
        WEFT_PDL_ENTRY();
        if (KIND == WK_F32) WEFT_PDL_TRIGGER();
        gemv_rows<KIND, R, T>(W, x + (i64)(r0 / group_rows) * cols, xstride, out, m, rows, cols, r0, &first);
        return;
    }
#endif
    WEFT_PDL_ENTRY();
    // f32 is the MoE router (a comparison mode aside): the routing's launch in now, so that the
    // one after it (the experts, whose shared chunks need only x) comes in early too (moe.cu).
    if (KIND == WK_F32) WEFT_PDL_TRIGGER();
    if (r0 >= rows) return;
    gemv_rows<KIND, R, T>(W, x + (i64)(r0 / group_rows) * cols, xstride, out, m, rows, cols, r0);
}

#define GEMV_ENTRY(R, T)                                                                                                \
    extern "C" __global__ void gemv_bf16_r##R##_t##T(const u16* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) { \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        gemv_body<WK_BF16, R, T>(W, x, out, m, rows, cols, group_rows, xstride);                                        \
    }                                                                                                                   \
    extern "C" __global__ void gemv_fp8_r##R##_t##T(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) { \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        gemv_body<WK_FP8, R, T>(W, x, out, m, rows, cols, group_rows, xstride);                                         \
    }
GEMV_ENTRY(1, 1)
GEMV_ENTRY(2, 1)
GEMV_ENTRY(4, 1)
GEMV_ENTRY(1, 8)
GEMV_ENTRY(2, 8)
GEMV_ENTRY(4, 8)

// A projection back to the residual stream and the norm after it in one launch, for a few
// decoding rows (ops.rs `linear_add_rms_norm`: o_proj and the post-attention norm): the grid
// computes delta = x · Wᵀ as gemv_body does; the last block to finish (`counter`, reset by it)
// adds delta into `res` (read past L1: the other blocks wrote it) and writes out = w · res /
// rms(res) as add_rms_norm does (the same bits). Rows of at most 8 · blockDim.x values, a
// multiple of 4 (rms_row_v4). One dependent step a layer fewer than the GEMV and the norm;
// measured slower on an H100 (round 29), off unless asked for.
template <int KIND, int R>
__device__ void gemv_add_rms_norm_body(WeightRef W, const float* x, float* delta, u32 m, u32 rows, u32 cols, float* res, const float* nw, float* out, float eps, u32* counter) {
    __shared__ float sh[BLOCK];
    const u32 warps = blockDim.x / WEFT_WARP;
    if (threadIdx.x == 0) prefetch_rows<KIND>(W, blockIdx.x * warps * R, warps * R, rows, cols);
    WEFT_PDL_ENTRY();
    const u32 r0 = (blockIdx.x * warps + threadIdx.x / WEFT_WARP) * R;
    if (r0 < rows) gemv_rows<KIND, R, 1>(W, x, cols, delta, m, rows, cols, r0);
    if (!last_block_of(counter, gridDim.x)) return;
    const volatile float* dv = delta;
    for (u32 t = 0; t < m; t++) {
        float* rt = res + (i64)t * rows;
        for (u32 j = threadIdx.x; j < rows; j += blockDim.x) rt[j] += dv[(i64)t * rows + j];
        __syncthreads();
        rms_row_v4<false>(rt, 0, 0, nw, out + (i64)t * rows, rows, eps, sh);
    }
    if (threadIdx.x == 0) *counter = 0u;
}
#define GEMV_NORM_ENTRY(R)                                                                                              \
    extern "C" __global__ void gemv_add_rms_norm_bf16_r##R(const u16* w, const float* x, float* delta, u32 m, u32 rows, u32 cols, float* res, const float* nw, float* out, float eps, u32* counter) { \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        gemv_add_rms_norm_body<WK_BF16, R>(W, x, delta, m, rows, cols, res, nw, out, eps, counter);                     \
    }                                                                                                                   \
    extern "C" __global__ void gemv_add_rms_norm_fp8_r##R(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* delta, u32 m, u32 rows, u32 cols, float* res, const float* nw, float* out, float eps, u32* counter) { \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        gemv_add_rms_norm_body<WK_FP8, R>(W, x, delta, m, rows, cols, res, nw, out, eps, counter);                      \
    }
GEMV_NORM_ENTRY(1)
GEMV_NORM_ENTRY(2)
GEMV_NORM_ENTRY(4)

// Two weights of the same kind and width on the same activation rows in one launch (an
// attention block's query and latent projections of the normed hidden state): blocks below b1
// = ceil(rows1 / (sub-groups · R)) take the first weight into out1, the rest the second.
#define GEMV2_ENTRY(R, T)                                                                                               \
    extern "C" __global__ void gemv2_bf16_r##R##_t##T(const u16* w1, float* out1, u32 rows1, const u16* w2, float* out2, u32 rows2, const float* x, u32 m, u32 cols) { \
        const u32 per = blockDim.x / WEFT_WARP * R, b1 = (rows1 + per - 1) / per;                                       \
        WeightRef W1 = {w1, 0, 0, 1, 1}, W2 = {w2, 0, 0, 1, 1};                                                         \
        if (blockIdx.x < b1) gemv_body<WK_BF16, R, T>(W1, x, out1, m, rows1, cols, rows1, cols, 0);                      \
        else gemv_body<WK_BF16, R, T>(W2, x, out2, m, rows2, cols, rows2, cols, b1);                                    \
    }                                                                                                                   \
    extern "C" __global__ void gemv2_fp8_r##R##_t##T(const unsigned char* w1, const float* sc1, u32 scc1, u32 br1, u32 bc1, float* out1, u32 rows1, const unsigned char* w2, const float* sc2, u32 scc2, u32 br2, u32 bc2, float* out2, u32 rows2, const float* x, u32 m, u32 cols) { \
        const u32 per = blockDim.x / WEFT_WARP * R, b1 = (rows1 + per - 1) / per;                                       \
        WeightRef W1 = {w1, sc1, scc1, br1, bc1}, W2 = {w2, sc2, scc2, br2, bc2};                                       \
        if (blockIdx.x < b1) gemv_body<WK_FP8, R, T>(W1, x, out1, m, rows1, cols, rows1, cols, 0);                       \
        else gemv_body<WK_FP8, R, T>(W2, x, out2, m, rows2, cols, rows2, cols, b1);                                     \
    }
GEMV2_ENTRY(1, 1)
GEMV2_ENTRY(2, 1)
GEMV2_ENTRY(4, 1)
GEMV2_ENTRY(1, 8)
GEMV2_ENTRY(2, 8)
GEMV2_ENTRY(4, 8)

// out[i, r] = silu(gate_r · x[i]) * (up_r · x[i]) for a stacked [2*inter, cols] gate|up weight:
// the gate row and the up row in one sub-group, sharing each activation read, and the
// activation applied before anything is written (a dense or shared-expert MLP's first half).
template <int KIND, int T>
__device__ void gemv_gated_body(WeightRef W, const float* x, float* out, u32 m, u32 inter, u32 cols) {
    u32 warps = blockDim.x / WEFT_WARP;
    if (threadIdx.x == 0) {
        prefetch_rows<KIND>(W, blockIdx.x * warps, warps, inter, cols);
        prefetch_rows<KIND>(W, inter + blockIdx.x * warps, warps, 2 * inter, cols);
    }
    WEFT_PDL_ENTRY();
    u32 r = blockIdx.x * warps + threadIdx.x / WEFT_WARP;
    if (r >= inter) return;
    u32 rix[2] = {r, inter + r};
    for (u32 t0 = 0; t0 < m; t0 += T) {
        u32 idx[T];
#pragma unroll
        for (int t = 0; t < T; t++) idx[t] = t0 + t;
        float acc[2][T];
        u32 nt = min((u32)T, m - t0);
        rows_dot<KIND, 2, T>(W, rix, 2, cols, x, cols, idx, nt, acc);
        if (threadIdx.x % WEFT_WARP == 0)
            for (u32 t = 0; t < nt; t++) out[(i64)(t0 + t) * inter + r] = acc[0][t] / (1.0f + expf(-acc[0][t])) * acc[1][t];
    }
}

#define GATED_ENTRY(T)                                                                                                  \
    extern "C" __global__ void gemv_gated_bf16_t##T(const u16* w, const float* x, float* out, u32 m, u32 inter, u32 cols) { \
        WeightRef W = {w, 0, 0, 1, 1};                                                                                  \
        gemv_gated_body<WK_BF16, T>(W, x, out, m, inter, cols);                                                         \
    }                                                                                                                   \
    extern "C" __global__ void gemv_gated_fp8_t##T(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* out, u32 m, u32 inter, u32 cols) { \
        WeightRef W = {w, sc, sc_cols, br, bc};                                                                         \
        gemv_gated_body<WK_FP8, T>(W, x, out, m, inter, cols);                                                          \
    }
GATED_ENTRY(1)
GATED_ENTRY(8)

// f32 weights (the MoE router gate, and every weight under WEFT_CUDA_F32=1).
extern "C" __global__ void gemv_f32_t1(const float* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    WeightRef W = {w, 0, 0, 1, 1};
    gemv_body<WK_F32, 1, 1>(W, x, out, m, rows, cols, group_rows, xstride);
}
extern "C" __global__ void gemv_f32_t8(const float* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    WeightRef W = {w, 0, 0, 1, 1};
    gemv_body<WK_F32, 1, 8>(W, x, out, m, rows, cols, group_rows, xstride);
}

// The router's product for one decoding token (f32 rows, `cols` a multiple of 4): one sub-group
// a row, as gemv_f32_t1 takes it, but every lane's first GEMV_PRE_U chunks of its row are
// loaded into registers *before* the wait — the weights are static, so the row is on its way
// while the kernel before still runs (add_rms_norm lets this launch in at its start, ops.rs
// `norm_trigger`), and past the wait only x (L2) stands between the norm and the logits. Chunks
// past the first pass (rows over GEMV_PRE_U · 128 values: Kimi-K2's 7168) load after it, in
// rows_dot's passes — rows_dot's order and expression whatever U is: gemv_f32_t1's bits. Small
// blocks (the host launches two sub-groups a block) spread the rows over many SMs: 64 rows in 8
// blocks of 8 sub-groups took ~4.3 µs a layer on an H100 (round 29), most of it two memory
// latencies on 8 SMs. Within noise of gemv_f32_t1 end to end (round 31), so off by default.
#define GEMV_PRE_U 16
extern "C" __global__ void gemv_f32_pre_t1(const float* w, const float* x, float* out, u32 rows, u32 cols) {
    const WeightRef W = {w, 0, 0, 1, 1};
    const u32 lane = threadIdx.x % WEFT_WARP, n = cols / 4;
    const u32 r = blockIdx.x * (blockDim.x / WEFT_WARP) + threadIdx.x / WEFT_WARP, nr = r < rows ? 1 : 0;
    const u32 rix[1] = {min(r, rows - 1)};
    RowsPass<WK_F32, 1, GEMV_PRE_U> first(W, rix, nr, cols);
    first.load(W, lane, n, nr);
    WEFT_PDL_ENTRY();
    // The routing's launch in now, as gemv_f32_t1 does (gemv_body): x was complete at the wait.
    WEFT_PDL_TRIGGER();
    if (r >= rows) return;
    const u32 xrow[1] = {0};
    float acc[1][1];
    rows_dot<WK_F32, 1, 1, GEMV_PRE_U>(W, rix, 1, cols, x, 0, xrow, 1, acc, &first);
    if (lane == 0) out[r] = acc[0][0];
}

// fp8 block-scaled weights to bf16 (for the tensor-core GEMM of large batches).
extern "C" __global__ void dequant_fp8_bf16(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, u16* out, u32 rows, u32 cols) { WEFT_PDL_ENTRY();
    i64 n = (i64)rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        u32 r = (u32)(i / cols), c = (u32)(i % cols);
        out[i] = f32_to_bf16(fp8_to_f32(w[i]) * sc[(i64)(r / br) * sc_cols + c / bc]);
    }
}
