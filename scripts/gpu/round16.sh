#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 16
# (results/roofline-h200.md), prefill attention in one pass (kernels/mla_flash.cu).
# PART=tests: the GPU tests of the prefill attention paths (KTESTS: name filters of
# cuda-kernels-test; MTESTS of cuda-kernels_moe-test, GRAPHS=1 the step-graph tests).
# PART=ab: Moonlight under each of SETTINGS (';'-separated settings of space-separated
# VAR=value, and bin=PATH for another roofline binary; "-" for the defaults), alternated ROUNDS times, batches BATCH and
# prefills PREFILL (NxP: P prompts of N tokens in one step). PART=profile: where a prefill's time
# goes (profile_prefill.sh for each of PREFILLS) and, with DECODE_BATCH, a decode step's
# (profile_decode.sh at that batch). PART=all: tests, ab, profile.
# Output: $OUT/round16.md.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
R="$OUT/round16.md"; touch "$R"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$R"
P=${PART:-all}
if [ "$P" = tests ] || [ "$P" = all ]; then
  echo "== cuda-kernels-test ${KTESTS:-prefill_rows_attend mla_prefill golden}" | tee -a "$R"
  timeout 200 .device/cuda-kernels-test --test-threads 1 --nocapture ${KTESTS:-prefill_rows_attend mla_prefill golden} 2>&1 | grep -E "^test |test result|panicked|assert|cache, .* heads|worst" | tee -a "$R"
  if [ -n "${MTESTS:-}" ]; then
    echo "== cuda-kernels_moe-test $MTESTS" | tee -a "$R"
    timeout 200 .device/cuda-kernels_moe-test --test-threads 1 $MTESTS 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  fi
  [ "${GRAPHS:-0}" = 1 ] && timeout 100 .device/cuda-step_graphs-test 2>&1 | grep -E "^test |test result|panicked" | tee -a "$R"
fi
if [ "$P" = ab ] || [ "$P" = all ]; then
  IFS=';' read -r -a sets <<< "${SETTINGS:--;WEFT_CUDA_MLA_FLASH=0}"
  for r in $(seq 1 ${ROUNDS:-2}); do
    for s in "${sets[@]}"; do
      args=(); [ "$s" != "-" ] && read -r -a args <<< "$s"
      bin=.device/roofline; env_args=()
      for a in "${args[@]+"${args[@]}"}"; do case $a in bin=*) bin=${a#bin=} ;; *) env_args+=("$a") ;; esac; done
      echo "== moonlight $s (round $r)" | tee -a "$R"
      t0=$(date +%s)
      env "${env_args[@]+"${env_args[@]}"}" timeout 150 $bin models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,64} --ctx 1024 --prefill ${PREFILL:-1024,4096,1024x4} --steps 4 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
      echo "($(( $(date +%s) - t0 )) s)" | tee -a "$R"
    done
  done
fi
if [ "$P" = profile ] || [ "$P" = all ]; then
  for n in ${PREFILLS-1024x4}; do
    OUT=$OUT/p$n PREFILL=$n NCU_TIMEOUT=${NCU_TIMEOUT:-200} bash scripts/gpu/profile_prefill.sh > /dev/null 2>&1
    echo "== profile, prefill $n" | tee -a "$R"
    cat "$OUT/p$n/prefill.md" | tee -a "$R"
    rm -rf "$OUT/p$n"
  done
  if [ -n "${DECODE_BATCH:-}" ]; then
    OUT=$OUT/d BINS="" NCU_BATCH=$DECODE_BATCH bash scripts/gpu/profile_decode.sh > /dev/null 2>&1
    echo "== profile, decode batch $DECODE_BATCH" | tee -a "$R"
    cat "$OUT/d/profile.md" | tee -a "$R"
    rm -rf "$OUT/d"
  fi
fi
