// The dense tensor-core linears of kernels/mma.cu for 33–64 activation rows (mma.sync emulated):
// gemv_mma_bf16_n8 (one 64-row pass) alone and over thread block clusters of 2, 4 and 8 blocks
// splitting each unit's columns (_c2, _c4, _c8: cluster barrier and reads of the other blocks'
// shared memory emulated), one, two or four 32-row units a block, plain (3 and 4 units), per
// head group (W_UV-like: each 128-row group multiplies its own slice of the activation row) and
// gated (SiLU(gate) · up) — against a float64 reference of the bf16 weights times the f32
// activations, at 40, 57 and 64 rows (partial last 8-row tiles), 1–4 sub-groups a unit, column
// shares that do not divide evenly; the 32-row kernel gemv_mma_bf16_n4 in two passes on the
// same data as a check of the check. Outputs start as NaN: every one must be written.
// Exit status: the number of failing cases.
#include "emu.h"
#include "../weft_port.h"
#define BLOCK 256
#include "../weft.cu"
#include "../gemv.cu"
#include "../moe.cu"
#include "../mma.cu"
#include <cmath>
#include <random>

int main() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> U(-1, 1);
    emu_warp = 32;
    int fails = 0;
    // rows = weight rows (gated: intermediate size), cols, head groups (0: gated)
    struct Shape { unsigned rows, cols, groups; const char* what; };
    for (Shape sh : {Shape{96, 512, 1, "plain"}, Shape{128, 384, 1, "plain"}, Shape{256, 256, 2, "2 head groups"}, Shape{64, 384, 0, "gated"}}) {
        const bool gated = sh.groups == 0;
        const unsigned wrows = gated ? 2 * sh.rows : sh.rows, groups = gated ? 1 : sh.groups;
        const unsigned xs = groups * sh.cols, grp = sh.rows / groups, units = gated ? sh.rows / 16 : sh.rows / 32;
        std::vector<u16> w((size_t)wrows * sh.cols);
        for (auto& v : w) v = f32_to_bf16(U(rng) * 0.5f);
        for (unsigned m : {40u, 57u, 64u}) {
            std::vector<float> x((size_t)m * xs);
            for (auto& v : x) v = U(rng);
            // reference and the scale of each output's sum (|w|·|x|)
            std::vector<double> ref((size_t)m * sh.rows), mag((size_t)m * sh.rows);
            auto dot = [&](unsigned i, unsigned r, double& a) {
                const float* xr = x.data() + (size_t)i * xs + (gated ? 0 : (r / grp) * sh.cols);
                double s = 0;
                for (unsigned c = 0; c < sh.cols; c++) {
                    double p = (double)bf16_to_f32(w[(size_t)r * sh.cols + c]) * xr[c];
                    s += p;
                    a += std::fabs(p);
                }
                return s;
            };
            for (unsigned i = 0; i < m; i++)
                for (unsigned r = 0; r < sh.rows; r++) {
                    double a = 0, g = dot(i, r, a);
                    if (gated) {
                        double b = 0, up = dot(i, sh.rows + r, b);
                        ref[(size_t)i * sh.rows + r] = g / (1 + std::exp(-g)) * up;
                        mag[(size_t)i * sh.rows + r] = (std::fabs(g) + a) * b + a * std::fabs(up);
                    } else {
                        ref[(size_t)i * sh.rows + r] = g;
                        mag[(size_t)i * sh.rows + r] = a;
                    }
                }
            struct Run { const char* kernel; unsigned cl, split, ub; };
            std::vector<Run> runs = {{"n8", 1, 1, 1}, {"n8", 1, 4, 1}, {"n8_c2", 2, 2, 1}, {"n8_c4", 4, 1, 1}, {"n8_c4", 4, 2, 1}};
            if (units % 4 == 0) runs.insert(runs.end(), {{"n8", 1, 2, 2}, {"n8", 1, 1, 4}, {"n8_c2", 2, 2, 2}, {"n8_c4", 4, 1, 4}, {"n8_c4", 4, 2, 2}, {"n8_c8", 8, 1, 4}});
            else runs.push_back({"n8_c8", 8, 1, 1});
            if (!gated && groups == 1) runs.push_back({"n4 (two passes)", 1, 4, 1});
            for (Run run : runs) {
                std::vector<float> out((size_t)m * sh.rows, NAN);
                const u16* wp = w.data();
                const float* xp = x.data();
                float* op = out.data();
                const std::string k = run.kernel;
                const unsigned ub = run.ub;
                emu_launch_clusters(units / ub, run.cl, 1, 32 * run.split * ub, run.cl, [&] {
                    if (k == "n8") gated ? gemv_gated_mma_bf16_n8(wp, xp, op, m, sh.rows, sh.cols, ub) : gemv_mma_bf16_n8(wp, xp, op, m, sh.rows, sh.cols, grp, xs, ub);
                    else if (k == "n8_c2") gated ? gemv_gated_mma_bf16_n8_c2(wp, xp, op, m, sh.rows, sh.cols, ub) : gemv_mma_bf16_n8_c2(wp, xp, op, m, sh.rows, sh.cols, grp, xs, ub);
                    else if (k == "n8_c4") gated ? gemv_gated_mma_bf16_n8_c4(wp, xp, op, m, sh.rows, sh.cols, ub) : gemv_mma_bf16_n8_c4(wp, xp, op, m, sh.rows, sh.cols, grp, xs, ub);
                    else if (k == "n8_c8") gated ? gemv_gated_mma_bf16_n8_c8(wp, xp, op, m, sh.rows, sh.cols, ub) : gemv_mma_bf16_n8_c8(wp, xp, op, m, sh.rows, sh.cols, grp, xs, ub);
                    else gemv_mma_bf16_n4(wp, xp, op, m, sh.rows, sh.cols, grp, xs);
                });
                double worst = 0;
                bool bad = false;
                for (size_t e = 0; e < out.size(); e++) {
                    double err = std::fabs(out[e] - ref[e]) / (mag[e] + 1e-30);
                    if (!(err <= 5e-6)) bad = true;  // NaN (unwritten) fails too
                    if (err > worst || std::isnan(out[e])) worst = std::isnan(out[e]) ? INFINITY : std::max(worst, err);
                }
                fails += bad;
                std::printf("gemv_mma %-16s %-14s %3u x %3u, m %2u, cluster %u, %u unit(s) x %u sub-groups a block: worst |out - ref| / sum|w x| = %.2e %s\n", run.kernel, sh.what, sh.rows, sh.cols, m, run.cl, run.ub, run.split, worst, bad ? "FAIL" : "ok");
            }
        }
    }
    return fails;
}
