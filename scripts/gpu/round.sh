#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): one round's tests,
# end-to-end A/B and kernel trace (results/roofline-h200.md, rounds 31 on). Settings (SETS,
# TEST_SETS, TRACE_SETS) are env words: commas separate settings and `+` joins several kernel
# defines (WEFT_CUDA_KERNEL_DEFINES=A+B). PART (space-separated): tests — TESTS (test
# binaries and filters, `;`-separated) under WEFT_X=1 and each TEST_SETS setting; e2e —
# Moonlight (BATCH × CTX) and the Kimi-K2 slice (b1, b64; its first KIMI_ROUNDS rounds), the SETS
# alternated ROUNDS times; trace — the kernel trace of a replayed step (TRACE_MODELS, default
# Moonlight; each TRACE_SETS setting at each TRACE_BATCH).
# Output: $OUT/round.md.
#   Round 31 (run as round31.sh, whose defaults were these): ON=WEFT_CUDA_ROUTER_PRE=1,
#     WEFT_CUDA_NORM_TRIGGER=1,WEFT_CUDA_KERNEL_DEFINES=WEFT_GEMV_PRELOAD; TEST_SETS=$ON;
#     SETS="WEFT_X=1 $ON ${ON/TRIGGER=1/TRIGGER=3} ${ON/TRIGGER=1/TRIGGER=0}
#     WEFT_CUDA_ROUTER_PRE=1,WEFT_CUDA_NORM_TRIGGER=1 $ON+WEFT_MLA_TRIGGER" (no gain).
#   Round 32: SETS="WEFT_X=1 WEFT_CUDA_MOE_ROUTE_FUSED=1" (a single token's routing in the
#     experts' gate|up launch).
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round.md"
P=" ${PART:-tests e2e trace} "
SETS=(${SETS:-WEFT_X=1})
# A setting's words: commas to spaces, then `+` to the comma the define list takes.
words() { local w=${1//,/ }; echo ${w//+/,}; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
IFS=';' read -ra TESTS <<< "${TESTS:-step_graphs;kernels golden;kernels_moe}"
if [[ $P == *" tests "* ]]; then
  for s in WEFT_X=1 ${TEST_SETS-}; do
    for t in "${TESTS[@]}"; do
      echo "== cuda-$t-test ($s)" | tee -a "$R"
      env $(words "$s") timeout 200 .device/cuda-${t%% *}-test --test-threads 1 $([[ $t == *" "* ]] && echo ${t#* }) 2>&1 | grep -E "^test |test result|panicked|assert" | cut -c1-400 | tee -a "$R"
    done
  done
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    t0=$(date +%s)
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    # (240 s: a kernel variant's first run compiles the kernels, ~100 s; run 1 lost a row to 120.)
    env $(words "$s") timeout 240 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    if (( r <= ${KIMI_ROUNDS:-1} )); then
      echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
      env $(words "$s") timeout 100 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,64 --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    fi
    echo "(took $(( $(date +%s) - t0 )) s)" | tee -a "$R"
  done
done
[[ $P == *" trace "* ]] && {
  for b in ${TRACE_BATCH:-1}; do for s in ${TRACE_SETS:-WEFT_X=1}; do
    # The trace is a kernel variant: a setting's kernel defines (one each) join it.
    d=WEFT_TRACE; e=WEFT_X=1
    for w in $(words "$s"); do
      if [[ $w == WEFT_CUDA_KERNEL_DEFINES=* ]]; then d="$d,${w#WEFT_CUDA_KERNEL_DEFINES=}"; else e="$e $w"; fi
    done
    for model in ${TRACE_MODELS:-moonlight-16b-a3b}; do
      echo "== $model bf16 cache batch $b, traced ($d; $e)" | tee -a "$R"
      env $e WEFT_CUDA_KERNEL_DEFINES=$d timeout 240 .device/roofline models/dummy/$model --dummy --batch $b --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
    done
  done; done
}
echo "(script took $SECONDS s)" | tee -a "$R"
true
