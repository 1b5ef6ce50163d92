// Mixture-of-Experts on the device, for decode-sized batches: routing (DeepSeek-V3: sigmoid
// scores, correction bias for selection only, group-limited top-k, normalisation, scaling),
// a plan of which experts are active and which (token, slot) entries each serves, and the
// experts as weight-streaming kernels that read each active expert's weights once per call
// for all of its tokens. No host round trip: the launch grid is sized for the worst case and
// blocks past the active-expert count exit at once.
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_GROUPS 64

// (v, i) beats (w, j) when larger, ties to the lower index (the CPU reference's order).
__device__ __forceinline__ bool beats(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// A block's routing scratch for up to MAXE experts: every expert's score (and its biased,
// group-masked choice), the groups', and the K picks in order.
template <int MAXE>
struct RouteScratch {
    float score[MAXE], choice[MAXE];
    float gscore[MOE_MAX_GROUPS];
    unsigned char gtaken[MOE_MAX_GROUPS];
    int sel[64];
};

// The block picks token `tok`'s K experts: on return (past a block barrier) `sel[0..K]` holds
// them in pick order and `score` their sigmoid scores, for every thread. The logits are read
// past L1 (`moe_router_route_plan`'s were written by other blocks of its launch). Every thread
// of the block must call it; a block routing several tokens in turn puts a barrier between them.
// E <= MAXE (the experts' kernels take MOE_ROUTE_FUSED_MAX, ~6 KB of shared memory a block).
template <int MAXE = MOE_MAX_EXPERTS>
__device__ RouteScratch<MAXE>& route_select(const volatile float* logits, const float* bias, u32 E, u32 K, u32 n_group, u32 topk_group, u32 tok) {
    __shared__ RouteScratch<MAXE> rs;
    float* score = rs.score;
    float* choice = rs.choice;
    float* gscore = rs.gscore;
    unsigned char* gtaken = rs.gtaken;
    int* sel = rs.sel;
    const volatile float* l = logits + (i64)tok * E;
    for (u32 e = threadIdx.x; e < E; e += blockDim.x) {
        float s = 1.0f / (1.0f + expf(-l[e]));
        score[e] = s;
        choice[e] = s + bias[e];
    }
    __syncthreads();
    if (n_group > 1) {
        u32 gsize = E / n_group;
        if (threadIdx.x < n_group) {
            // The group's two best biased scores, summed best first.
            float b1 = -WEFT_INF, b2 = -WEFT_INF;
            for (u32 e = threadIdx.x * gsize; e < (threadIdx.x + 1) * gsize; e++) {
                float c = choice[e];
                if (c > b1) { b2 = b1; b1 = c; } else if (c > b2) b2 = c;
            }
            gscore[threadIdx.x] = gsize >= 2 ? b1 + b2 : b1;
            gtaken[threadIdx.x] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (u32 k = 0; k < topk_group; k++) {
                int best = -1;
                for (u32 g = 0; g < n_group; g++)
                    if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best])) best = (int)g;
                gtaken[best] = 1;
            }
        }
        __syncthreads();
        for (u32 e = threadIdx.x; e < E; e += blockDim.x)
            if (!gtaken[e / gsize]) choice[e] = -WEFT_INF;
        __syncthreads();
    }
    // The K picks by the first sub-group alone, every choice in registers: lane l holds experts
    // q · WEFT_WARP + l (q < MAXE / 32) and a mask of those still free; a pick is each lane's
    // best free expert, then a butterfly for the best of the lanes; its lane clears the bit. No
    // shared-memory read and no barrier per pick (the experts' launch routes in every block).
    if (threadIdx.x < WEFT_WARP) {
        constexpr int NPL = MAXE / 32;
        const u32 lane = threadIdx.x;
        float v[NPL];
        u32 free = 0;
#pragma unroll
        for (int q = 0; q < NPL; q++) {
            const u32 e = q * WEFT_WARP + lane;
            v[q] = e < E ? choice[e] : -WEFT_INF;
            if (e < E) free |= 1u << q;
        }
        for (u32 j = 0; j < K; j++) {
            float bv = -WEFT_INF;
            int bi = 0x7fffffff;
#pragma unroll
            for (int q = 0; q < NPL; q++) {
                const int e = (int)(q * WEFT_WARP + lane);
                if ((free >> q & 1u) && beats(v[q], e, bv, bi)) { bv = v[q]; bi = e; }
            }
            for (int o = WEFT_WARP / 2; o > 0; o >>= 1) {
                float ov = lane_xor(bv, o);
                int oi = lane_xor_int(bi, o);
                if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
            }
            int b = bi;
            // NaN scores compare false everywhere: fall back to the first free expert rather
            // than an out-of-range id (NaN activations are a bug upstream, not a crash here).
            if (b < 0 || (u32)b >= E) {
                u32 q = 0;
                while (q < 32 && !(free >> q & 1u)) q++;
                b = q < 32 ? (int)(q * WEFT_WARP + lane) : 0x7fffffff;
                for (int o = WEFT_WARP / 2; o > 0; o >>= 1) b = min(b, lane_xor_int(b, o));
            }
            if ((u32)b % WEFT_WARP == lane) free &= ~(1u << ((u32)b / WEFT_WARP));
            if (lane == 0) sel[j] = b;
        }
    }
    __syncthreads();
    return rs;
}

// Thread 0 writes the picks of `route_select` as token `tok`'s routing: ids[t*(K+S) + j],
// w[t*(K+S) + j] for the K selected experts, then the S shared-expert slots every token takes
// with weight 1 (ids E..E+S: the shared experts' intermediate chunks, run with the routed
// ones; S = 0 when they run apart).
template <int MAXE>
__device__ void route_write(const RouteScratch<MAXE>& rs, u32 E, u32 K, u32 S, int norm, float scaling, u32* ids, float* wts, u32 tok) {
    const float* score = rs.score;
    const int* sel = rs.sel;
    if (threadIdx.x == 0) {
        float d = 0.f;
        for (u32 j = 0; j < K; j++) d += score[sel[j]];
        d += 1e-20f;
        const i64 row = (i64)tok * (K + S);
        for (u32 j = 0; j < K; j++) {
            float w = score[sel[j]];
            if (norm) w /= d;
            ids[row + j] = (u32)sel[j];
            wts[row + j] = w * scaling;
        }
        for (u32 s = 0; s < S; s++) {
            ids[row + K + s] = E + s;
            wts[row + K + s] = 1.0f;
        }
    }
}

// The block routes token `tok` (route_select, then route_write).
__device__ void route_token(const volatile float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 tok) {
    route_write(route_select(logits, bias, E, K, n_group, topk_group, tok), E, K, S, norm, scaling, ids, wts, tok);
}

// The local index of expert `id` in a plan over routed experts first..first+held followed by
// S shared chunks (ids E..E+S, local held..held+S); past held + S for experts held elsewhere
// (ids below `first` wrap). Out-of-range ids clamp to the last routed expert.
__device__ __forceinline__ u32 local_expert(u32 id, u32 E, u32 S, u32 first, u32 held) {
    if (id >= E && id - E < S) return held + (id - E);
    u32 e = min(id, E - 1) - first;
    return e < held ? e : held + S;
}

// One block: plan[0] = number of active experts A, plan[1..1+A] their ids, then offsets
// plan[1+MAXA .. 1+MAXA+A+1] into plan[2+2*MAXA ..] = the entries (t*k + j) each serves.
// Entries of one expert are in no particular order; each is computed independently. `ids`
// were written by other blocks of the same launch: read past L1 (volatile). Only experts
// first..first+held are planned (an expert-parallel rank's), by their index among those, then
// the S shared chunks (`local_expert`); entries routed elsewhere are left out (moe_combine skips
// them). After the n entries, the
// tile list of the grouped GEMM (moe_gemm.cu): its length, then (active expert, first plan
// row) per tile of at most MOE_TILE_ROWS rows of one expert — at most n / MOE_TILE_ROWS + A
// tiles (moe.rs sizes the plan for it).
#define MOE_TILE_ROWS 64
#ifndef PLAN_BATCH
#define PLAN_BATCH 8
#endif
// The local experts (`local_expert`; `planned` past n) of entries i0 + u · blockDim.x +
// threadIdx.x (u < PLAN_BATCH) of `ids`, every read issued before the first is used.
__device__ __forceinline__ void plan_read(const volatile u32* ids, u32 n, u32 i0, u32 E, u32 S, u32 first, u32 held, u32 (&e)[PLAN_BATCH]) {
#pragma unroll
    for (int u = 0; u < PLAN_BATCH; u++) {
        const u32 i = i0 + u * blockDim.x + threadIdx.x;
        e[u] = i < n ? ids[i] : ~0u;
    }
#pragma unroll
    for (int u = 0; u < PLAN_BATCH; u++) e[u] = e[u] == ~0u ? held + S : local_expert(e[u], E, S, first, held);
}
__device__ void plan_experts(const volatile u32* ids, u32 n, u32 E, u32 S, u32 first, u32 held, u32 maxa, u32* plan) {
    __shared__ u32 count[MOE_MAX_EXPERTS], slot[MOE_MAX_EXPERTS], fill[MOE_MAX_EXPERTS], tile0[MOE_MAX_EXPERTS];
    const u32 planned = held + S;  // the shared chunks are planned after the routed experts
    for (u32 e = threadIdx.x; e < planned; e += blockDim.x) { count[e] = 0; fill[e] = 0; }
    __syncthreads();
    // PLAN_BATCH ids a thread are read before any is used: the reads (past L1, from L2) then
    // overlap instead of each waiting for the atomic before it (n = 24,576 entries at 4096
    // tokens took ~80 us a layer read one at a time).
    for (u32 i0 = 0; i0 < n; i0 += PLAN_BATCH * blockDim.x) {
        u32 e[PLAN_BATCH];
        plan_read(ids, n, i0, E, S, first, held, e);
#pragma unroll
        for (int u = 0; u < PLAN_BATCH; u++)
            if (e[u] < planned) atomicAdd(&count[e[u]], 1u);
    }
    __syncthreads();
    u32* act = plan + 1;
    u32* off = plan + 1 + maxa;
    u32* ent = plan + 2 + 2 * maxa;
    u32* tiles = ent + n;
    if (threadIdx.x == 0) {
        u32 a = 0, o = 0, nt = 0;
        for (u32 e = 0; e < planned; e++) {
            if (count[e]) { act[a] = e; off[a] = o; slot[e] = a; tile0[a] = nt; o += count[e]; nt += (count[e] + MOE_TILE_ROWS - 1) / MOE_TILE_ROWS; a++; }
        }
        off[a] = o;
        plan[0] = a;
        tiles[0] = nt;
    }
    __syncthreads();
    for (u32 a = threadIdx.x; a < plan[0]; a += blockDim.x)
        for (u32 r = 0, j = tile0[a]; r < count[act[a]]; r += MOE_TILE_ROWS, j++) {
            tiles[1 + 2 * j] = a;
            tiles[2 + 2 * j] = off[a] + r;
        }
    for (u32 i0 = 0; i0 < n; i0 += PLAN_BATCH * blockDim.x) {
        u32 e[PLAN_BATCH];
        plan_read(ids, n, i0, E, S, first, held, e);
#pragma unroll
        for (int u = 0; u < PLAN_BATCH; u++) {
            if (e[u] >= planned) continue;
            const u32 p = atomicAdd(&fill[e[u]], 1u);
            ent[off[slot[e[u]]] + p] = i0 + u * blockDim.x + threadIdx.x;
        }
    }
}

// The plan of a single token's n <= blockDim.x entries (the block that routed it; `ids` written
// by its thread 0 before a block barrier), with no atomics and no serial pass: thread i takes
// entry i and finds, by a scan of the n local experts in shared memory, whether it is its
// expert's first entry and its place among that expert's entries, then, by a scan of the first
// entries' counts, its expert's rank among the active ones, offset and first tile (thread 0:
// the totals) — the same plan as
// `plan_experts` (active experts in ascending local order, entries of one expert in entry order).
// A decoding token's route and plan took ~10 us a layer through the device-wide counter, the
// shared-memory atomics and thread 0's pass over every expert (Nsight, H100, Moonlight).
#define MOE_MAX_ONE 256
__device__ void plan_one_token(const u32* ids, u32 n, u32 E, u32 S, u32 first, u32 held, u32 maxa, u32* plan) {
    __shared__ u32 loc[MOE_MAX_ONE], cnt[MOE_MAX_ONE];  // cnt: the entry's expert's count, 0 unless its first active entry
    const u32 planned = held + S;
    const u32 i = threadIdx.x;
    if (i < n) loc[i] = local_expert(ids[i], E, S, first, held);
    __syncthreads();
    const u32 e = i < n ? loc[i] : planned;
    u32 lead = 1, pos = 0, c = 0;
    if (i < n)
        for (u32 j = 0; j < n; j++)
            if (loc[j] == e) { c++; if (j < i) { lead = 0; pos++; } }
    if (i < n) cnt[i] = lead && e < planned ? c : 0;
    __syncthreads();
    if (e >= planned && i != 0) return;
    u32 rank = 0, off = 0, tile0 = 0, active = 0, total = 0, ntiles = 0;
    for (u32 j = 0; j < n; j++) {
        const u32 cj = cnt[j];
        if (!cj) continue;
        const u32 tj = (cj + MOE_TILE_ROWS - 1) / MOE_TILE_ROWS;
        active++; total += cj; ntiles += tj;
        if (loc[j] < e) { rank++; off += cj; tile0 += tj; }
    }
    u32* act = plan + 1;
    u32* offs = plan + 1 + maxa;
    u32* ent = plan + 2 + 2 * maxa;
    u32* tiles = ent + n;
    if (i == 0) { offs[active] = total; plan[0] = active; tiles[0] = ntiles; }
    if (e >= planned) return;
    ent[off + pos] = i;
    if (!lead) return;
    act[rank] = e;
    offs[rank] = off;
    for (u32 r = 0, j = tile0; r < c; r += MOE_TILE_ROWS, j++) {
        tiles[1 + 2 * j] = rank;
        tiles[2 + 2 * j] = off + r;
    }
}

// Routing and the plan in one launch: one block per token routes it; the last block to finish
// (a device-wide counter, reset by that block for the next launch) makes the plan. A single
// token (one block) plans its own entries at once (`plan_one_token`) without the counter.
extern "C" __global__ void moe_route_plan(const float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 first, u32 held, u32 maxa, u32* plan, u32* counter, int early) {
    // `early` (the logits made from x by the launch before, moe.rs Gate::LogitsOfX): the
    // experts' launch in now; its shared-chunk blocks need only x, complete once the router
    // passed its wait (which let this launch in); its other blocks wait for this one.
    if (early) WEFT_PDL_TRIGGER();
    WEFT_PDL_ENTRY();
    route_token(logits, bias, E, K, S, n_group, topk_group, norm, scaling, ids, wts, blockIdx.x);
#ifndef WEFT_ROUTE_PLAN_COUNTER
    if (gridDim.x == 1 && K + S <= (u32)MOE_MAX_ONE && K + S <= (u32)blockDim.x) {
        __syncthreads();
        plan_one_token(ids, K + S, E, S, first, held, maxa, plan);
        return;
    }
#endif
    if (!last_block_of(counter, gridDim.x)) return;
    plan_experts(ids, gridDim.x * (K + S), E, S, first, held, maxa, plan);
    if (threadIdx.x == 0) *counter = 0u;
}

// The router's product and the routing in one launch, for a few decoding tokens: sub-group r
// of the grid takes router row r (f32, `hidden` wide) against each of the m tokens of x —
// rows_dot as in gemv_f32, so the logits are those of `linear` — into `logits [m, E]`; the
// last block to finish (`counter`, reset by it) routes the tokens in turn and plans, as
// moe_route_plan does. One dependent step a layer fewer than the router's GEMV and then the
// routing, but measured slower on an H100 with programmatic edges (round 29: the last block's
// fence, count and serial tail cost more than the edge), so off unless asked for (moe.rs).
extern "C" __global__ void moe_router_route_plan(const float* wr, const float* x, u32 m, u32 hidden, float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 first, u32 held, u32 maxa, u32* plan, u32* counter) {
    const u32 warps = blockDim.x / WEFT_WARP;
    const u32 r = blockIdx.x * warps + threadIdx.x / WEFT_WARP;
    WeightRef W = {wr, 0, 0, 1, 1};
    if (threadIdx.x == 0) prefetch_rows<WK_F32>(W, blockIdx.x * warps, warps, E, hidden);
    WEFT_PDL_ENTRY();
    WEFT_PDL_TRIGGER();  // the experts' shared-chunk blocks need only x (moe_gate_up_body)
    // One activation row a pass for a single token (gemv_f32_t1's shape), GEMV_TB for more.
    if (r < E && m == 1) gemv_rows<WK_F32, 1, 1>(W, x, hidden, logits, 1, E, hidden, r);
    else if (r < E) gemv_rows<WK_F32, 1, GEMV_TB>(W, x, hidden, logits, m, E, hidden, r);
    if (!last_block_of(counter, gridDim.x)) return;
    for (u32 t = 0; t < m; t++) {
        route_token(logits, bias, E, K, S, n_group, topk_group, norm, scaling, ids, wts, t);
        __syncthreads();
    }
    if (threadIdx.x == 0) *counter = 0u;
    if (m == 1 && K + S <= (u32)MOE_MAX_ONE && K + S <= (u32)blockDim.x) {
        plan_one_token(ids, K + S, E, S, first, held, maxa, plan);
        return;
    }
    plan_experts(ids, m * (K + S), E, S, first, held, maxa, plan);
}

// Per-expert weight pointers (device arrays indexed by expert id).
struct ExpertTable {
    const u64* w;   // weight base pointers
    const u64* sc;  // fp8 scale pointers (unused for bf16)
    u32 sc_cols, br, bc;
};

__device__ __forceinline__ WeightRef expert_ref(ExpertTable T, u32 e) {
    WeightRef W = {(const void*)T.w[e], (const float*)T.sc[e], T.sc_cols, T.br, T.bc};
    return W;
}

// Chunks a lane loads per row and pass in the two expert kernels below (rows_dot's U; the
// default 8 / rows a sub-group). Variants for comparisons (WEFT_CUDA_KERNEL_DEFINES).
#ifndef MOE_GU_U
#define MOE_GU_U (8 / 2)
#endif
#ifndef MOE_DOWN_U
#define MOE_DOWN_U (8 / MOE_DOWN_ROWS) // MOE_DOWN_ROWS is defined below, before its use
#endif
// h[entry, r] = silu(gate_r · x[token]) * (up_r · x[token]) of one expert's entries (nt <= NT
// of them at a time: `entry(i)` for i < count, token entry / k); one sub-group per row r.
template <int FP8, int NT, typename Entry>
__device__ __forceinline__ void gate_up_rows(WeightRef W, u32 count, Entry entry, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 r) {
    for (u32 i0 = 0; i0 < count; i0 += NT) {
        u32 nt = min((u32)NT, count - i0);
        u32 tok[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) tok[t] = t < nt ? entry(i0 + t) / k : 0;
        // The gate row and the up row together: one read of each activation chunk for both.
        float acc[2][NT];
        u32 rix[2] = {r, inter + r};
        rows_dot<FP8, 2, NT, MOE_GU_U>(W, rix, 2, hidden, x, hidden, tok, nt, acc);
        if (threadIdx.x % WEFT_WARP == 0)
            for (u32 t = 0; t < nt; t++) h[(i64)entry(i0 + t) * inter + r] = acc[0][t] / (1.0f + expf(-acc[0][t])) * acc[1][t];
    }
}

// The gate|up products of the plan's experts; gate_up is [2*inter, hidden], one sub-group per
// row of a block's tile. The S shared chunks (local experts held..held+S, the plan's last S
// active experts, taken by every one of the m tokens at slots k-S..k-1) are static: blocks
// below S · tiles take them without the plan and *before* the wait — the routing kernels
// trigger this launch early (moe_route_plan at its start, the router's GEMV past its wait,
// WEFT_PDL_TRIGGER), so these blocks stream the shared chunks while the router and the routing
// run; x was written before the router passed its wait, and nothing the running kernels use
// aliases h. The blocks after them wait, then take the plan's routed experts (active expert
// blockIdx.x / tiles - S). Same products and bits as in plan order.
template <int FP8, int NT>
__device__ void moe_gate_up_body(ExpertTable T, const u32* plan, u32 maxa, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) {
    u32 warps = blockDim.x / WEFT_WARP;
    u32 tiles = (inter + warps - 1) / warps;
    u32 r = (blockIdx.x % tiles) * warps + threadIdx.x / WEFT_WARP;
    if (blockIdx.x < S * tiles) {
        const u32 s = blockIdx.x / tiles, slot = k - S + s;
        if (r < inter) gate_up_rows<FP8, NT>(expert_ref(T, held + s), m, [=](u32 i) { return i * k + slot; }, x, h, k, hidden, inter, r);
        return;
    }
    WEFT_PDL_ENTRY();
    u32 a = blockIdx.x / tiles - S;
    if (a + S >= plan[0] || r >= inter) return;
    const u32* off = plan + 1 + maxa;
    const u32* ent = plan + 2 + 2 * maxa + off[a];
    gate_up_rows<FP8, NT>(expert_ref(T, plan[1 + a]), off[a + 1] - off[a], [=](u32 i) { return ent[i]; }, x, h, k, hidden, inter, r);
}

// A single decoding token's gate|up with its routing in the same launch, in place of
// moe_route_plan's (moe.rs, `CudaBackend::moe_route_fused`): the S shared-chunk blocks as in
// moe_gate_up_body, before the wait; every other block waits for the router's logits, routes
// the token itself (route_select: the routing kernel's picks) and takes the a-th held expert
// of the picks in ascending order (a = blockIdx.x / tiles - S: the plan's order), its slot the
// one entry. The first routed block also writes ids, wts and the plan (plan_one_token) for the
// down products and the combine, which wait for this grid. A dependent launch fewer a layer on
// the chain, for ~E logits read and K picks in every routed block (k = K + S <= blockDim.x,
// E <= MOE_ROUTE_FUSED_MAX: moe.rs ROUTE_FUSED_MAX).
#define MOE_ROUTE_FUSED_MAX 512
template <int FP8>
__device__ void moe_gate_up_route_body(ExpertTable T, const float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 first, u32 held, u32 maxa, u32* plan, const float* x, float* h, u32 hidden, u32 inter) {
    const u32 warps = blockDim.x / WEFT_WARP, tiles = (inter + warps - 1) / warps, k = K + S;
    const u32 r = (blockIdx.x % tiles) * warps + threadIdx.x / WEFT_WARP;
    if (blockIdx.x < S * tiles) {
        const u32 s = blockIdx.x / tiles, slot = K + s;
        if (r < inter) gate_up_rows<FP8, 1>(expert_ref(T, held + s), 1, [=](u32) { return slot; }, x, h, k, hidden, inter, r);
        return;
    }
    WEFT_PDL_ENTRY();
    const RouteScratch<MOE_ROUTE_FUSED_MAX>& rs = route_select<MOE_ROUTE_FUSED_MAX>(logits, bias, E, K, n_group, topk_group, 0);
    const u32 a = blockIdx.x / tiles - S;
    if (a == 0 && blockIdx.x % tiles == 0) {
        route_write(rs, E, K, S, norm, scaling, ids, wts, 0);
        __syncthreads();
        plan_one_token(ids, k, E, S, first, held, maxa, plan);
    }
    // The a-th smallest held pick (picks are distinct): its local expert and slot.
    u32 slot = K, loc = 0;
    for (u32 j = 0; j < K; j++) {
        const u32 lj = local_expert((u32)rs.sel[j], E, S, first, held);
        if (lj >= held) continue;
        u32 rank = 0;
        for (u32 i = 0; i < K; i++) rank += local_expert((u32)rs.sel[i], E, S, first, held) < lj;
        if (rank == a) { slot = j; loc = lj; }
    }
    if (slot == K || r >= inter) return;
    gate_up_rows<FP8, 1>(expert_ref(T, loc), 1, [=](u32) { return slot; }, x, h, k, hidden, inter, r);
}
extern "C" __global__ void moe_gate_up_route_bf16_t1(const u64* w, const float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 first, u32 held, u32 maxa, u32* plan, const float* x, float* h, u32 hidden, u32 inter) {
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_gate_up_route_body<0>(Tb, logits, bias, E, K, S, n_group, topk_group, norm, scaling, ids, wts, first, held, maxa, plan, x, h, hidden, inter);
}
extern "C" __global__ void moe_gate_up_route_fp8_t1(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const float* logits, const float* bias, u32 E, u32 K, u32 S, u32 n_group, u32 topk_group, int norm, float scaling, u32* ids, float* wts, u32 first, u32 held, u32 maxa, u32* plan, const float* x, float* h, u32 hidden, u32 inter) {
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_gate_up_route_body<1>(Tb, logits, bias, E, K, S, n_group, topk_group, norm, scaling, ids, wts, first, held, maxa, plan, x, h, hidden, inter);
}

// y[entry, r] = down_r · h[entry] (down is [hidden, inter]). Each sub-group takes
// MOE_DOWN_ROWS consecutive rows (moe.rs sizes the grid for it): down rows are short
// (Moonlight's 1,408 bf16 columns leave a sub-group 2.8 KB to stream per row), and pairs of
// them took a Moonlight batch-1 step 3.044 -> 2.99 ms on the H200 (batch 8 and 64 unchanged).
#define MOE_DOWN_ROWS 2
template <int FP8, int NT>
__device__ void moe_down_body(ExpertTable T, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter) {
    constexpr int R = MOE_DOWN_ROWS;
    u32 warps = blockDim.x / WEFT_WARP;
    u32 tiles = ((hidden + R - 1) / R + warps - 1) / warps;
    u32 a = blockIdx.x / tiles;
    if (a >= plan[0]) return;
    u32 r0 = ((blockIdx.x % tiles) * warps + threadIdx.x / WEFT_WARP) * R;
    if (r0 >= hidden) return;
    u32 rix[R], nr = min((u32)R, hidden - r0);
#pragma unroll
    for (int q = 0; q < R; q++) rix[q] = r0 + min((u32)q, nr - 1);
    WeightRef W = expert_ref(T, plan[1 + a]);
    const u32* off = plan + 1 + maxa;
    const u32* ent = plan + 2 + 2 * maxa;
    for (u32 i0 = off[a]; i0 < off[a + 1]; i0 += NT) {
        u32 nt = min((u32)NT, off[a + 1] - i0);
        u32 idx[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) idx[t] = t < nt ? ent[i0 + t] : 0;
        float acc[R][NT];
        rows_dot<FP8, R, NT, MOE_DOWN_U>(W, rix, nr, inter, h, inter, idx, nt, acc);
        if (threadIdx.x % WEFT_WARP == 0)
#pragma unroll
            for (int q = 0; q < R; q++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (q < (int)nr && t < (int)nt) y[(i64)idx[t] * hidden + r0 + q] = acc[q][t];
    }
}

// NT: entries per pass (1 when every active expert serves one entry: a single decoding token).
#define MOE_ENTRY(T)                                                                                                    \
    extern "C" __global__ void moe_gate_up_bf16_t##T(const u64* w, const u32* plan, u32 maxa, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) { \
        ExpertTable Tb = {w, w, 0, 1, 1};                                                                               \
        moe_gate_up_body<0, T>(Tb, plan, maxa, x, h, k, hidden, inter, m, S, held);                                     \
    }                                                                                                                   \
    extern "C" __global__ void moe_gate_up_fp8_t##T(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, const float* x, float* h, u32 k, u32 hidden, u32 inter, u32 m, u32 S, u32 held) { \
        ExpertTable Tb = {w, sc, sc_cols, br, bc};                                                                      \
        moe_gate_up_body<1, T>(Tb, plan, maxa, x, h, k, hidden, inter, m, S, held);                                     \
    }                                                                                                                   \
    extern "C" __global__ void moe_down_bf16_t##T(const u64* w, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter) { WEFT_PDL_ENTRY(); \
        ExpertTable Tb = {w, w, 0, 1, 1};                                                                               \
        moe_down_body<0, T>(Tb, plan, maxa, h, y, hidden, inter);                                                       \
    }                                                                                                                   \
    extern "C" __global__ void moe_down_fp8_t##T(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter) { WEFT_PDL_ENTRY(); \
        ExpertTable Tb = {w, sc, sc_cols, br, bc};                                                                      \
        moe_down_body<1, T>(Tb, plan, maxa, h, y, hidden, inter);                                                       \
    }
MOE_ENTRY(1)
MOE_ENTRY(8)

// out[t, :] = sum_j w[t*k + j] * y[t*k + j, :] over the token's k slots (routed, then any
// shared chunks run with them), summed in order (deterministic), then + add[t, :] (the shared
// experts' output, when they ran apart) when has_add. Only slots whose expert is among
// first..first+held or a shared chunk (ids E..E+S) count (all of them unless expert-parallel:
// the other ranks add theirs through the all-reduce). Each thread sums 4 consecutive dims
// (16-byte loads; rows of a multiple of 4, buffers 16-byte aligned as allocated) or, for other
// widths, one. Block b covers token b / chunks and blockDim threads' dims of it: a single token
// spreads over hidden / (4 · blockDim) blocks (moe.rs sizes the grid the same way).
// N consecutive floats (N = 4: one 16-byte access).
template <int N>
__device__ __forceinline__ void ld_n(const float* p, float (&v)[N]) {
    if constexpr (N == 4) {
        const float4 q = *(const float4*)p;
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        for (int i = 0; i < N; i++) v[i] = p[i];
    }
}
template <int N>
__device__ __forceinline__ void st_n(float* p, const float (&v)[N]) {
    if constexpr (N == 4) *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    else
        for (int i = 0; i < N; i++) p[i] = v[i];
}

// Slots a combine reads at once: their ids, weights and rows are all loaded before any is
// summed (one memory latency a batch, not one a slot: the slot's row is read whether or not
// its expert counts, its value used only if it does — every entry's row is allocated).
#define COMBINE_BATCH 8
// moe_combine's sum for token t, dims d..d + N.
template <int N>
__device__ __forceinline__ void combine_dims(const float* y, const float* wts, const u32* ids, u32 E, u32 S, u32 first, u32 held, const float* add, int has_add, float* out, u32 k, u32 hidden, i64 t, u32 d) {
    float s[N], v[COMBINE_BATCH][N], w[COMBINE_BATCH];
    bool use[COMBINE_BATCH];
    for (int i = 0; i < N; i++) s[i] = 0.f;
    for (u32 j0 = 0; j0 < k; j0 += COMBINE_BATCH) {
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; u++) {
            const u32 j = min(j0 + u, k - 1);
            use[u] = j0 + u < k && local_expert(ids[t * k + j], E, S, first, held) < held + S;
            w[u] = wts[t * k + j];
            ld_n<N>(y + (t * k + j) * hidden + d, v[u]);
        }
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; u++)
            if (use[u])
                for (int i = 0; i < N; i++) s[i] += w[u] * v[u][i];
    }
    if (has_add) {
        ld_n<N>(add + t * hidden + d, v[0]);
        for (int i = 0; i < N; i++) s[i] += v[0][i];
    }
    st_n<N>(out + t * hidden + d, s);
}

extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ wts, const u32* __restrict__ ids, u32 E, u32 S, u32 first, u32 held, const float* __restrict__ add, int has_add, float* __restrict__ out, u32 k, u32 hidden) { WEFT_PDL_ENTRY();
    const u32 per = hidden % 4 == 0 ? 4 : 1;
    const u32 chunks = (hidden + per * blockDim.x - 1) / (per * blockDim.x);
    const i64 t = blockIdx.x / chunks;
    const u32 d = ((blockIdx.x % chunks) * blockDim.x + threadIdx.x) * per;
    if (d >= hidden) return;
    if (per == 4) combine_dims<4>(y, wts, ids, E, S, first, held, add, has_add, out, k, hidden, t, d);
    else combine_dims<1>(y, wts, ids, E, S, first, held, add, has_add, out, k, hidden, t, d);
}

// moe_combine and then add_rms_norm of its output (the next layer's input norm) in one launch:
// block t sums token t's slots (combine_dims' order and bits), adds them into the
// residual row (written back) and norms it (rms_v4_scale: add_rms_norm's order and bits), the
// row held in registers as rms_row_v4 holds it. The host sizes the block by the row as for
// the norms (ops.rs norm_cfg) and takes this kernel only for rows rms_row_v4 takes. One
// dependent step a layer fewer: both kernels are a few µs of latency at batch 1, moving ~70 KB.
// At most 64 registers a thread: a 7168-wide row (Kimi-K2) takes 896 threads (round 30: with
// every row of a batch held at once, 128 registers, the launch failed for want of them).
extern "C" __global__ void __launch_bounds__(1024) moe_combine_add_rms_norm(const float* __restrict__ y, const float* __restrict__ wts, const u32* __restrict__ ids, u32 E, u32 S, u32 first, u32 held, const float* __restrict__ add, int has_add, float* res, const float* nw, float* out, u32 k, u32 hidden, float eps, int early) {
    // `early`: the next launch (the next layer's first GEMV) in at once, as add_rms_norm's.
    if (early) WEFT_PDL_TRIGGER();
    WEFT_PDL_ENTRY();
    __shared__ float sh[BLOCK];
    const i64 t = blockIdx.x;
    float* rt = res + t * hidden;
    float4 v[RMS_V], wv[RMS_V], r[RMS_V];
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    bool ok[RMS_V];
    // The residual and the norm weights first (one latency with the sums, not after them).
#pragma unroll
    for (int q = 0; q < RMS_V; q++) {
        const u32 j = 4 * (threadIdx.x + q * blockDim.x);
        ok[q] = j < hidden;
        v[q] = z;
        r[q] = ok[q] ? *(const float4*)(rt + j) : z;
        wv[q] = ok[q] ? *(const float4*)(nw + j) : z;
    }
    // moe_combine's sums (combine_dims' order and batches): a batch's ids and weights once for
    // both of a thread's float4s, then each float4's rows of the batch at once.
    for (u32 s0 = 0; s0 < k; s0 += COMBINE_BATCH) {
        float w[COMBINE_BATCH];
        bool use[COMBINE_BATCH];
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; u++) {
            const u32 s = min(s0 + u, k - 1);
            use[u] = s0 + u < k && local_expert(ids[t * k + s], E, S, first, held) < held + S;
            w[u] = wts[t * k + s];
        }
#pragma unroll
        for (int q = 0; q < RMS_V; q++) {
            if (!ok[q]) continue;
            float4 a[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) a[u] = *(const float4*)(y + (t * k + min(s0 + u, k - 1)) * hidden + 4 * (threadIdx.x + q * blockDim.x));
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++)
                if (use[u]) v[q].x += w[u] * a[u].x, v[q].y += w[u] * a[u].y, v[q].z += w[u] * a[u].z, v[q].w += w[u] * a[u].w;
        }
    }
#pragma unroll
    for (int q = 0; q < RMS_V; q++) {
        if (!ok[q]) continue;
        const u32 j = 4 * (threadIdx.x + q * blockDim.x);
        if (has_add) {
            const float4 a = *(const float4*)(add + t * hidden + j);
            v[q].x += a.x, v[q].y += a.y, v[q].z += a.z, v[q].w += a.w;
        }
        v[q] = make_float4(r[q].x + v[q].x, r[q].y + v[q].y, r[q].z + v[q].z, r[q].w + v[q].w);
        *(float4*)(rt + j) = v[q];
    }
    rms_v4_scale(v, wv, out + t * hidden, hidden, eps, sh);
}

// A single decoding token's experts' down products (moe_down_body, one entry an expert) and
// their combine in one launch: the grid is maxa blocks (one an active expert) for each tile of
// rows; past its rows' products a block counts itself in `sem[tile]`, and the last of the
// tile's blocks sums the tile's rows of every token's slots as moe_combine does (the same
// order and bits; y read past L1, written by the other blocks of the launch), then resets the
// counter. One dependent step a layer fewer than the down products and then moe_combine;
// measured slower on an H100 (round 29), off unless asked for.
template <int FP8>
__device__ void moe_down_combine_body(ExpertTable T, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter, const float* wts, const u32* ids, u32 E, u32 S, u32 first, u32 held, const float* add, int has_add, float* out, u32 m, u32 k, u32* sem) {
    moe_down_body<FP8, 1>(T, plan, maxa, h, y, hidden, inter);
    const u32 warps = blockDim.x / WEFT_WARP, rows = warps * MOE_DOWN_ROWS;
    const u32 tiles = ((hidden + MOE_DOWN_ROWS - 1) / MOE_DOWN_ROWS + warps - 1) / warps;  // moe_down_body's
    const u32 tile = blockIdx.x % tiles;
    if (!last_block_of(sem + tile, gridDim.x / tiles)) return;
    const volatile float* yv = y;
    for (u32 i = threadIdx.x; i < m * rows; i += blockDim.x) {
        const i64 t = i / rows;
        const u32 d = tile * rows + i % rows;
        if (d >= hidden) continue;
        float s = 0.f;
        for (u32 j = 0; j < k; j++)
            if (local_expert(ids[t * k + j], E, S, first, held) < held + S) s += wts[t * k + j] * yv[(t * k + j) * hidden + d];
        if (has_add) s += add[t * hidden + d];
        out[t * hidden + d] = s;
    }
    if (threadIdx.x == 0) sem[tile] = 0u;
}
extern "C" __global__ void moe_down_combine_bf16_t1(const u64* w, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter, const float* wts, const u32* ids, u32 E, u32 S, u32 first, u32 held, const float* add, int has_add, float* out, u32 m, u32 k, u32* sem) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, w, 0, 1, 1};
    moe_down_combine_body<0>(Tb, plan, maxa, h, y, hidden, inter, wts, ids, E, S, first, held, add, has_add, out, m, k, sem);
}
extern "C" __global__ void moe_down_combine_fp8_t1(const u64* w, const u64* sc, u32 sc_cols, u32 br, u32 bc, const u32* plan, u32 maxa, const float* h, float* y, u32 hidden, u32 inter, const float* wts, const u32* ids, u32 E, u32 S, u32 first, u32 held, const float* add, int has_add, float* out, u32 m, u32 k, u32* sem) { WEFT_PDL_ENTRY();
    ExpertTable Tb = {w, sc, sc_cols, br, bc};
    moe_down_combine_body<1>(Tb, plan, maxa, h, y, hidden, inter, wts, ids, E, S, first, held, add, has_add, out, m, k, sem);
}

// Prefill-sized MoE through grouped cuBLAS GEMMs (src/moe_grouped.rs). A pair p (a token
// routed to an expert) owns two rows of its expert's stacked GEMM operand, hi[p] and lo[p]: the
// activation's bf16 rounding and the bf16 of the rounding's error (as cast_f32_bf16_split), so
// one GEMM per expert takes both parts and the result rows add up to the f32-activation product.
// One block per pair.
extern "C" __global__ void moe_pairs_split(const float* __restrict__ x, const u32* tok, const u32* hi, const u32* lo, u16* out, u32 d) { WEFT_PDL_ENTRY();
    const u32 p = blockIdx.x;
    const float* xr = x + (i64)tok[p] * d;
    u16* oh = out + (i64)hi[p] * d;
    u16* ol = out + (i64)lo[p] * d;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        u16 h = f32_to_bf16(xr[j]);
        oh[j] = h;
        ol[j] = f32_to_bf16(xr[j] - bf16_to_f32(h));
    }
}

// h = silu(gate) * up from the pair's two gate|up result rows (summed), written back as the two
// bf16 parts of the down GEMM's operand, in the same rows.
extern "C" __global__ void moe_pairs_silu_split(const float* __restrict__ gu, const u32* hi, const u32* lo, u16* out, u32 inter) { WEFT_PDL_ENTRY();
    const u32 p = blockIdx.x;
    const float* gh = gu + (i64)hi[p] * 2 * inter;
    const float* gl = gu + (i64)lo[p] * 2 * inter;
    u16* oh = out + (i64)hi[p] * inter;
    u16* ol = out + (i64)lo[p] * inter;
    for (u32 j = threadIdx.x; j < inter; j += blockDim.x) {
        float a = gh[j] + gl[j];
        float v = a / (1.0f + expf(-a)) * (gh[inter + j] + gl[inter + j]);
        u16 h = f32_to_bf16(v);
        oh[j] = h;
        ol[j] = f32_to_bf16(v - bf16_to_f32(h));
    }
}

// out[t] = Σ_q w[t, q] · (y[hi[p]] + y[lo[p]]) over the token's k pairs p = tpair[t, q], in the
// order given (ascending expert, as the per-expert scatter it replaces); places of experts
// another rank holds are skipped. One block per token.
extern "C" __global__ void moe_pairs_combine(const float* __restrict__ y, const u32* hi, const u32* lo, const u32* tpair, const float* tw, float* out, u32 k, u32 d) { WEFT_PDL_ENTRY();
    const u32 t = blockIdx.x;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        float s = 0.f;
        for (u32 q = 0; q < k; q++) {
            u32 p = tpair[(i64)t * k + q];
            if (p == 0xffffffffu) continue;  // an expert another rank holds (NO_PAIR)
            s += tw[(i64)t * k + q] * (y[(i64)hi[p] * d + j] + y[(i64)lo[p] * d + j]);
        }
        out[(i64)t * d + j] = s;
    }
}
