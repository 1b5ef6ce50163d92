// C = alpha·op(A)·op(B) + beta·C, strided batched, column-major with cuBLAS's conventions
// (op = transpose when ta/tb): the GEMM of backends without a vendor BLAS binding (HIP: Debian's
// ROCm has no hipBLAS). A and B are both bf16 (`bf16` = 1) or both f32; C and accumulation are
// f32. One 256-thread block per 16×16 tile of C (blockIdx.z: batch), 16-deep k steps through
// shared memory; only block-level shared memory, so any sub-group width runs it.
#define GEMM_T 16

__device__ __forceinline__ float gemm_load(const void* p, i64 i, int bf16) {
    return bf16 ? bf16_to_f32(((const u16*)p)[i]) : ((const float*)p)[i];
}

extern "C" __global__ void gemm_strided(int ta, int tb, int bf16, u32 m, u32 n, u32 k, float alpha, const void* a, u32 lda, i64 sa, const void* b, u32 ldb, i64 sb, float beta, float* c, u32 ldc, i64 sc) { WEFT_PDL_ENTRY();
    __shared__ float as[GEMM_T][GEMM_T + 1], bs[GEMM_T][GEMM_T + 1];
    const u32 tx = threadIdx.x % GEMM_T, ty = threadIdx.x / GEMM_T;
    const u32 i = blockIdx.x * GEMM_T + tx, j = blockIdx.y * GEMM_T + ty;
    const i64 z = blockIdx.z;
    float acc = 0.f;
    for (u32 p0 = 0; p0 < k; p0 += GEMM_T) {
        // as[p][i]: op(A)(i, p0 + p); bs[p][j]: op(B)(p0 + p, j). Thread (tx, ty) loads
        // op(A)(row tile + tx, p0 + ty) and op(B)(p0 + tx, column tile + ty).
        u32 ar = blockIdx.x * GEMM_T + tx, ap = p0 + ty;
        float av = 0.f;
        if (ar < m && ap < k) av = gemm_load(a, z * sa + (ta ? (i64)ap + (i64)ar * lda : (i64)ar + (i64)ap * lda), bf16);
        as[ty][tx] = av;
        u32 bp = p0 + tx, bc = blockIdx.y * GEMM_T + ty;
        float bv = 0.f;
        if (bp < k && bc < n) bv = gemm_load(b, z * sb + (tb ? (i64)bc + (i64)bp * ldb : (i64)bp + (i64)bc * ldb), bf16);
        bs[ty][tx] = bv;
        __syncthreads();
        for (u32 p = 0; p < GEMM_T; p++) acc += as[p][tx] * bs[ty][p];
        __syncthreads();
    }
    if (i < m && j < n) {
        float* out = c + z * sc + (i64)i + (i64)j * ldc;
        *out = beta == 0.f ? alpha * acc : alpha * acc + beta * *out;
    }
}
