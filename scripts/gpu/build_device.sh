#!/usr/bin/env bash
# On the Rust (CPU) machine: builds what the GPU machine runs and puts it, stripped, in .device/
# (git-ignored; pass it as `carry`): the CUDA kernel (dense/MLA and MoE) and step-graph test binaries, `weft`, `gpu_bench` and
# `roofline`. The GPU machine has CUDA but no Rust toolchain; the binaries load libcuda, NVRTC
# and cuBLAS at run time. Then, there: `bash scripts/gpu/perf_cuda.sh` (or check_cuda.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device
cargo build --release -p weft --bin weft
cargo build --release -p weft-cuda --example gpu_bench --example roofline --example mla_bench --example linear_bench
for t in kernels kernels_moe step_graphs tensor_parallel; do
    test_bin=$(cargo test -p weft-cuda --test $t --no-run --message-format=json 2>/dev/null | T=$t python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["T"] and m.get("executable"):
        print(m["executable"])')
    cp "$test_bin" .device/cuda-$t-test
done
cp target/release/weft target/release/examples/gpu_bench target/release/examples/roofline target/release/examples/mla_bench target/release/examples/linear_bench .device/
strip .device/cuda-*-test .device/weft .device/gpu_bench .device/roofline .device/mla_bench .device/linear_bench
du -sh .device
