#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 15
# (results/roofline-h200.md). PART=ab: the wgmma expert GEMM's variants on Moonlight prefill
# (SETTINGS: ';'-separated settings of space-separated VAR=value, "-" for the defaults),
# alternated ROUNDS times. PART=tests (and PART=profile, first): the MoE kernel tests under each
# of VARIANTS (';'-separated). PART=profile: where a
# prefill's time goes (profile_prefill.sh for each of PREFILLS). Kernel variants written after
# the binaries were built run from the working tree's kernels/ with WEFT_CUDA_KERNEL_DIR=kernels.
# Output: $OUT/round15.md (and the profile's files).
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
R="$OUT/round15.md"; touch "$R"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$R"
if [ "${PART:-ab}" = final ]; then
  # PART=ab's comparison of the defaults' neighbours, the GPU tests under the defaults
  # (TESTS: test-name filters of the MoE kernel tests), then (PROFILE=1) one profile.
  PART=ab SETTINGS=${SETTINGS:-"-;WEFT_CUDA_WG_ORDER=tiles;WEFT_CUDA_WG_ORDER=slices;WEFT_CUDA_WG_PAIRS=0;WEFT_CUDA_MOE_SHARED_FUSED=100000"} bash "$0"
  timeout 200 .device/cuda-kernels_moe-test --test-threads 1 ${TESTS:-} 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  timeout 150 .device/cuda-kernels-test --test-threads 1 ${KTESTS:-} 2>&1 | grep -E "^test |test result|panicked|worst" | tee -a "$R"
  [ "${GRAPHS:-1}" = 1 ] && timeout 100 .device/cuda-step_graphs-test 2>&1 | grep -E "^test |test result|panicked" | tee -a "$R"
  [ "${PROFILE:-1}" = 1 ] && PART=profile VARIANTS=" " PREFILLS=${PREFILLS:-1024x4} bash "$0"
fi
if [ "${PART:-ab}" = ab ]; then
  I4="WEFT_CUDA_KERNEL_DEFINES=WEFT_WG_INFLIGHT=1,WEFT_WG_STAGES=4"
  SETTINGS=${SETTINGS:-"-;WEFT_CUDA_WG_TIGHT=0;WEFT_CUDA_WG_PAIRS=1;$I4;WEFT_CUDA_WG_PAIRS=1 WEFT_CUDA_KERNEL_DEFINES=WEFT_WG_INFLIGHT=1"}
  IFS=';' read -r -a sets <<< "$SETTINGS"
  for r in $(seq 1 ${ROUNDS:-2}); do
    for s in "${sets[@]}"; do
      env_args=(); [ "$s" != "-" ] && read -r -a env_args <<< "$s"
      echo "== moonlight $s (round $r)" | tee -a "$R"
      t0=$(date +%s)
      env "${env_args[@]}" timeout 150 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1} --ctx 1024 --prefill ${PREFILL:-1024,4096} --steps 4 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
      echo "($(( $(date +%s) - t0 )) s)" | tee -a "$R"
    done
  done
fi
if [ "${PART:-ab}" = tests ] || [ "${PART:-ab}" = profile ]; then
  vars=()
  [ "${VARIANTS-x}" = " " ] || IFS=';' read -r -a vars <<< "${VARIANTS:-WEFT_CUDA_WG_PAIRS=1;WEFT_CUDA_KERNEL_DEFINES=WEFT_WG_INFLIGHT=1,WEFT_WG_STAGES=4;WEFT_CUDA_WG_PAIRS=1 WEFT_CUDA_KERNEL_DEFINES=WEFT_WG_INFLIGHT=1}"
  for v in "${vars[@]+"${vars[@]}"}"; do
    read -r -a env_args <<< "$v"
    echo "== kernels_moe under $v" | tee -a "$R"
    env "${env_args[@]}" timeout 200 .device/cuda-kernels_moe-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
  done
fi
if [ "${PART:-ab}" = profile ]; then
  for n in ${PREFILLS:-1024 4096}; do
    OUT=$OUT/p$n PREFILL=$n NCU_TIMEOUT=${NCU_TIMEOUT:-240} bash scripts/gpu/profile_prefill.sh > /dev/null 2>&1
    echo "== profile, prefill $n" | tee -a "$R"
    cat "$OUT/p$n/prefill.md" | tee -a "$R"
    rm -rf "$OUT/p$n"
  done
fi
