// `--load-format dummy` on the device: the same deterministic values as the host generator
// (weft_backend::dummy), written straight into device memory, so a 100 GB model "loads" in
// seconds and CPU and GPU runs of a dummy model see identical weights.

__device__ __forceinline__ float dummy_value(unsigned long long h, unsigned long long i) {
    unsigned long long z = h + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) / 16777216.0f * 2.0f - 1.0f;
}

// Element i of an `n`-element window `cols` wide is stream element base + (i / cols) * stride +
// i % cols: the whole matrix (base 0, stride = cols) or a tensor-parallel rank's rows/columns.
__device__ __forceinline__ unsigned long long dummy_index(i64 i, i64 cols, i64 base, i64 stride) {
    i64 r = i / cols;
    return (unsigned long long)(base + r * stride + (i - r * cols));
}

extern "C" __global__ void dummy_bf16(u16* out, i64 n, i64 cols, i64 base, i64 stride, unsigned long long h, float scale) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16(__fmul_rn(dummy_value(h, dummy_index(i, cols, base, stride)), scale));
}

// e4m3 codes of uniform values in [-448, 448]; the matrix's block scales carry the magnitude.
extern "C" __global__ void dummy_fp8(unsigned char* out, i64 n, i64 cols, i64 base, i64 stride, unsigned long long h) { WEFT_PDL_ENTRY();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = (unsigned char)f32_to_fp8(__fmul_rn(dummy_value(h, dummy_index(i, cols, base, stride)), 448.f));
}
