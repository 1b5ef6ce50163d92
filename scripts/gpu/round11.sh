#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): what round 11
# (results/roofline-h200.md) built without a GPU, measured. PART=tests: the GPU tests of its
# changes (per-head prefill attention, shared experts with the routed ones, projection pairs)
# and of the paths they touch, then the step-graph test. PART=ab: the roofline of Moonlight
# (BATCH, default 1,64) and the Kimi-K2 slice (KBATCH, default 1,64) with prefills of PREFILL
# (1024,4096) under each setting of AB, alternated ROUNDS times (default: the new defaults
# against round 10's paths). PART=all (default): both — about 10 minutes, past one device call:
# run the parts in two calls. Output: $OUT/round11-<part>.md.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
PART=${PART:-all}
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  R="$OUT/round11-tests.md"; : > "$R"
  timeout 240 .device/cuda-kernels-test --test-threads 1 mla_prefill_runs linear_pair mla_attention_head golden prompt_rows 2>&1 \
    | grep -E "^test |test result|panicked|rel err|relative error|FAIL" | tee -a "$R"
  timeout 240 .device/cuda-kernels_moe-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|rel err|relative error|FAIL" | tee -a "$R"
  timeout 150 .device/cuda-step_graphs-test 2>&1 | grep -E "^test |test result|panicked" | tee -a "$R"
fi
if [ "$PART" = ab ] || [ "$PART" = all ]; then
  R="$OUT/round11-ab.md"; : > "$R"
  OLD=WEFT_CUDA_MLA_DECOMPRESS=0,WEFT_CUDA_MLA_PREFILL_TILE=100000,WEFT_CUDA_MOE_SHARED_FUSED=0,WEFT_CUDA_GEMV_PAIR=0,WEFT_CUDA_PREFILL_PARTS=2
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for setting in ${AB:-- $OLD}; do
      env_args=(); [ "$setting" != "-" ] && IFS=, read -r -a env_args <<< "$setting"
      for model in moonlight-16b-a3b kimi-k2-slice; do
        batch=${BATCH:-1,64}; [ "$model" = kimi-k2-slice ] && batch=${KBATCH:-1,64}
        echo "== $model ${setting} (round $r)" | tee -a "$R"
        env "${env_args[@]}" timeout 150 .device/roofline "models/dummy/$model" --dummy --batch "$batch" --ctx 1024 --prefill "${PREFILL:-1024,4096}" --steps 4 2>&1 \
          | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
      done
    done
  done
fi
