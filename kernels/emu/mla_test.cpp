// mla_decode and mla_decode_mma (tensor cores, mma.sync emulated; 32-lane warps only), each
// with mla_combine (kernels/mla.cu), on the CPU emulator against a float64 reference: head
// counts 8 / 16 / 20 / 40 / 64 (groups of at most 16, the last smaller), one and three query
// rows per sequence, context splits as runtime/backend-cuda/src/mla.rs chooses them (a split
// whose only tile is partial, and empty splits, included); the MLA width of DeepSeek-V3 / Kimi
// (512 + 64, pages of 64 tokens) and a narrow one (64 + 32: a score quarter of one 16-column
// step, idle warps in the value pass; pages of 16 tokens, so tiles span pages); each kernel
// also over a bf16 cache (`_bf16` entries; the reference reads the same rounded values); and
// the grouped tensor-core kernels (mla_grouped.cu: 1, 2 or 4 m-tiles of 16 heads per block; the
// one-query-part kernel against a reference with bf16-rounded queries); and the wgmma kernel
// (mla_wgmma.cu: transposed products, the M-major value operand, one or two warpgroups; and
// 64 heads a block, the weights in registers; and its tokens split between the warpgroups;
// wgmma emulated); and two tiles a step in ping-pong between the warpgroups (mla_pair.cu: named
// barriers and mbarriers emulated; DeepSeek's width only).
// Exit status: the number of failing cases.
#include "emu.h"
#include "../weft_port.h"
#define BLOCK 256
#include "../weft.cu"
#include "../gemv.cu"
#include "../moe.cu"
#include "../mma.cu"
#include "../mla.cu"
#include "../mla_grouped.cu"
#include "../moe_gemm.cu"
#include "../moe_wgmma.cu"
#include "../mla_wgmma.cu"
#include "../mla_pair.cu"
#include <cstdlib>
#include <cstring>
#include <random>

int main() {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> U(-1, 1);
    int fails = 0;
    using K32 = void (*)(const float*, const float*, const float*, const u32*, const u32*, const u32*, float*, float*, u32, u32, u32, u32, u32, u32, float, u32);
    using K16 = void (*)(const u16*, const float*, const float*, const u32*, const u32*, const u32*, float*, float*, u32, u32, u32, u32, u32, u32, float, u32);
    // The 64-head kernels: their outputs merged in the kernel where `out` is given (mla_wgmma.cu
    // mlh_store); each case runs them both ways.
    using K16M = void (*)(const u16*, const float*, const float*, const u32*, const u32*, const u32*, float*, float*, u32, u32, u32, u32, u32, u32, float, u32, float*, u32*);
    // name, kernel (f32 or bf16 cache), threads, lanes, tile tokens, m-tiles per block, narrow
    // width, queries rounded to bf16 by the kernel (the reference then rounds them too)
    struct Variant { const char* name; K32 k32; K16 k16; unsigned threads, lanes, tile, mg; bool narrow, qround = false; double tol = 1e-4; K16M k16m = 0; };
    // NVIDIA's 32-lane warps and AMD's 64-lane wavefronts (the score phase shuffles in groups
    // of 16 lanes inside either); the tensor-core kernels are NVIDIA's only.
    const Variant variants[] = {
        {"mla_decode", mla_decode, 0, 256, 32, 16, 1, false}, {"mla_decode", mla_decode, 0, 256, 64, 16, 1, false},
        {"mla_decode_bf16", 0, mla_decode_bf16, 256, 64, 16, 1, false},
        {"mla_decode_mma", mla_decode_mma, 0, 512, 32, 32, 1, false}, {"mla_decode_mma", mla_decode_mma, 0, 512, 32, 32, 1, true},
        {"mla_decode_mma_bf16", 0, mla_decode_mma_bf16, 512, 32, 32, 1, false}, {"mla_decode_mma_bf16", 0, mla_decode_mma_bf16, 512, 32, 32, 1, true},
        {"mla_decode_mmg4w_bf16", 0, mla_decode_mmg4w_bf16, 512, 32, 16, 4, false}, {"mla_decode_mmg4w_bf16", 0, mla_decode_mmg4w_bf16, 512, 32, 16, 4, true},
        {"mla_decode_mmg2_bf16", 0, mla_decode_mmg2_bf16, 512, 32, 32, 2, false},
        {"mla_decode_mmg1w_bf16", 0, mla_decode_mmg1w_bf16, 512, 32, 64, 1, false}, {"mla_decode_mmg1w_bf16", 0, mla_decode_mmg1w_bf16, 512, 32, 64, 1, true},
        {"mla_decode_mmg2w", mla_decode_mmg2w, 0, 512, 32, 16, 2, false}, {"mla_decode_mmg2w", mla_decode_mmg2w, 0, 512, 32, 16, 2, true},
        {"mla_decode_mmg4wq1_bf16", 0, mla_decode_mmg4wq1_bf16, 512, 32, 32, 4, false, true}, {"mla_decode_mmg4wq1_bf16", 0, mla_decode_mmg4wq1_bf16, 512, 32, 32, 4, true, true},
        {"mla_decode_wg_bf16", 0, mla_decode_wg_bf16, 128, 32, 64, 1, false}, {"mla_decode_wg_bf16", 0, mla_decode_wg_bf16, 128, 32, 64, 1, true},
        {"mla_decode_wg2_bf16", 0, mla_decode_wg2_bf16, 256, 32, 64, 1, false}, {"mla_decode_wg2_bf16", 0, mla_decode_wg2_bf16, 256, 32, 64, 1, true},
        {"mla_decode_wgh_bf16", 0, 0, 256, 32, 32, 4, false, false, 1e-4, mla_decode_wgh_bf16}, {"mla_decode_wgh_bf16", 0, 0, 256, 32, 32, 4, true, false, 1e-4, mla_decode_wgh_bf16},
        // one part: bf16 queries (the reference rounds them too) and bf16 weights (~2^-9 each)
        {"mla_decode_wgh1_bf16", 0, 0, 256, 32, 32, 4, false, true, 1e-2, mla_decode_wgh1_bf16}, {"mla_decode_wgh1_bf16", 0, 0, 256, 32, 32, 4, true, true, 1e-2, mla_decode_wgh1_bf16},
        // the tile's tokens split between the warpgroups, one part as above
        {"mla_decode_wgs_bf16", 0, 0, 256, 32, 64, 4, false, true, 1e-2, mla_decode_wgs_bf16}, {"mla_decode_wgs_bf16", 0, 0, 256, 32, 64, 4, true, true, 1e-2, mla_decode_wgs_bf16},
        // two tiles a step in ping-pong between the warpgroups (mla_pair.cu): DeepSeek's width only
        {"mla_decode_wgp_bf16", 0, 0, 256, 32, 64, 4, false, true, 1e-2, mla_decode_wgp_bf16},
    };
    const char* only = std::getenv("MLA_TEST_ONLY");  // a substring of the kernels' names to run
    for (const Variant& v : variants) {
    if (only && !std::strstr(v.name, only)) continue;
    const bool mma = v.k32 != mla_decode && v.k16 != mla_decode_bf16, bf = v.k16 || v.k16m;
    const unsigned vlat = v.narrow ? 64 : 512, vrd = v.narrow ? 32 : 64, vpage = v.narrow ? 16 : 64;
    emu_warp = v.lanes;
    const unsigned latent = vlat, rd = vrd, w = latent + rd, page = vpage, n = 2500, n_pages = (n + page - 1) / page, T = v.tile;
    std::vector<float> layer(n_pages * page * w);
    std::vector<u16> layer16(layer.size());
    for (size_t i = 0; i < layer.size(); i++) {
        layer16[i] = f32_to_bf16(2 * U(rng));
        layer[i] = bf ? bf16_to_f32(layer16[i]) : 2 * U(rng);
    }
    std::vector<unsigned> table(n_pages);
    for (unsigned i = 0; i < n_pages; i++) table[i] = n_pages - 1 - i;  // scattered pages
    struct Case { unsigned heads; int rows; unsigned max_splits; };
    std::vector<Case> cases = {Case{16, 1, 1000}, Case{8, 3, 24}, Case{16, 3, 24}, Case{64, 1, 12}, Case{20, 3, 24}, Case{40, 1, 12}};
    if (v.k16m) {
        cases.push_back(Case{64, 1, 1});  // one split: written out by the kernel at once
        cases.push_back(Case{64, 1, 2});  // two: each merges half the tiles, bit for bit the combine's
        cases.push_back(Case{64, 3, 2});  // three rows, two splits and an empty one
    }
    for (Case c : cases) {
        std::vector<unsigned> bt, off, ctx;
        for (int r = 0; r < c.rows; r++) {
            off.push_back(bt.size());
            bt.insert(bt.end(), table.begin(), table.end());
            ctx.push_back(n - (c.rows - 1 - r));
        }
        std::vector<float> ql(c.rows * c.heads * latent), qp(c.rows * c.heads * rd);
        for (auto& v : ql) v = 0.5f * U(rng);
        for (auto& v : qp) v = 0.5f * U(rng);
        const float scale = 0.06f;
        // launch shape as mla.rs: 4 waves over 132 SMs, each split at least a tile
        const unsigned most = 16 * v.mg;
        unsigned groups = (c.heads + most - 1) / most, hg = (c.heads + groups - 1) / groups;
        groups = (c.heads + hg - 1) / hg;
        unsigned max_ctx = *std::max_element(ctx.begin(), ctx.end());
        unsigned base = c.rows * groups, want = (4 * 132 + base - 1) / base;
        unsigned nsplit = std::max(1u, std::min({want, (max_ctx + T - 1) / T, c.max_splits}));
        unsigned chunk = ((max_ctx + nsplit - 1) / nsplit + T - 1) / T * T;
        nsplit = (max_ctx + chunk - 1) / chunk;
        std::vector<float> o_part(c.rows * c.heads * nsplit * latent, NAN), ml(c.rows * c.heads * nsplit * 2, NAN), out(c.rows * c.heads * latent, NAN);
        // One more split than the context needs: an empty split must merge as nothing.
        nsplit += mma && c.rows == 3;
        o_part.assign(c.rows * c.heads * nsplit * latent, NAN);
        ml.assign(c.rows * c.heads * nsplit * 2, NAN);
        if (v.k16m)
            emu_launch(base, nsplit, v.threads, [&] { v.k16m(layer16.data(), ql.data(), qp.data(), bt.data(), off.data(), ctx.data(), o_part.data(), ml.data(), c.heads, groups, hg, latent, rd, page, scale, T, nullptr, nullptr); });
        else if (bf)
            emu_launch(base, nsplit, v.threads, [&] { v.k16(layer16.data(), ql.data(), qp.data(), bt.data(), off.data(), ctx.data(), o_part.data(), ml.data(), c.heads, groups, hg, latent, rd, page, scale, T); });
        else
            emu_launch(base, nsplit, v.threads, [&] { v.k32(layer.data(), ql.data(), qp.data(), bt.data(), off.data(), ctx.data(), o_part.data(), ml.data(), c.heads, groups, hg, latent, rd, page, scale, T); });
        emu_launch(c.rows * c.heads, (latent + 127) / 128, 128, [&] { mla_combine(o_part.data(), ml.data(), out.data(), nsplit, latent); });
        // The same launch merging in the kernel, its splits' blocks run together (a cluster
        // along y, as the host merges several splits only where the whole grid is resident):
        // the counters (two a row and head group) must come back reset, and up to two splits
        // the outputs must be mla_combine's, bit for bit. (The host merges at most two splits
        // by default, `WEFT_CUDA_MLA_MERGE` more; past 16, the emulator's largest cluster, these
        // cases are not merged here.)
        std::vector<float> merged;
        bool merge_ok = true, merge_ran = v.k16m && nsplit <= EMU_MAX_CLUSTER;
        if (merge_ran) {
            std::vector<u32> sem(2 * base, 0);
            merged.assign(out.size(), NAN);
            o_part.assign(o_part.size(), NAN);
            ml.assign(ml.size(), NAN);
            emu_launch_clusters(base, nsplit, 1, v.threads, nsplit, [&] { v.k16m(layer16.data(), ql.data(), qp.data(), bt.data(), off.data(), ctx.data(), o_part.data(), ml.data(), c.heads, groups, hg, latent, rd, page, scale, T, merged.data(), nsplit > 1 ? sem.data() : nullptr); });  // as the host: no counters for one split
            for (u32 x : sem) merge_ok &= x == 0;
            for (size_t i = 0; i < out.size(); i++)
                if (nsplit <= 2 ? merged[i] != out[i] : !(std::fabs(merged[i] - out[i]) <= 1e-6 * (1 + std::fabs(out[i])))) merge_ok = false;
        }
        double worst = 0, peak = 0;
        for (int r = 0; r < c.rows; r++)
            for (unsigned h = 0; h < c.heads; h++) {
                const float* q1 = &ql[(r * c.heads + h) * latent];
                const float* q2 = &qp[(r * c.heads + h) * rd];
                auto row = [&](unsigned t) { return &layer[((size_t)table[t / page] * page + t % page) * w]; };
                std::vector<double> p(ctx[r]);
                double m = -1e300, l = 0;
                for (unsigned t = 0; t < ctx[r]; t++) {
                    double a = 0;
                    for (unsigned j = 0; j < w; j++) {
                        float qv = j < latent ? q1[j] : q2[j - latent];
                        if (v.qround) qv = bf16_to_f32(f32_to_bf16(qv));
                        a += (double)qv * row(t)[j];
                    }
                    p[t] = a * scale;
                    m = std::max(m, p[t]);
                }
                for (auto& x : p) l += (x = std::exp(x - m));
                for (unsigned d = 0; d < latent; d++) {
                    double a = 0;
                    for (unsigned t = 0; t < ctx[r]; t++) a += p[t] * row(t)[d];
                    a /= l;
                    double got = out[(r * c.heads + h) * latent + d];
                    worst = std::isfinite(got) ? std::max(worst, std::fabs(got - a)) : INFINITY;
                    peak = std::max(peak, std::fabs(a));
                    if (!std::isfinite(got)) break;
                }
            }
        bool ok = worst / peak < v.tol && merge_ok;
        std::printf("%s %u+%u, %u-lane sub-groups, %u heads x %d rows, %u splits of %u: rel err %.2e%s %s\n", v.name, latent, rd, v.lanes, c.heads, c.rows, nsplit, chunk, worst / peak, merge_ran ? (merge_ok ? ", merged in the kernel: the same" : ", merged in the kernel: DIFFERENT") : "", ok ? "ok" : "FAILED");
        fails += !ok;
    }
    }
    return fails;
}
