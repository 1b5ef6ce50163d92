#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/, built from commit
# 5dea962 — the code was reverted after it, since it measured slower): round 28
# (results/roofline-h200.md) — the weights a layer reads after its attention (o_proj, then the
# shared experts' or dense MLP's gate|up and down) moved towards L2 by a prefetch node beside the
# recorded step's chain (src/l2_prefetch.rs), against no prefetch (WEFT_CUDA_L2_PREFETCH_MB=0),
# same binary. PART (space-separated): tests — the step-graph test (prefetch nodes present,
# replays equal to op-by-op steps) and the golden fixtures; e2e — Moonlight (BATCH × CTX) and,
# for the KIMI_SETS, the Kimi-K2 slice end to end over a bf16 cache, the SETS (commas become
# spaces) alternated ROUNDS times, each run timed; own — on any build after 5dea962's revert,
# the weight-streaming kernels' own L2 prefetch before their wait (up to WEFT_PREFETCH_MAX bytes
# a block, 64 KB) against none (WEFT_NO_PREFETCH) and 16 / 256 KB, same binary, OWN_SETS
# alternated ROUNDS times; trace — the kernel trace (WEFT_TRACE, `roofline --trace`) of a
# replayed step, Moonlight at batch 1 and 64 and the Kimi-K2 slice at batch 1. Output:
# $OUT/round28.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round28.md"
P=" ${PART:-tests e2e} "
# Run 1 (H100) had WEFT_CUDA_L2_PREFETCH_MB=48 and WEFT_CUDA_L2_PREFETCH_BLOCKS=64 as well.
SETS=(${SETS:-WEFT_CUDA_L2_PREFETCH_MB=0 WEFT_CUDA_L2_PREFETCH_MB=10 WEFT_X=1 WEFT_CUDA_L2_PREFETCH_BLOCKS=8 WEFT_CUDA_L2_PREFETCH_BLOCKS=2 WEFT_CUDA_KERNEL_DEFINES=WEFT_L2PF_CHUNK=65536u WEFT_CUDA_KERNEL_DEFINES=WEFT_L2PF_EVICT_LAST,WEFT_CUDA_L2_PERSIST_MB=32})
KIMI_SETS=" ${KIMI_SETS:-WEFT_CUDA_L2_PREFETCH_MB=0 WEFT_X=1} "
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
if [[ $P == *" tests "* ]]; then
  echo "== cuda-step_graphs-test" | tee -a "$R"
  timeout 200 .device/cuda-step_graphs-test --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|assert|prefetch_nodes" | cut -c1-400 | tee -a "$R"
  echo "== cuda-kernels-test golden" | tee -a "$R"
  timeout 200 .device/cuda-kernels-test --test-threads 1 golden 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    t0=$(date +%s)
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//,/ } timeout 120 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror|step graphs" | tee -a "$R"
    if [[ $r == 1 && $KIMI_SETS == *" $s "* ]]; then
      echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
      env ${s//,/ } timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,64 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror|step graphs" | tee -a "$R"
    fi
    echo "(took $(( $(date +%s) - t0 )) s)" | tee -a "$R"
  done
done
[[ $P == *" own "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in ${OWN_SETS:-WEFT_X=1 WEFT_CUDA_KERNEL_DEFINES=WEFT_NO_PREFETCH WEFT_CUDA_KERNEL_DEFINES=WEFT_PREFETCH_MAX=16384u WEFT_CUDA_KERNEL_DEFINES=WEFT_PREFETCH_MAX=262144u}; do
    t0=$(date +%s)
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    env $s timeout 150 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    if [[ $r == 1 ]]; then
      echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
      env $s timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,64 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    fi
    echo "(took $(( $(date +%s) - t0 )) s)" | tee -a "$R"
  done
done
[[ $P == *" trace "* ]] && {
  echo "== moonlight bf16 cache, traced (WEFT_TRACE)" | tee -a "$R"
  WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE timeout 150 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,64} --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
  echo "== kimi-k2 slice bf16 cache, traced (WEFT_TRACE)" | tee -a "$R"
  WEFT_CUDA_KERNEL_DEFINES=WEFT_TRACE timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
}
true
