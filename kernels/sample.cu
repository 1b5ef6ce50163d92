// The sampling front end on the device (weft_backend::front is the reference and documents the
// math): per-token edits of the logits rows, then per row the top-k finite logits after the
// temperature scale (value descending, ties by lower id) and the log-sum-exp over the row, so
// that only k candidates cross to the host instead of the whole vocabulary.
//
// Selection is a radix select over 64-bit keys (order-preserving float bits << 32 | ~id): every
// key is distinct, so the k largest keys are exactly the reference's candidates, ties
// included. Digits of 8 bits from the top; a pass stops as soon as its boundary bin holds
// exactly the elements still needed. Only block-level shared memory and atomics: nothing
// assumes a sub-group width.
#define FRONT_MAX_K 1024
#define FRONT_COPIES 8

// One thread per edit; at most one edit per (row, token), so no two threads share an element.
// The same operations, in the same order, as front::edit.
extern "C" __global__ void front_edits(float* logits, const u32* row, const u32* tok, const float* rep, const float* sub, const float* bias, const u32* banned, u32 n, u32 vocab) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* p = logits + (u64)row[i] * vocab + tok[i];
    float l = *p;
    if (rep[i] != 1.f) l = l > 0.f ? l / rep[i] : l * rep[i];
    l -= sub[i];
    l += bias[i];
    *p = banned[i] ? -WEFT_INF : l;
}

__device__ __forceinline__ bool front_finite(float v) { return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }
// Float bits to an unsigned key with the same order as total_cmp.
__device__ __forceinline__ u32 front_ord(float v) {
    u32 u = __float_as_uint(v);
    return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}
__device__ __forceinline__ u32 front_unord(u32 o) { return o ^ ((o >> 31) ? 0x80000000u : 0xffffffffu); }
__device__ __forceinline__ u64 front_key(float v, u32 id) { return ((u64)front_ord(v) << 32) | (u64)(~id); }

// f(i, x[i] * s) for this thread's share of the row. Each pass over the row is bound by how
// many loads a thread has in flight (one block, one SM): rows of whole float4s are read 4 × 4
// values at a time, issued before any is used.
template <typename F>
__device__ __forceinline__ void front_each(const float* x, u32 vocab, float s, F f) {
    const u32 tid = threadIdx.x, nt = blockDim.x;
    if (vocab % 4 == 0 && ((u64)x) % 16 == 0) {
        const float4* x4 = (const float4*)x;
        const u32 n4 = vocab / 4;
        for (u32 base = 0; base < n4; base += 4 * nt) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                u32 j = base + u * nt + tid;
                v[u] = j < n4 ? x4[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                u32 j = base + u * nt + tid;
                if (j < n4) {
                    f(4 * j, v[u].x * s);
                    f(4 * j + 1, v[u].y * s);
                    f(4 * j + 2, v[u].z * s);
                    f(4 * j + 3, v[u].w * s);
                }
            }
        }
    } else {
        for (u32 i = tid; i < vocab; i += nt) f(i, x[i] * s);
    }
}

// One block per row (blockDim a power of two, at most FRONT_MAX_K). Row r's answer goes to
// out + out_off[r]: [finite count, log-sum-exp bits, ks[r] ids, ks[r] logit bits], of which
// the first min(ks[r], finite) ids and logits are written. ks[r] = 0 writes the two stats.
// Dynamic shared memory: FRONT_MAX_K u64 keys, FRONT_COPIES * 256 u32 bins, blockDim floats,
// 4 u32 scalars.
extern "C" __global__ void front_topk(const float* logits, const u32* ks, const float* scales, const u32* out_off, u32* out, u32 vocab) {
    WEFT_DYNAMIC_SHARED(float, smem);
    u64* keys = (u64*)smem;
    u32* hist = (u32*)(smem + 2 * FRONT_MAX_K);
    float* red = smem + 2 * FRONT_MAX_K + FRONT_COPIES * 256;
    u32* sc = (u32*)(red + blockDim.x);
    const u32 tid = threadIdx.x, nt = blockDim.x;
    const float* x = logits + (u64)blockIdx.x * vocab;
    const float s = scales[blockIdx.x];
    u32* o = out + out_off[blockIdx.x];

    // Max, sum of exponentials (online, rescaled when the max grows) and count of finite logits.
    float m = -WEFT_INF, sum = 0.f, cnt = 0.f;
    front_each(x, vocab, s, [&](u32, float v) {
        if (!front_finite(v)) return;
        cnt += 1.f;
        if (v > m) {
            sum = sum * expf(m - v) + 1.f;
            m = v;
        } else {
            sum += expf(v - m);
        }
    });
    const float mx = block_max(m, red);
    const float total = block_sum(m == -WEFT_INF ? 0.f : sum * expf(m - mx), red);
    const u32 finite = (u32)(block_sum(cnt, red) + 0.5f);
    const u32 kr = ks[blockIdx.x], k = min(kr, finite);
    if (tid == 0) {
        o[0] = finite;
        o[1] = __float_as_uint(finite ? mx + logf(total) : -WEFT_INF);
    }
    if (k == 0) return;

    u64 prefix = 0, mask = 0;
    if (k == 1) {
        // Greedy: the largest key is an arg-max, one pass.
        u64 best = 0;
        front_each(x, vocab, s, [&](u32 i, float v) {
            if (!front_finite(v)) return;
            u64 ck = front_key(v, i);
            best = ck > best ? ck : best;
        });
        keys[tid] = best;
        __syncthreads();
        for (u32 st = nt / 2; st > 0; st >>= 1) {
            if (tid < st && keys[tid + st] > keys[tid]) keys[tid] = keys[tid + st];
            __syncthreads();
        }
        prefix = keys[0];
        mask = ~0ull;
        __syncthreads();
    } else {
        u32 rem = k;
        for (int shift = 56;; shift -= 8) {
            for (u32 i = tid; i < FRONT_COPIES * 256; i += nt) hist[i] = 0;
            __syncthreads();
            u32* h = hist + (tid % FRONT_COPIES) * 256;
            front_each(x, vocab, s, [&](u32 i, float v) {
                if (!front_finite(v)) return;
                u64 ck = front_key(v, i);
                if ((ck & mask) == prefix) atomicAdd(&h[(u32)(ck >> shift) & 255u], 1u);
            });
            __syncthreads();
            for (u32 b = tid; b < 256; b += nt) {
                u32 t = 0;
                for (u32 c = 0; c < FRONT_COPIES; c++) t += hist[c * 256 + b];
                hist[b] = t;
            }
            __syncthreads();
            if (tid == 0) {
                // From the highest bin down: the bin holding the rem-th largest matching key.
                u32 b = 255, c = hist[255];
                while (c < rem && b > 0) {
                    rem -= c;
                    c = hist[--b];
                }
                sc[0] = b;
                sc[1] = rem;
                sc[2] = c == rem;
            }
            __syncthreads();
            const u32 b = sc[0];
            const bool done = sc[2] || shift == 0;
            rem = sc[1];
            prefix |= (u64)b << shift;
            mask |= 255ull << shift;
            if (done) break;
        }
    }

    // Every key whose top bits exceed or equal the prefix: exactly k of them.
    if (tid == 0) sc[3] = 0;
    __syncthreads();
    front_each(x, vocab, s, [&](u32 i, float v) {
        if (!front_finite(v)) return;
        u64 ck = front_key(v, i);
        if ((ck & mask) >= prefix) {
            u32 slot = atomicAdd(&sc[3], 1u);
            if (slot < FRONT_MAX_K) keys[slot] = ck;
        }
    });
    __syncthreads();
    // Bitonic sort, descending, over the next power of two (padding keys are 0, below any
    // real key: a finite float's key is never 0).
    u32 p2 = 1;
    while (p2 < k) p2 <<= 1;
    for (u32 i = k + tid; i < p2; i += nt) keys[i] = 0;
    __syncthreads();
    for (u32 size = 2; size <= p2; size <<= 1) {
        for (u32 stride = size / 2; stride > 0; stride >>= 1) {
            for (u32 i = tid; i < p2; i += nt) {
                u32 j = i ^ stride;
                if (j > i) {
                    u64 a = keys[i], c = keys[j];
                    if ((i & size) == 0 ? a < c : a > c) {
                        keys[i] = c;
                        keys[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (u32 i = tid; i < k; i += nt) {
        u64 ck = keys[i];
        o[2 + i] = ~(u32)ck;
        o[2 + kr + i] = front_unord((u32)(ck >> 32));
    }
}
