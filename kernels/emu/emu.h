// Runs weft's kernels on the CPU for tests on machines without a GPU: the threads of a block
// are fibers on one OS thread, switched only where they must wait for each other
// (__syncthreads, sub-group shuffles); blocks run one after another, and the block's dynamic
// shared memory is filled with NaN before each block — so a kernel that reads shared memory it
// did not write shows NaN here instead of passing by luck on a GPU. Static `__shared__` arrays
// become function statics (one per kernel, shared by the block's threads, since blocks run one
// at a time). Thread block clusters (emu_launch_clusters) run their blocks together, each with
// its own dynamic shared memory, barriers and sub-groups; a cluster barrier
// (emu_cluster_sync) spans them and emu_ld_cluster reads another block's shared memory —
// static `__shared__` arrays would be shared by the cluster's blocks, so cluster kernels use
// dynamic shared memory only. Sub-group shuffles exchange through a barrier per sub-group of `emu_warp` lanes
// (64 by default: AMD's wavefront; 32 for NVIDIA's warp), so every lane of a sub-group must
// reach them, as `__shfl_xor_sync` with a full mask requires on the GPU. A thread that has
// returned counts as arrived at later barriers. The kernels see WEFT_EMU: no inline PTX; the
// tensor cores' mma.sync is emulated (emu_mma_bf16_16816, 32-lane sub-groups only).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <ucontext.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define WEFT_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static
#define WEFT_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(emu_block_smem())
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The fibers of the running block and the scheduler's context. On x86-64 a fiber switch is a
// few instructions (callee-saved registers and the stack pointer); elsewhere ucontext, whose
// swapcontext also saves the signal mask with a system call per switch.
struct EmuFiber {
    std::unique_ptr<char[]> stack;
    bool done = false;
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
};
static constexpr size_t EMU_STACK = 256 << 10;
static std::vector<EmuFiber> emu_fibers;
static unsigned emu_cur;
static const std::function<void()>* emu_body;

#if defined(__x86_64__)
// emu_switch(&save, to): pushes the callee-saved registers, stores the stack pointer in *save,
// and resumes the fiber (or scheduler) whose stack pointer is `to`.
extern "C" void emu_switch(void** save, void* to);
asm(R"(
.text
.p2align 4
.globl emu_switch
.type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");
static void* emu_main_sp;
static void emu_fiber_main();
[[noreturn]] static void emu_fiber_entry() {
    emu_fiber_main();
    void* dead;
    emu_switch(&dead, emu_main_sp);
    __builtin_unreachable();
}
// A new fiber's stack: six zero registers for emu_switch to pop, then emu_fiber_entry as the
// return address, placed so the entry sees the stack alignment of a called function.
inline void emu_fiber_start(EmuFiber& f) {
    auto top = reinterpret_cast<uintptr_t>(f.stack.get() + EMU_STACK) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top) - 2;  // entry's frame: rsp % 16 == 8 after ret
    *sp = reinterpret_cast<void*>(&emu_fiber_entry);
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    f.sp = sp;
}
inline void emu_yield() { emu_switch(&emu_fibers[emu_cur].sp, emu_main_sp); }
inline void emu_resume(unsigned t) { emu_switch(&emu_main_sp, emu_fibers[t].sp); }
#else
static ucontext_t emu_main;
static void emu_fiber_main();
inline void emu_fiber_start(EmuFiber& f) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = EMU_STACK;
    f.ctx.uc_link = &emu_main;
    makecontext(&f.ctx, emu_fiber_main, 0);
}
inline void emu_yield() { swapcontext(&emu_fibers[emu_cur].ctx, &emu_main); }
inline void emu_resume(unsigned t) { swapcontext(&emu_main, &emu_fibers[t].ctx); }
#endif

// A barrier among n fibers (a block, or a sub-group): waits until every one of them that has
// not returned has arrived.
struct EmuBarrier {
    unsigned n = 0, arrived = 0, gen = 0, exited = 0;
    void wait() {
        unsigned g = gen;
        arrived++;
        while (gen == g) {
            if (arrived + exited >= n) {
                arrived = 0;
                gen++;
                break;
            }
            emu_yield();
        }
    }
};
// Threads per block; fibers are numbered across a cluster's blocks (emu_cur), block by block.
static unsigned emu_bthreads = 1;
static std::vector<EmuBarrier> emu_block_barriers;
static EmuBarrier emu_cluster_barrier;
inline void __syncthreads() { emu_block_barriers[emu_cur / emu_bthreads].wait(); }
inline void emu_cluster_sync() { emu_cluster_barrier.wait(); }
// A wait that cannot end (a schedule bug in a kernel) aborts instead of hanging the test.
inline void emu_spin(unsigned long long& n, const char* what) {
    if (++n > (1ull << 22)) {
        std::fprintf(stderr, "emulated %s: waited forever\n", what);
        std::abort();
    }
    emu_yield();
}
// Named barriers (bar.sync / bar.arrive id, n: n threads arrive, those that sync wait), 16 a
// block, reset with the block's barriers.
struct EmuNamed { unsigned count = 0, gen = 0; };
static constexpr unsigned EMU_MAX_CLUSTER = 16, EMU_BURST = 16;  // blocks of a cluster run together
static EmuNamed emu_named[EMU_MAX_CLUSTER][16];
inline void emu_bar_arrive(unsigned id, unsigned n) {
    EmuNamed& b = emu_named[emu_cur / emu_bthreads][id];
    if (++b.count == n) b.count = 0, b.gen++;
}
inline void emu_bar_sync(unsigned id, unsigned n) {
    EmuNamed& b = emu_named[emu_cur / emu_bthreads][id];
    const unsigned g = b.gen;
    emu_bar_arrive(id, n);
    for (unsigned long long k = 0; b.gen == g;) emu_spin(k, "named barrier");
}
// mbarriers (8 bytes of shared memory): the expected arrivals, then the pending ones with the
// phase's parity in the top bit. The emulated cp.async has landed when issued, so its tracked
// arrival (cp.async.mbarrier.arrive.noinc) is an arrival.
inline void emu_mbar_init(unsigned long long* b, unsigned n) {
    unsigned* w = (unsigned*)b;
    w[0] = n;
    w[1] = n;
}
inline void emu_mbar_arrive(unsigned long long* b) {
    unsigned* w = (unsigned*)b;
    const unsigned pend = (w[1] & 0x7fffffffu) - 1, ph = w[1] >> 31;
    w[1] = pend ? (ph << 31 | pend) : ((ph ^ 1u) << 31 | w[0]);
}
// Waits until the phase of parity `parity` has completed (the current phase's parity differs).
inline void emu_mbar_wait(unsigned long long* b, unsigned parity) {
    const unsigned* w = (const unsigned*)b;
    for (unsigned long long k = 0; (w[1] >> 31) == parity;) emu_spin(k, "mbarrier");
}
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
    float old = *p, want;
    do { want = old + v; } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// Dynamic shared memory (WEFT_DYNAMIC_SHARED in a kernel points into this array): 256 KB a
// block, for up to EMU_MAX_CLUSTER blocks of a cluster.
static constexpr unsigned EMU_SMEM_FLOATS = 1 << 16;
alignas(1024) float emu_smem[EMU_MAX_CLUSTER * EMU_SMEM_FLOATS];
inline float* emu_block_smem() { return emu_smem + (emu_cur / emu_bthreads) * EMU_SMEM_FLOATS; }
// The float at p's offset (p in this block's shared memory) in cluster block `rank`'s.
inline float emu_ld_cluster(const float* p, unsigned rank) { return emu_smem[rank * EMU_SMEM_FLOATS + (p - emu_block_smem())]; }

// Sub-group width and the shuffle exchange: each lane posts its value, the sub-group meets at
// its barrier, each lane reads its partner's. Two slot sets, used alternately: a lane can only
// post into a set again after the next barrier, which every lane passes after its read.
unsigned emu_warp = 64;
static std::vector<float> emu_lanes[2];
static std::vector<unsigned> emu_lane_turn;
static std::vector<EmuBarrier> emu_warp_barriers;
inline float emu_shfl_xor(float v, int o) {
    unsigned t = threadIdx.x, f0 = emu_cur - t, base = t / emu_warp * emu_warp, src = base + ((t - base) ^ (unsigned)o);
    std::vector<float>& slots = emu_lanes[emu_lane_turn[emu_cur]++ & 1];
    slots[emu_cur] = v;
    emu_warp_barriers[emu_cur / emu_warp].wait();
    return src < blockDim.x ? slots[f0 + src] : v;
}

// mma.sync m16n8k16 (bf16 inputs, f32 accumulation) of a 32-lane warp (emu_warp must be 32):
// every lane posts its six fragment registers, the warp meets at its barrier, and each lane
// computes its four outputs from the posted fragments (layout as in kernels/mma.cu). Shares the
// shuffles' alternation of slot sets.
static unsigned emu_frag[2][4096][6];
inline float emu_bf16(unsigned r, int half) { return __uint_as_float(half ? (r & 0xffff0000u) : (r << 16)); }
// Element (r, k) of a 16 x 16 A operand in mma.sync's fragment layout, from the fragments the
// warp whose first thread is `base` posted (registers 0..3 of each slot).
inline float emu_frag_a(unsigned (*slots)[6], unsigned base, unsigned r, unsigned k) {
    return emu_bf16(slots[base + (r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2);
}
inline void emu_mma_bf16_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    if (emu_warp != 32) { std::fprintf(stderr, "emulated mma.sync needs 32-lane sub-groups\n"); std::abort(); }
    unsigned t = emu_cur, base = t / 32 * 32, lane = t - base, g = lane / 4, q = lane % 4;
    unsigned (*slots)[6] = emu_frag[emu_lane_turn[t]++ & 1];
    const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
    std::memcpy(slots[t], mine, sizeof mine);
    emu_warp_barriers[t / emu_warp].wait();
    auto B = [&](unsigned k, unsigned n) { return emu_bf16(slots[base + n * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2); };
    for (unsigned i = 0; i < 4; i++) {
        unsigned r = g + 8 * (i / 2), n = 2 * q + i % 2;
        float acc = d[i];
        for (unsigned k = 0; k < 16; k++) acc += emu_frag_a(slots, base, r, k) * B(k, n);
        d[i] = acc;
    }
}

// wgmma.mma_async m64nNk16 with both operands in shared memory (kernels/moe_wgmma.cu's
// m64n128 GEMM, kernels/mla_wgmma.cu's m64n32 scores and m64n64 values): each lane of warp w (of
// its 4-warp group) computes its N / 2 outputs — rows 16w + g, 16w + g + 8, columns 8j + 2t,
// 8j + 2t + 1 — from A (64 rows) and B (N rows) read through their descriptors: here the
// address of a 1024-aligned operand of 128-byte rows whose 16-byte chunks sit at chunk ^ (row %
// 8), the hardware's 128-byte swizzle. K-major (the default): element (row, k) in row `row`,
// 8-row groups 1024 bytes apart; M- or N-major (ta / tb = 1, the transposed operand): element
// (m, k) at k / 8 · 1024 + k % 8 · 128 + 2m — the descriptor's stride of 1024 between 8-row k
// groups. Data written before the block's last barrier is what it reads, as on the GPU.
inline float emu_swizzled_bf16(unsigned long long desc, unsigned row, unsigned k) {
    uintptr_t a = (uintptr_t)desc + (row / 8) * 1024 + (row % 8) * 128 + 2 * k;
    a ^= ((a >> 7) & 7) << 4;
    return __uint_as_float((unsigned)*(const uint16_t*)a << 16);
}
// M- or N-major operands wider than 64 (m64n256's B) continue in 64-column chunks EMU_MN_LBO
// bytes apart: the descriptors' leading offset, mla_wgmma.cu's wg_desc_mn (one 64-token tile
// chunk, 8 KB).
static constexpr unsigned EMU_MN_LBO = 64 * 128;
inline float emu_swizzled_mn_bf16(unsigned long long desc, unsigned m, unsigned k) {
    uintptr_t a = (uintptr_t)desc + (m / 64) * EMU_MN_LBO + (k / 8) * 1024 + (k % 8) * 128 + 2 * (m % 64);
    a ^= ((a >> 7) & 7) << 4;
    return __uint_as_float((unsigned)*(const uint16_t*)a << 16);
}
template <int N>
inline void emu_wgmma_ss(float (&d)[N / 2], unsigned long long da, unsigned long long db, int ta, int tb) {
    unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, q = lane % 4;
    for (unsigned j = 0; j < N / 8; j++)
        for (unsigned i = 0; i < 4; i++) {
            unsigned r = 16 * w + g + 8 * (i / 2), n = 8 * j + 2 * q + i % 2;
            float acc = d[4 * j + i];
            for (unsigned k = 0; k < 16; k++)
                acc += (ta ? emu_swizzled_mn_bf16(da, r, k) : emu_swizzled_bf16(da, r, k)) * (tb ? emu_swizzled_mn_bf16(db, n, k) : emu_swizzled_bf16(db, n, k));
            d[4 * j + i] = acc;
        }
}

// wgmma.mma_async m64nNk16 with A in registers (kernels/mla_wgmma.cu's and mla_pair.cu's
// products): rows 16w..16w + 15 of A are warp w's fragments (mma.sync's A layout), so a warp's
// outputs need only its own lanes' registers — posted and met at the warp's barrier as in
// emu_mma_bf16_16816; B (16 x N) N-major (tb = 1: element (k, n) at k / 8 · 1024 + k % 8 · 128 +
// 2n, 128-byte swizzle) or K-major (tb = 0).
template <int N>
inline void emu_wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db, int tb) {
    if (emu_warp != 32) { std::fprintf(stderr, "emulated wgmma needs 32-lane sub-groups\n"); std::abort(); }
    unsigned t = emu_cur, base = t / 32 * 32, lane = t - base, g = lane / 4, q = lane % 4;
    unsigned (*slots)[6] = emu_frag[emu_lane_turn[t]++ & 1];
    std::memcpy(slots[t], a, 4 * sizeof(unsigned));
    emu_warp_barriers[t / emu_warp].wait();
    for (unsigned j = 0; j < N / 8; j++)
        for (unsigned i = 0; i < 4; i++) {
            unsigned r = g + 8 * (i / 2), n = 8 * j + 2 * q + i % 2;
            float acc = d[4 * j + i];
            for (unsigned k = 0; k < 16; k++) acc += emu_frag_a(slots, base, r, k) * (tb ? emu_swizzled_mn_bf16(db, n, k) : emu_swizzled_bf16(db, n, k));
            d[4 * j + i] = acc;
        }
}

static const void* emu_ldsm_rows[2][4096];
// ldmatrix of a 32-lane warp: every lane posts its row address and the warp meets; returns the
// posted addresses (indexed by thread), with this lane's warp base, g = lane / 4 and q = lane % 4.
inline const void** emu_ldsm_exchange(const void* row, unsigned& base, unsigned& g, unsigned& q) {
    if (emu_warp != 32) { std::fprintf(stderr, "emulated ldmatrix needs 32-lane sub-groups\n"); std::abort(); }
    unsigned t = emu_cur, lane = t % 32;
    base = t - lane;
    g = lane / 4;
    q = lane % 4;
    const void** slots = emu_ldsm_rows[emu_lane_turn[t]++ & 1];
    slots[t] = row;
    emu_warp_barriers[t / emu_warp].wait();
    return slots;
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane (g, t) reads column g of rows 2t and
// 2t + 1 of each block.
inline void emu_ldsm_x4_trans(unsigned (&r)[4], const void* row) {
    unsigned base, g, q;
    const void** slots = emu_ldsm_exchange(row, base, g, q);
    for (unsigned i = 0; i < 4; i++) {
        const uint16_t* r0 = (const uint16_t*)slots[base + 8 * i + 2 * q];
        const uint16_t* r1 = (const uint16_t*)slots[base + 8 * i + 2 * q + 1];
        r[i] = (unsigned)r0[g] | ((unsigned)r1[g] << 16);
    }
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 (not transposed): lane (g, t) reads elements 2t and
// 2t + 1 of row g of each block, the rows' addresses posted by lanes 8i..8i + 7 for block i.
inline void emu_ldsm_x4(unsigned (&r)[4], const void* row) {
    unsigned base, g, q;
    const void** slots = emu_ldsm_exchange(row, base, g, q);
    for (unsigned i = 0; i < 4; i++) {
        const uint16_t* rp = (const uint16_t*)slots[base + 8 * i + g];
        r[i] = (unsigned)rp[2 * q] | ((unsigned)rp[2 * q + 1] << 16);
    }
}

static void emu_fiber_main() {
    (*emu_body)();
    emu_fibers[emu_cur].done = true;  // then back to the scheduler
    emu_block_barriers[emu_cur / emu_bthreads].exited++;
    emu_cluster_barrier.exited++;
    emu_warp_barriers[emu_cur / emu_warp].exited++;
}

// A grid of clusters of `cl` blocks along y (gy a multiple of cl), cluster after cluster.
template <class F> void emu_launch_clusters(unsigned gx, unsigned gy, unsigned gz, unsigned threads, unsigned cl, F kernel) {
    if (cl < 1 || cl > EMU_MAX_CLUSTER || gy % cl != 0 || (cl > 1 && threads % emu_warp != 0) || cl * threads > 4096) {
        std::fprintf(stderr, "emulated clusters: %u blocks of %u threads along %u\n", cl, threads, gy);
        std::abort();
    }
    gridDim = {gx, gy, gz};
    blockDim = {threads, 1, 1};
    emu_bthreads = threads;
    const unsigned fibers = cl * threads, wpb = (threads + emu_warp - 1) / emu_warp;
    const std::function<void()> body = kernel;
    emu_body = &body;
    if (emu_fibers.size() < fibers) emu_fibers.resize(fibers);
    emu_lanes[0].assign(fibers, 0.f);
    emu_lanes[1].assign(fibers, 0.f);
    emu_warp_barriers.assign(cl * wpb, EmuBarrier{});
    emu_block_barriers.assign(cl, EmuBarrier{});
    for (unsigned bz = 0; bz < gz; bz++)
        for (unsigned by = 0; by < gy; by += cl)
            for (unsigned bx = 0; bx < gx; bx++) {
                for (unsigned b = 0; b < cl; b++) {
                    for (unsigned w = 0; w < wpb; w++) emu_warp_barriers[b * wpb + w] = EmuBarrier{std::min(emu_warp, threads - w * emu_warp)};
                    emu_block_barriers[b] = EmuBarrier{threads};
                    for (EmuNamed& nb : emu_named[b]) nb = EmuNamed{};
                }
                emu_cluster_barrier = EmuBarrier{fibers};
                std::fill(emu_smem, emu_smem + cl * EMU_SMEM_FLOATS, NAN);
                emu_lane_turn.assign(fibers, 0);
                for (unsigned t = 0; t < fibers; t++) {
                    EmuFiber& f = emu_fibers[t];
                    if (!f.stack) f.stack.reset(new char[EMU_STACK]);
                    f.done = false;
                    emu_fiber_start(f);
                }
                // Round robin until every fiber has returned; a fiber runs until it waits. A
                // cluster's blocks take turns of EMU_BURST rounds, the last block first, so that
                // they drift apart as a GPU's blocks do: a block that reads what another writes
                // without waiting for it reads NaN here instead of passing in lockstep.
                for (bool left = true; left;) {
                    left = false;
                    for (unsigned b = cl; b-- > 0;)
                        for (unsigned r = 0; r < (cl > 1 ? EMU_BURST : 1u); r++)
                            for (unsigned t = b * threads; t < (b + 1) * threads; t++) {
                                if (emu_fibers[t].done) continue;
                                emu_cur = t;
                                threadIdx = {t % threads, 0, 0};
                                blockIdx = {bx, by + t / threads, bz};
                                emu_resume(t);
                                left |= !emu_fibers[t].done;
                            }
                }
            }
}
template <class F> void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned threads, F kernel) { emu_launch_clusters(gx, gy, gz, threads, 1, kernel); }
template <class F> void emu_launch(unsigned gx, unsigned gy, unsigned threads, F kernel) { emu_launch(gx, gy, 1, threads, kernel); }
