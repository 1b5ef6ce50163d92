#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 21
# (results/roofline-h200.md) — a decoding token's MoE plan made by the block that routed it
# (kernels/moe.cu `plan_one_token`) against the device-wide counter's plan
# (WEFT_CUDA_KERNEL_DEFINES=WEFT_ROUTE_PLAN_COUNTER), and the 64-head MLA kernel on the shared
# tile loader (`mlw_load<32, 256>`, one block-table lookup a tile). PART (space-separated):
# tests — the MoE (MOE_SETS) and step-graph GPU tests, the MLA and golden tests (default and
# WEFT_CUDA_MLA_WGMMA=3);
# bench — mla_bench at 64 × 4096; e2e — Moonlight and the Kimi-K2 slice end to end over a bf16
# cache, the E2E settings alternated ROUNDS times (a layer's query rope and latent store in one
# launch against two: WEFT_CUDA_ROPE_STORE=0); ncu — Nsight device time per kernel at batch 1;
# ab — the 64-head kernel's tile loader variants.
# Output: $OUT/round21.md, $OUT/profile-b1.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round21.md"
P=" ${PART:-tests bench e2e ncu ab} "
OLD=WEFT_CUDA_KERNEL_DEFINES=WEFT_ROUTE_PLAN_COUNTER
# e2e settings (commas become spaces): the defaults, the two rope/store kernels, and both old paths.
E2E=(${E2E:-WEFT_X=1 WEFT_CUDA_ROPE_STORE=0 WEFT_CUDA_ROPE_STORE=0,$OLD})
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
if [[ $P == *" tests "* ]]; then
  for s in ${MOE_SETS-WEFT_X=1 $OLD}; do
    echo "== cuda-kernels_moe-test ($s)" | tee -a "$R"
    env $s timeout 200 .device/cuda-kernels_moe-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  done
  echo "== cuda-step_graphs-test" | tee -a "$R"
  timeout 200 .device/cuda-step_graphs-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  SETS="WEFT_X=0 WEFT_X=1 WEFT_CUDA_MLA_WGMMA=3" PART=tests KTESTS="${KTESTS:-mla_ops_match_cpu mla_attention_head_counts golden}" \
    bash scripts/gpu/round18.sh 2>&1 | grep -v "rel err"
  cat "$OUT/round18.md" >> "$R"; rm -f "$OUT/round18.md"
fi
if [[ $P == *" bench "* ]]; then
  SETS="WEFT_X=1" PART=bench HEADS=${HEADS:-8,16,32,64,128} bash scripts/gpu/round18.sh 2>&1 | grep -v "rel err"
  cat "$OUT/round18.md" >> "$R"; rm -f "$OUT/round18.md"
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${E2E[@]}"; do
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//,/ } timeout 100 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024,4096} --prefill 1024 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//,/ } timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,64 --ctx 1024 --prefill 1024 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
  done
done
[[ $P == *" ncu "* ]] && PART=ncu NCU_BATCHES=${NCU_BATCHES:-1} bash scripts/gpu/round20_profile.sh
# PART ab: mla_bench at 32-128 heads with WEFT_MLW_PER_TOKEN (a lookup per token for every
# tile) and the default, same binary, same machine. Round 21 ran it while the default gave the
# 64-head kernel's 32-token tiles one lookup a tile (2.5 % slower); now both are per token there.
[[ $P == *" ab "* ]] && for r in 1 2; do
  for s in WEFT_CUDA_KERNEL_DEFINES=WEFT_MLW_PER_TOKEN WEFT_X=1; do
    echo "== mla_bench ($s, round $r)" | tee -a "$R"
    env $s timeout 100 .device/mla_bench --batch 64 --ctx 4096 --queries 1 --heads 32,64,128 --kv bf16 2>&1 | grep -E "^\| 64" | grep -v "CUDA cores" | tee -a "$R"
  done
done
true
