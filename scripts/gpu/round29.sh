#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 29
# (results/roofline-h200.md) — fewer dependent launches a decoding layer: the queries' W_UK
# product beside their rope and the latent store (rope_store_absorb_*;
# WEFT_CUDA_MLA_ABSORB_FUSED, rows), MLA's split merge inside W_UV's launch (mla_uv_merge_*;
# WEFT_CUDA_MLA_UV_MERGE), and three last-block fusions — the router with the routing
# (moe_router_route_plan; WEFT_CUDA_MOE_ROUTER_FUSED), a single token's down products with their
# combine (moe_down_combine_*; WEFT_CUDA_MOE_DOWN_COMBINE), o_proj with the post-attention norm
# (gemv_add_rms_norm_*; WEFT_CUDA_GEMV_NORM_FUSED) — each against the ops apart and all five apart
# ($OFF), same binary. Run 1 was a build of 3312365, where all five were on by default (WEFT_X=1
# meant that); now only the first two are, the last three measured slower. PART
# (space-separated): tests — the step-graph test, the golden fixtures, the MoE kernel tests;
# e2e — Moonlight (BATCH × CTX) and, in round 1, the Kimi-K2 slice end to end over a bf16 cache,
# the SETS (commas become spaces; later rounds only the default and $OFF) alternated ROUNDS
# times; trace — the kernel trace (WEFT_TRACE, `roofline --trace`) of a replayed step, Moonlight
# at batch 1 (and TRACE_SETS), with TRACE_KIMI the Kimi-K2 slice too. Output: $OUT/round29.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round29.md"
P=" ${PART:-tests e2e trace} "
OFF=WEFT_CUDA_MOE_ROUTER_FUSED=0,WEFT_CUDA_MLA_UV_MERGE=0,WEFT_CUDA_MOE_DOWN_COMBINE=0,WEFT_CUDA_MLA_ABSORB_FUSED=0,WEFT_CUDA_GEMV_NORM_FUSED=0
# Round 1 every set; later rounds (and the Kimi-K2 slice) the default and everything apart.
SETS=(${SETS:-WEFT_X=1 $OFF WEFT_CUDA_MOE_ROUTER_FUSED=0 WEFT_CUDA_MLA_UV_MERGE=0 WEFT_CUDA_MOE_DOWN_COMBINE=0 WEFT_CUDA_MLA_ABSORB_FUSED=0 WEFT_CUDA_GEMV_NORM_FUSED=0 WEFT_CUDA_MOE_ROUTER_FUSED=8,WEFT_CUDA_MLA_UV_MERGE=8,WEFT_CUDA_MLA_ABSORB_FUSED=8,WEFT_CUDA_GEMV_NORM_FUSED=8})
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
if [[ $P == *" tests "* ]]; then
  for t in "step_graphs" "kernels golden" "kernels_moe"; do
    echo "== cuda-$t-test" | tee -a "$R"
    timeout 200 .device/cuda-${t% *}-test --test-threads 1 $([[ $t == *" "* ]] && echo ${t#* }) 2>&1 | grep -E "^test |test result|panicked|assert" | cut -c1-400 | tee -a "$R"
  done
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    [[ $r != 1 && $s != WEFT_X=1 && $s != $OFF ]] && continue
    t0=$(date +%s)
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//,/ } timeout 120 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    if [[ $r == 1 && ( $s == WEFT_X=1 || $s == $OFF ) ]]; then
      echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
      env ${s//,/ } timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,64 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    fi
    echo "(took $(( $(date +%s) - t0 )) s)" | tee -a "$R"
  done
done
[[ $P == *" trace "* ]] && {
  for s in WEFT_X=1 ${TRACE_SETS:-}; do
    echo "== moonlight bf16 cache, traced (WEFT_TRACE; $s)" | tee -a "$R"
    env ${s//,/ } WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE timeout 150 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${TRACE_BATCH:-1} --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
  done
  [[ -n ${TRACE_KIMI:-} ]] && {
    echo "== kimi-k2 slice bf16 cache, traced (WEFT_TRACE)" | tee -a "$R"
    WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
  }
}
echo "(script took $SECONDS s)" | tee -a "$R"
true
