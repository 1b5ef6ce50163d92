#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 23
# (results/roofline-h200.md) — stacked two-part GEMM halves added by their consumers
# (runtime/backend-cuda/src/halves.rs, linear_add_rms_norm; WEFT_CUDA_HALVES=0 the ops apart)
# and the per-head matrices' 64-row pass (WEFT_CUDA_MMA_HEADS_MAX_M=32: cuBLAS), settings
# alternated in one binary. PART (space-separated): tests — the MLA, golden and
# dense GPU tests (KTESTS), the MoE and step-graph ones under each MOE_SETS setting; e2e — Moonlight and the Kimi-K2 slice end
# to end over a bf16 cache (MODELS: moon, kimi), the E2E settings (semicolons become spaces)
# alternated ROUNDS times, at BATCH x CTX (and PREFILL).
# Output: $OUT/round23.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round23.md"
P=" ${PART:-tests e2e} "
E2E=(${E2E:-WEFT_X=1 WEFT_CUDA_HALVES=0})
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
if [[ $P == *" tests "* ]]; then
  echo "== cuda-kernels-test" | tee -a "$R"
  timeout 300 .device/cuda-kernels-test --test-threads 1 ${KTESTS:-mla_ops_match_cpu golden dense_ops} 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  for s in ${MOE_SETS-WEFT_X=1}; do
    echo "== cuda-kernels_moe-test ($s)" | tee -a "$R"
    env ${s//;/ } timeout 200 .device/cuda-kernels_moe-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
    echo "== cuda-step_graphs-test ($s)" | tee -a "$R"
    env ${s//;/ } timeout 200 .device/cuda-step_graphs-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  done
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${E2E[@]}"; do
    [[ " ${MODELS:-moon kimi} " == *" moon "* ]] && echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R" &&
    env ${s//;/ } timeout 100 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-48,64} --ctx ${CTX:-1024,4096} --prefill ${PREFILL:-16} --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | grep -v "^| 16 " | tee -a "$R"
    [[ " ${MODELS:-moon kimi} " == *" kimi "* ]] && echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R" &&
    env ${s//;/ } timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch ${KBATCH:-48,64} --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | grep -v "^| 16 " | tee -a "$R"
  done
done
true
