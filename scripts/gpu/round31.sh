#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 31
# (results/roofline-h200.md; written in the thirty-fourth session, run in the thirty-fifth:
# none of the three pays, all stay off). Three opt-in changes for a single decoding token, each off by default:
#   WEFT_CUDA_ROUTER_PRE=1 — the router by gemv_f32_pre_t1 (rows loaded before its wait, two
#     sub-groups a block) instead of gemv_f32_t1;
#   WEFT_CUDA_NORM_TRIGGER=N — single-row norms let the next launch in at their start (bit 1
#     add_rms_norm, before the router; bit 2 moe_combine_add_rms_norm, before the next layer's
#     first GEMV);
#   WEFT_CUDA_KERNEL_DEFINES=WEFT_GEMV_PRELOAD — weight-streaming GEMVs load their first pass
#     before their wait (a kernel variant: ~70 s of NVRTC on its first run);
#   WEFT_MLA_TRIGGER (a define) — W_UV's and o_proj's launches in at the start of the MLA
#     decode and W_UV kernels.
# In SETS, commas separate settings and `+` joins several kernel defines. PART
# (space-separated): tests — the step-graph test, the golden fixtures, the MoE kernel tests
# (router_rows_load_before_the_wait and moe_combine_norm_takes_wide_rows are new: run them
# first); e2e — Moonlight (BATCH × CTX) and the Kimi-K2 slice, the SETS alternated ROUNDS
# times; trace — the kernel trace of a replayed step (Moonlight, each TRACE_SETS setting at
# each TRACE_BATCH). Output: $OUT/round31.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/round31.md"
P=" ${PART:-tests e2e trace} "
ON=WEFT_CUDA_ROUTER_PRE=1,WEFT_CUDA_NORM_TRIGGER=1,WEFT_CUDA_KERNEL_DEFINES=WEFT_GEMV_PRELOAD
SETS=(${SETS:-WEFT_X=1 $ON ${ON/TRIGGER=1/TRIGGER=3} ${ON/TRIGGER=1/TRIGGER=0} WEFT_CUDA_ROUTER_PRE=1,WEFT_CUDA_NORM_TRIGGER=1 $ON+WEFT_MLA_TRIGGER})
# A setting's words: commas to spaces, then `+` to the comma the define list takes.
words() { local w=${1//,/ }; echo ${w//+/,}; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
# TESTS: test binaries (and filters), `;`-separated; all three by default.
IFS=';' read -ra TESTS <<< "${TESTS:-step_graphs;kernels golden;kernels_moe}"
if [[ $P == *" tests "* ]]; then
  for s in WEFT_X=1 ${TEST_SETS-$ON}; do
    for t in "${TESTS[@]}"; do
      echo "== cuda-$t-test ($s)" | tee -a "$R"
      env $(words "$s") timeout 200 .device/cuda-${t% *}-test --test-threads 1 $([[ $t == *" "* ]] && echo ${t#* }) 2>&1 | grep -E "^test |test result|panicked|assert" | cut -c1-400 | tee -a "$R"
    done
  done
fi
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    t0=$(date +%s)
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    # (240 s: a kernel variant's first run compiles the kernels, ~100 s; run 1 lost a row to 120.)
    env $(words "$s") timeout 240 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,8,64} --ctx ${CTX:-1024} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    if [[ $r == 1 && -n ${KIMI:-1} ]]; then
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
    echo "== moonlight bf16 cache batch $b, traced ($d; $e)" | tee -a "$R"
    env $e WEFT_CUDA_KERNEL_DEFINES=$d timeout 240 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch $b --ctx 1024 --prefill 16 --steps 4 --kv-cache-dtype bf16 --trace 2>&1 | grep -E "^\| |^\(trace|^\(grids|panicked|rror" | tee -a "$R"
  done; done
}
echo "(script took $SECONDS s)" | tee -a "$R"
true
