// The prefill-sized MoE of kernels/moe_gemm.cu on the CPU emulator (32-lane warps, mma.sync
// emulated), planned by moe_route_plan and summed by moe_combine as runtime/backend-cuda/src/moe.rs
// launches them, against a float64 reference over the same routing: bf16 and fp8 (block-scaled)
// experts; shapes with partial weight slices (inter 96 of a 64-wide gate|up slice, hidden 160 of a
// 128-row down slice) and experts whose entries span several 64-row tiles (skewed router logits);
// and an expert-parallel rank (experts 2..5 of 8 planned; the reference sums only those); with
// shared-expert chunks run as experts every token takes with weight 1 (S slots after the K
// routed ones, planned after the routed experts), on a whole layer and on the rank.
// Tiles take the activations' second part only where they hold a precise token (the step's
// decode rows and drafts, runtime/backend-cuda/src/precision.rs): cases with every token precise
// (f32-grade everywhere), none (one part: bf16-grade, and visibly so), and by per-token flags —
// a prefix and a tail precise (f32-grade there, one part everywhere else, bit for bit the
// results of a step with no precise token, even in tiles shared with precise tokens).
// Built with -DWEFT_MG_BK=64 it checks the 64-column-stage variant, with -DWEFT_MG_ONE_PART the
// one-activation-part variant (against a looser bound), with -DWEFT_MG_ASYNC (and
// -DWEFT_MG_STAGES=N) the cp.async variant's split pass and two-part operands, with
// -DWEFT_MG_WG the bf16 experts through moe_wgmma.cu's kernels (wgmma emulated; hidden 320 and
// intermediate 192, multiples of its 64-column stages; fp8 stays on moe_gemm.cu's), and with
// -DWEFT_MG_WG2 as well through its two-warpgroup entries (tile pairs; 140 tokens, so the
// favoured expert's tiles make a pair and a lone last tile; blocks in slice-major order).
// Exit status: the number of failing cases.
#include "emu.h"
#include "../weft_port.h"
#define BLOCK 256
#include "../weft.cu"
#include "../gemv.cu"
#include "../moe.cu"
#include "../mma.cu"
#include "../moe_gemm.cu"
#include "../moe_wgmma.cu"
#include <cstring>
#include <random>

// e4m3 code of v (v already on the grid of codes the test draws from).
static unsigned char e4m3(float v) {
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f && fp8_to_f32((unsigned char)c) == v) return (unsigned char)c;
    std::abort();
}

int main() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1, 1);
    emu_warp = 32;
    int fails = 0;
#ifdef WEFT_MG_WG2
#define WEFT_MG_WG
    const unsigned M = 140, WT = 256, WO = 1;  // and blocks in slice-major order
#else
    const unsigned M = 70, WT = 128, WO = 0;
#endif
#ifdef WEFT_MG_WG
    const bool wg = true;
    const unsigned E = 8, K = 3, H = 5 * WG_BK, I = 3 * WG_BK;
#else
    const bool wg = false;
    const unsigned E = 8, K = 3, H = 5 * MG_BK, I = 3 * MG_BK;  // 160 and 96 for 32-column stages
#endif
    // Precise tokens: the first `pre` and the last `tail` (all: mode 1, none: mode 0, else flags).
    struct Case { bool fp8; unsigned first, held, S, pre, tail; };
    for (Case c : {Case{false, 0, E, 0, M, 0}, Case{true, 0, E, 0, M, 0}, Case{false, 2, 4, 0, M, 0}, Case{false, 0, E, 2, M, 0}, Case{true, 2, 4, 1, M, 0},
                   Case{false, 0, E, 2, 0, 0}, Case{true, 0, E, 0, 0, 0}, Case{false, 0, E, 0, 12, 3}, Case{true, 2, 4, 1, 12, 0}, Case{false, 0, E, 2, 0, 4}}) {
        std::vector<u32> flags(M);
        for (unsigned t = 0; t < M; t++) flags[t] = t < c.pre || t >= M - c.tail;
        const unsigned n_precise = std::min(M, c.pre + c.tail), mode = n_precise == M ? 1 : n_precise == 0 ? 0 : 2;
        const unsigned KS = K + c.S, tab = c.held + c.S;  // slots per token, table entries
        // Router logits skewed towards expert 2, so it serves more than one 64-row tile.
        std::vector<float> logits(M * E), bias(E);
        for (unsigned t = 0; t < M; t++)
            for (unsigned e = 0; e < E; e++) logits[t * E + e] = 2 * U(rng) + (e == 2 ? 4.f : 0.f);
        for (auto& b : bias) b = 0.1f * U(rng);
        std::vector<float> x(M * H);
        for (auto& v : x) v = U(rng);
        // Weights: bf16 values, or e4m3 codes (small integers times powers of two) with block
        // scales of 32 rows x one stage's columns.
        const unsigned BR = 32, BC = MG_BK;
        std::vector<std::vector<u16>> gu16(tab), dn16(tab);
        std::vector<std::vector<unsigned char>> gu8(tab), dn8(tab);
        std::vector<std::vector<float>> gus(tab), dns(tab), guf(tab), dnf(tab);
        auto make = [&](unsigned rows, unsigned cols, std::vector<u16>& w16, std::vector<unsigned char>& w8, std::vector<float>& sc, std::vector<float>& wf) {
            const unsigned scc = (cols + BC - 1) / BC;
            sc.assign(((rows + BR - 1) / BR) * scc, 0.f);
            for (auto& s : sc) s = 0.01f * (1 + (rng() % 8));
            w16.resize(rows * cols);
            w8.resize(rows * cols);
            wf.resize(rows * cols);
            for (unsigned r = 0; r < rows; r++)
                for (unsigned j = 0; j < cols; j++) {
                    size_t i = (size_t)r * cols + j;
                    if (c.fp8) {
                        float v = (float)((int)(rng() % 15) - 7) * (rng() % 2 ? 0.5f : 1.f);
                        w8[i] = e4m3(v);
                        wf[i] = v * sc[(r / BR) * scc + j / BC];
                    } else {
                        w16[i] = f32_to_bf16(0.2f * U(rng));
                        wf[i] = bf16_to_f32(w16[i]);
                    }
                }
        };
        for (unsigned e = 0; e < tab; e++) {
            make(2 * I, H, gu16[e], gu8[e], gus[e], guf[e]);
            make(H, I, dn16[e], dn8[e], dns[e], dnf[e]);
        }
        std::vector<u64> tgu(tab), tdn(tab), tgus(tab), tdns(tab);
        for (unsigned e = 0; e < tab; e++) {
            tgu[e] = c.fp8 ? (u64)gu8[e].data() : (u64)gu16[e].data();
            tdn[e] = c.fp8 ? (u64)dn8[e].data() : (u64)dn16[e].data();
            tgus[e] = (u64)gus[e].data();
            tdns[e] = (u64)dns[e].data();
        }

        // Routing and plan, sized as moe.rs sizes them.
        const unsigned n = M * KS, maxa = std::min(tab, n);
        std::vector<u32> ids(n), plan(2 + 2 * maxa + n + 1 + 2 * (n / MOE_TILE_ROWS + maxa), 0xdeadbeefu), counter(1, 0);
        std::vector<float> wts(n);
        emu_launch(M, 1, 256, [&] { moe_route_plan(logits.data(), bias.data(), E, K, c.S, 1, 1, 1, 2.5f, ids.data(), wts.data(), c.first, c.held, maxa, plan.data(), counter.data(), 1); });
        const u32* tl = plan.data() + 2 + 2 * maxa + n;
        unsigned most = 0;
        for (unsigned a = 0; a < plan[0]; a++) most = std::max(most, plan[2 + maxa + a] - plan[1 + maxa + a]);

        const unsigned tiles = n / MOE_TILE_ROWS + maxa;
        const unsigned scg = (H + BC - 1) / BC, scd = (I + BC - 1) / BC;
        // The layer's output [M, H] with tiles' parts chosen by `md` (flags as above).
        auto layer = [&](unsigned md) {
            // h: f32 rows, or (cp.async variant, bf16 experts) two-part bf16 rows in the same bytes.
            std::vector<float> h(n * I, NAN), y(n * H, NAN), out(M * H, NAN);
            std::vector<u16> xs(MG_ASYNC ? n * 2 * H : 0, 0xffff);  // NaN bits where unwritten
            if (MG_ASYNC && !c.fp8) emu_launch(n, 1, MG_THREADS, [&] { moe_gemm_split(plan.data(), maxa, x.data(), KS, H, xs.data()); });
            // wgmma kernels: the tokens' bf16 parts, and h as bf16 parts in h's bytes.
            std::vector<u16> xw(wg ? M * 2 * H : 0, 0xffff);
            if (wg && !c.fp8) emu_launch(M, 1, 128, [&] { moe_wg_split(x.data(), H, xw.data()); });
            const void* gx = MG_ASYNC && !c.fp8 ? (const void*)xs.data() : (const void*)x.data();
            const unsigned threads = wg && !c.fp8 ? WT : MG_THREADS;
            // wgmma kernels in slice-major order (WO 1) take the transposed grid.
            const bool tr = wg && !c.fp8 && WO == 1;
            emu_launch(tr ? (I + 63) / 64 : tiles, tr ? tiles : (I + 63) / 64, threads, [&] {
                if (c.fp8) moe_gemm_gate_up_fp8(tgu.data(), tgus.data(), scg, BR, BC, plan.data(), maxa, n, x.data(), h.data(), KS, H, I, flags.data(), md);
                else if (wg && WT == 256) moe_wg2_gate_up_bf16(tgu.data(), plan.data(), maxa, n, xw.data(), h.data(), KS, H, I, flags.data(), md, WO);
                else if (wg) moe_wg_gate_up_bf16(tgu.data(), plan.data(), maxa, n, xw.data(), h.data(), KS, H, I, flags.data(), md, WO);
                else moe_gemm_gate_up_bf16(tgu.data(), plan.data(), maxa, n, gx, h.data(), KS, H, I, flags.data(), md);
            });
            emu_launch(tr ? (H + 127) / 128 : tiles, tr ? tiles : (H + 127) / 128, threads, [&] {
                if (c.fp8) moe_gemm_down_fp8(tdn.data(), tdns.data(), scd, BR, BC, plan.data(), maxa, n, h.data(), y.data(), H, I, KS, flags.data(), md);
                else if (wg && WT == 256) moe_wg2_down_bf16(tdn.data(), plan.data(), maxa, n, h.data(), y.data(), H, I, KS, flags.data(), md, WO);
                else if (wg) moe_wg_down_bf16(tdn.data(), plan.data(), maxa, n, h.data(), y.data(), H, I, KS, flags.data(), md, WO);
                else moe_gemm_down_bf16(tdn.data(), plan.data(), maxa, n, h.data(), y.data(), H, I, KS, flags.data(), md);
            });
            emu_launch(M * ((H + 511) / 512), 1, 128, [&] { moe_combine(y.data(), wts.data(), ids.data(), E, c.S, c.first, c.held, nullptr, 0, out.data(), KS, H); });
            return out;
        };
        const std::vector<float> out = layer(mode);
        // Per-token flags: every token without one has the bits it has when no token has one, and
        // every token with one the bits of all two-part tiles (whatever shares its tiles).
        unsigned differ = 0;
        if (mode == 2) {
            const std::vector<float> one = layer(0), two = layer(1);
            for (unsigned t = 0; t < M; t++)
                differ += std::memcmp(&out[t * H], flags[t] ? &two[t * H] : &one[t * H], H * sizeof(float)) != 0;
        }

        // Reference: the same routing (ids, wts), float64 products over f32 activations.
        double worst = 0, worst_rest = 0, scale = 0;  // tokens below precise | the others
        for (unsigned t = 0; t < M; t++) {
            std::vector<double> ref(H, 0.0);
            for (unsigned j = 0; j < KS; j++) {
                // Routed slots: the expert's place among those held; shared slots: the chunk's.
                unsigned e = j < K ? ids[t * KS + j] - c.first : c.held + (j - K);
                if (j < K ? e >= c.held : ids[t * KS + j] != E + (j - K) || wts[t * KS + j] != 1.f) {
                    if (j >= K) worst = worst_rest = INFINITY;  // a shared slot must always be there, weight 1
                    continue;
                }
                std::vector<double> hh(I);
                for (unsigned p = 0; p < I; p++) {
                    double g = 0, u = 0;
                    for (unsigned q = 0; q < H; q++) {
                        g += (double)guf[e][(size_t)p * H + q] * x[t * H + q];
                        u += (double)guf[e][(size_t)(I + p) * H + q] * x[t * H + q];
                    }
                    hh[p] = g / (1 + std::exp(-g)) * u;
                }
                for (unsigned r = 0; r < H; r++) {
                    double s = 0;
                    for (unsigned p = 0; p < I; p++) s += (double)dnf[e][(size_t)r * I + p] * hh[p];
                    ref[r] += wts[t * KS + j] * s;
                }
            }
            for (unsigned r = 0; r < H; r++) {
                double& w = flags[t] ? worst : worst_rest;
                w = std::max(w, std::fabs(ref[r] - out[t * H + r]));
                if (std::isnan(out[t * H + r])) w = INFINITY;
                scale = std::max(scale, std::fabs(ref[r]));
            }
        }
        // Precise tokens f32-grade; the others bf16-grade, and (two-part build) visibly one part.
        const double err = worst / std::max(scale, 1e-30), rest = worst_rest / std::max(scale, 1e-30);
        const bool ok = err < (MG_PARTS == 2 ? 2e-5 : 1e-2) && rest < 1e-2 && (MG_PARTS == 1 || mode == 1 || rest > 1e-4) && tl[0] > plan[0] && differ == 0;
        std::printf("%s experts %u..%u + %u shared, %2u precise tokens (%u first, %u last): %u active, %u tiles (most entries of one expert %u), max |out - ref| / max |ref| = %.2e precise, %.2e others (max |ref| %.3g), %u tokens not as alone %s\n",
                    c.fp8 ? "fp8 " : "bf16", c.first, c.first + c.held, c.S, n_precise, std::min(M, c.pre), c.tail, plan[0], tl[0], most, err, rest, scale, differ, ok ? "ok" : "FAIL");
        fails += !ok;
    }
    return fails;
}
