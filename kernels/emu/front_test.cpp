// front_edits + front_topk (kernels/sample.cu) on the CPU emulator against a direct reference
// (sort by value descending, ties by id; log-sum-exp in double): rows with heavy ties, -inf,
// NaN and +inf, fewer finite logits than asked for, k = 1 (the arg-max path), temperatures.
// Exit status: the number of failing cases.
#include "emu.h"
#include "../weft_port.h"
#include "../sample.cu"
#include <random>

int main() {
    std::mt19937 rng(7);
    const unsigned vocab = 3001, rows = 6, threads = 256;
    std::vector<float> x(rows * vocab);
    std::uniform_real_distribution<float> U(-8, 8);
    for (unsigned r = 0; r < rows; r++)
        for (unsigned i = 0; i < vocab; i++) {
            float v = U(rng);
            if (r == 1) v = std::round(v);                         // many exact ties
            if (r == 2 && i % 7 == 0) v = -INFINITY;
            if (r == 2 && i % 11 == 0) v = NAN;
            if (r == 3) v = i < 5 ? float(i % 2) : -INFINITY;     // 5 finite, k asks more
            if (r == 4 && i == 17) v = INFINITY;                 // not finite: never a candidate
            if (r == 5) v = 0.f;                                  // every logit tied
            x[r * vocab + i] = v;
        }
    // Edits: ban, bias, penalise (each token once per row).
    std::vector<unsigned> er{0, 0, 1, 4}, et{5, 9, 3, 100};
    std::vector<float> rep{1.f, 1.3f, 2.f, 1.f}, sub{0.f, 0.25f, 0.f, 0.f}, bias{0.f, 0.5f, -1.f, 0.f};
    std::vector<unsigned> ban{1, 0, 0, 1};
    std::vector<float> ref = x;
    for (size_t e = 0; e < er.size(); e++) {
        float& l = ref[er[e] * vocab + et[e]];
        if (rep[e] != 1.f) l = l > 0.f ? l / rep[e] : l * rep[e];
        l -= sub[e];
        l += bias[e];
        if (ban[e]) l = -INFINITY;
    }
    emu_launch(1, 1, threads, [&] { front_edits(x.data(), er.data(), et.data(), rep.data(), sub.data(), bias.data(), ban.data(), er.size(), vocab); });
    int fails = 0;
    for (size_t i = 0; i < x.size(); i++)
        if (std::memcmp(&x[i], &ref[i], 4)) { std::printf("edit differs at %zu\n", i); fails++; break; }
    std::vector<unsigned> ks{40, 64, 1000, 9, 1, 7};
    std::vector<float> scales{1.f, 2.f, 1.f, 0.5f, 1.f, 1.25f};
    std::vector<unsigned> off;
    unsigned total = 0;
    for (unsigned k : ks) { off.push_back(total); total += 2 + 2 * k; }
    std::vector<unsigned> out(total, 0xdeadbeef);
    emu_launch(rows, 1, threads, [&] { front_topk(x.data(), ks.data(), scales.data(), off.data(), out.data(), vocab); });
    for (unsigned r = 0; r < rows; r++) {
        std::vector<std::pair<float, unsigned>> f;
        double mx = -INFINITY;
        for (unsigned i = 0; i < vocab; i++) {
            float v = x[r * vocab + i] * scales[r];
            if (std::isfinite(v)) { f.push_back({v, i}); mx = std::max(mx, (double)v); }
        }
        std::sort(f.begin(), f.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
        double se = 0;
        for (auto& p : f) se += std::exp(p.first - mx);
        double lse = mx + std::log(se);
        const unsigned* o = &out[off[r]];
        float got_lse;
        std::memcpy(&got_lse, &o[1], 4);
        unsigned k = std::min<unsigned>(ks[r], f.size());
        bool ok = o[0] == f.size() && std::fabs(got_lse - lse) <= 1e-5 * std::max(1.0, std::fabs(lse));
        for (unsigned i = 0; ok && i < k; i++) {
            float v;
            std::memcpy(&v, &o[2 + ks[r] + i], 4);
            ok = o[2 + i] == f[i].second && v == f[i].first;
            if (!ok) std::printf("  row %u candidate %u: got (%u, %g), want (%u, %g)\n", r, i, o[2 + i], v, f[i].second, f[i].first);
        }
        std::printf("front row %u: %u finite, k %u of %u, lse %.6f vs %.6f: %s\n", r, o[0], k, ks[r], got_lse, lse, ok ? "ok" : "FAIL");
        fails += !ok;
    }
    return fails;
}
