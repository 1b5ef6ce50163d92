// Weight-streaming matrix-vector kernels for decode-sized batches (a few rows of activations):
// one sub-group per weight row, 16-byte loads along the row, every activation row multiplied
// with the weights while they are in registers, so each weight byte is read once per call.
// Weights are bf16, or fp8 e4m3 with per-block f32 scales (read as fp8, scaled per 16 values).
// Activations are f32, read through the cache (they are small and shared by every block).
#define GEMV_TB 8

struct WeightRef {
    const void* w;      // bf16 (u16) or fp8 (u8) rows, `cols` contiguous
    const float* sc;    // fp8 only: [ceil(rows/br), sc_cols] scales
    u32 sc_cols, br, bc;
};

__device__ __forceinline__ void bf16x8(uint4 v, float* f) {
    u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(p[i] << 16);
        f[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float dot8(const float* w, const float* x) {
    float4 a = *(const float4*)x, b = *(const float4*)(x + 4);
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

// acc[t] = W[r, :] · X[xrow[t], :] for t < nt (nt <= GEMV_TB); X rows are `xstride` apart
// starting at `x`. Summed over the sub-group: every lane ends with the totals.
template <int FP8>
__device__ __forceinline__ void row_dot(WeightRef W, u32 r, u32 cols, const float* x, i64 xstride, const u32* xrow, u32 nt, float* acc) {
    u32 lane = threadIdx.x % WEFT_WARP;
#pragma unroll
    for (int t = 0; t < GEMV_TB; t++) acc[t] = 0.f;
    if (!FP8) {
        const uint4* row = (const uint4*)((const u16*)W.w + (i64)r * cols);
#pragma unroll 4
        for (u32 c = lane; c < cols / 8; c += WEFT_WARP) {
            float w[8];
            bf16x8(row[c], w);
#pragma unroll
            for (int t = 0; t < GEMV_TB; t++)
                if (t < nt) acc[t] += dot8(w, x + xrow[t] * xstride + c * 8);
        }
    } else {
        const uint4* row = (const uint4*)((const unsigned char*)W.w + (i64)r * cols);
        const float* srow = W.sc + (i64)(r / W.br) * W.sc_cols;
#pragma unroll 2
        for (u32 c = lane; c < cols / 16; c += WEFT_WARP) {
            uint4 v = row[c];
            float s = srow[(c * 16) / W.bc];
            u32 p[4] = {v.x, v.y, v.z, v.w};
            float w[16];
#pragma unroll
            for (int i = 0; i < 16; i++) w[i] = fp8_to_f32((p[i / 4] >> (8 * (i % 4))) & 0xffu) * s;
#pragma unroll
            for (int t = 0; t < GEMV_TB; t++)
                if (t < nt) {
                    const float* xp = x + xrow[t] * xstride + c * 16;
                    acc[t] += dot8(w, xp) + dot8(w + 8, xp + 8);
                }
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_TB; t++) acc[t] = warp_sum(acc[t]);
}

// out[i, r] = W[r, :] · x[i, g(r)] for i < m; rows are grouped `group_rows` per group (heads of
// a per-head linear), group g reads columns g*cols.. of x rows `xstride` wide.
template <int FP8>
__device__ void gemv_body(WeightRef W, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    u32 warps = blockDim.x / WEFT_WARP;
    u32 r = blockIdx.x * warps + threadIdx.x / WEFT_WARP;
    if (r >= rows) return;
    const float* xg = x + (i64)(r / group_rows) * cols;
    for (u32 t0 = 0; t0 < m; t0 += GEMV_TB) {
        u32 idx[GEMV_TB];
#pragma unroll
        for (int t = 0; t < GEMV_TB; t++) idx[t] = t0 + t;
        float acc[GEMV_TB];
        u32 nt = min((u32)GEMV_TB, m - t0);
        row_dot<FP8>(W, r, cols, xg, xstride, idx, nt, acc);
        if (threadIdx.x % WEFT_WARP == 0)
            for (u32 t = 0; t < nt; t++) out[(i64)(t0 + t) * rows + r] = acc[t];
    }
}

extern "C" __global__ void gemv_bf16(const u16* w, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    WeightRef W = {w, 0, 0, 1, 1};
    gemv_body<0>(W, x, out, m, rows, cols, group_rows, xstride);
}

extern "C" __global__ void gemv_fp8(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, const float* x, float* out, u32 m, u32 rows, u32 cols, u32 group_rows, u32 xstride) {
    WeightRef W = {w, sc, sc_cols, br, bc};
    gemv_body<1>(W, x, out, m, rows, cols, group_rows, xstride);
}

// fp8 block-scaled weights to bf16 (for the tensor-core GEMM of large batches).
extern "C" __global__ void dequant_fp8_bf16(const unsigned char* w, const float* sc, u32 sc_cols, u32 br, u32 bc, u16* out, u32 rows, u32 cols) {
    i64 n = (i64)rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        u32 r = (u32)(i / cols), c = (u32)(i % cols);
        out[i] = f32_to_bf16(fp8_to_f32(w[i]) * sc[(i64)(r / br) * sc_cols + c / bc]);
    }
}
