#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 13
# (results/roofline-h200.md). The tests of per-row second parts in the expert GEMM and of
# f32-weight steps; how many tokens the shared experts run with the routed ones
# (WEFT_CUDA_MOE_SHARED_FUSED, batches 1–64, fused up to 64 tokens against never); greedy with
# and without prompt lookup; then the prefill profile. Output: $OUT/round13.md and the
# profile's files.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
R="$OUT/round13.md"; : > "$R"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$R"
timeout 120 .device/cuda-kernels_moe-test --test-threads 1 prompt_rows moe_block 2>&1 | grep -E "^test |test result|panicked|prompt rows|assert" | tee -a "$R"
timeout 120 .device/cuda-kernels-test --test-threads 1 golden_fixtures_through_cuda_f32 2>&1 | grep -E "^test |test result|panicked|logprob error|worst" | tee -a "$R"
for s in ${FUSED:-64 0}; do
  echo "== WEFT_CUDA_MOE_SHARED_FUSED=$s" | tee -a "$R"
  WEFT_CUDA_MOE_SHARED_FUSED=$s timeout 100 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch 1,2,4,8,16,32,64 --ctx 1024 --prefill 64 --steps 4 2>&1 | grep -E "^\| [0-9]|panicked" | tee -a "$R"
  WEFT_CUDA_MOE_SHARED_FUSED=$s timeout 60 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,4,8,16,32 --ctx 1024 --prefill 64 --steps 4 2>&1 | grep -E "^\| [0-9]|panicked" | tee -a "$R"
done
STEPS=equal EQUAL_MODES="off ngram" OUT=/tmp/spec timeout 150 bash scripts/gpu/spec_bench.sh 2>&1 | grep -E "prompt [0-9]|speculative|rror" | tee -a "$R"
[ "${PROFILE:-1}" = 1 ] && OUT=$OUT NCU_TIMEOUT=${NCU_TIMEOUT:-200} bash scripts/gpu/profile_prefill.sh > "$OUT/profile-log.txt" 2>&1
rm -f "$OUT/ncu-prefill.csv"
