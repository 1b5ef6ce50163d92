// mla_flash_bf16 (kernels/mla_flash.cu: prefill attention per head in one pass, mma.sync and
// ldmatrix emulated) against a float64 causal softmax over the same keys and values (bf16) and
// the f32 queries rounded to bf16: runs that start a prompt (ctx0 0) and chunks after a cached context (ctx0 37: key
// tiles that straddle the diagonal at an offset; 200: several tiles every row sees whole), with
// a partial last query tile and a partial last key tile, two and three heads (head strides),
// and an output wider than the heads' values (out_ld). Also that the rows past `rows` and the
// columns outside the heads are left alone.
// Exit status: the number of failing cases.
#include "emu.h"
#include "../weft_port.h"
#define BLOCK 256
#include "../weft.cu"
#include "../gemv.cu"
#include "../moe.cu"
#include "../mma.cu"
#include "../moe_gemm.cu"
#include "../mla.cu"
#include "../mla_flash.cu"
#include <random>

int main() {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> U(-1, 1);
    emu_warp = 32;
    int fails = 0;
    struct Case { unsigned rows, ctx0, heads; float qscale; };
    // qscale 3: peaked softmaxes (scores of several units), 0.5: flat ones
    for (Case c : {Case{150, 0, 2, 3.f}, Case{70, 37, 3, 0.5f}, Case{64, 200, 2, 3.f}, Case{129, 37, 2, 3.f}}) {
        const unsigned H = c.heads, keys = c.ctx0 + c.rows, ld_out = H * FA_VW + 8;
        auto bf = [&](float x) { return f32_to_bf16(x); };
        const unsigned RD = FA_KW - FA_NOPE;
        std::vector<float> qn((size_t)c.rows * H * FA_NOPE), qp((size_t)c.rows * H * RD);
        std::vector<u16> k((size_t)keys * H * FA_KW), v((size_t)keys * H * FA_VW);
        for (auto& x : qn) x = U(rng) * c.qscale;  // f32: the kernel rounds them
        for (auto& x : qp) x = U(rng) * c.qscale;
        // the query column x of (row i, head h), rounded to bf16 as the kernel reads it
        auto q = [&](unsigned i, unsigned h, unsigned x) { return bf16_to_f32(bf(x < FA_NOPE ? qn[((size_t)i * H + h) * FA_NOPE + x] : qp[((size_t)i * H + h) * RD + x - FA_NOPE])); };
        for (auto& x : k) x = bf(U(rng));
        for (auto& x : v) x = bf(U(rng));
        const float sentinel = 12345.f;
        std::vector<float> out((size_t)(c.rows + 1) * ld_out, sentinel);
        const float scale = 1.0f / std::sqrt((float)FA_KW);
        emu_launch((c.rows + FA_BM - 1) / FA_BM, H, 128, [&] { mla_flash_bf16(qn.data(), qp.data(), k.data(), v.data(), out.data(), c.rows, c.ctx0, H, ld_out, scale); });
        double worst = 0, vmax = 0;
        bool untouched = true;
        for (unsigned i = 0; i < c.rows; i++)
            for (unsigned h = 0; h < H; h++) {
                const unsigned n = c.ctx0 + i + 1;
                std::vector<double> s(n);
                double mx = -1e300, sum = 0;
                for (unsigned j = 0; j < n; j++) {
                    double d = 0;
                    for (unsigned x = 0; x < FA_KW; x++) d += (double)q(i, h, x) * bf16_to_f32(k[((size_t)j * H + h) * FA_KW + x]);
                    s[j] = d * scale;
                    mx = std::max(mx, s[j]);
                }
                for (auto& x : s) sum += (x = std::exp(x - mx));
                for (unsigned d = 0; d < FA_VW; d++) {
                    double o = 0;
                    for (unsigned j = 0; j < n; j++) o += s[j] * bf16_to_f32(v[((size_t)j * H + h) * FA_VW + d]);
                    o /= sum;
                    vmax = std::max(vmax, std::fabs(o));
                    const float got = out[(size_t)i * ld_out + h * FA_VW + d];
                    worst = std::max(worst, std::isfinite(got) ? std::fabs(got - o) : 1e30);
                }
                if (h == H - 1)
                    for (unsigned x = H * FA_VW; x < ld_out; x++) untouched &= out[(size_t)i * ld_out + x] == sentinel;
            }
        for (unsigned x = 0; x < ld_out; x++) untouched &= out[(size_t)c.rows * ld_out + x] == sentinel;
        // P is rounded to bf16 (relative 2^-9) before P·V: at most 2^-9 of max |v| (= 1).
        const bool ok = worst < 2.5e-3 && untouched;
        std::printf("mla_flash_bf16 %3u rows after %3u cached keys, %u heads, q scale %.1f: max |out - ref| = %.2e (max |ref| %.3f), other memory %s %s\n", c.rows, c.ctx0, H, c.qscale, worst, vmax,
                    untouched ? "untouched" : "WRITTEN", ok ? "ok" : "FAIL");
        fails += !ok;
    }
    return fails;
}
