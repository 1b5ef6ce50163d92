#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 17
# (results/roofline-h200.md), the 64-row tensor-core pass for decode-batch projections
# (kernels/mma.cu gemv_mma_bf16_n8*, off by default: WEFT_CUDA_MMA_MAX_M=64 turns it on;
# WEFT_CUDA_MMA_CLUSTER, WEFT_CUDA_MMA_WIDE_UB, WEFT_CUDA_MMA_WIDE_MAX_UNITS shape it) against
# cuBLAS's stacked two-part GEMMs. The default path is the previous commits' (same kernels), so
# the same binary with and without the setting is the A/B.
# PART (space-separated, in order): tests — KTESTS (cuda-kernels-test filters), MTESTS
# (cuda-kernels_moe-test), GRAPHS=1 (cuda-step_graphs-test), each under every TEST_SETTINGS
# (';'-separated, space-separated VAR=value, "-" for the defaults); bench — .device/linear_bench
# (every projection alone on every path, --rows BENCH_ROWS, default 48,64); ncu — per-launch
# Nsight Compute times of batch-NCU_BATCH decode steps ($OUT/ncuN.csv.gz, with grid and block
# sizes) and the per-kernel table, for each of NCU_RUNS (as TEST_SETTINGS, plus bin=PATH for
# another roofline binary). Step times side by side: scripts/gpu/round16.sh's PART=ab.
# Output: $OUT/round17.md (and round16.md from the A/B).
# The measurement this round was built for (one call, ~8 device minutes; carry .device after
# build_device.sh and dropping gpu_bench, mla_bench, cuda-tensor_parallel-test and weft):
#   export OUT; PART="tests bench ncu" KTESTS=dense_ops_match_cpu GRAPHS=1 \
#     TEST_SETTINGS="-;WEFT_CUDA_MMA_MAX_M=64;WEFT_CUDA_MMA_MAX_M=64 WEFT_CUDA_MMA_CLUSTER=8 WEFT_CUDA_MMA_WIDE_UB=4" \
#     NCU_RUNS="-;WEFT_CUDA_MMA_MAX_M=64" bash scripts/gpu/round17.sh
#   PART=ab BATCH=48,64 PREFILL=1024 ROUNDS=2 SETTINGS="-;WEFT_CUDA_MMA_MAX_M=64 WEFT_CUDA_MMA_CLUSTER=1;WEFT_CUDA_MMA_MAX_M=64;WEFT_CUDA_MMA_MAX_M=64 WEFT_CUDA_MMA_WIDE_UB=2;WEFT_CUDA_MMA_MAX_M=64 WEFT_CUDA_MMA_WIDE_UB=4 WEFT_CUDA_MMA_CLUSTER=8" \
#     bash scripts/gpu/round16.sh
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
MOON=${MOON:-models/dummy/moonlight-16b-a3b}
R="$OUT/round17.md"; touch "$R"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$R"
for P in ${PART:-tests bench ncu}; do
if [ "$P" = tests ]; then
  IFS=';' read -r -a tsets <<< "${TEST_SETTINGS:--}"
  for s in "${tsets[@]}"; do
    env_args=(WEFT_X=1); [ "$s" != "-" ] && read -r -a more <<< "$s" && env_args+=("${more[@]}")
    if [ -n "${KTESTS:-}" ]; then
      echo "== cuda-kernels-test $KTESTS ($s)" | tee -a "$R"
      env "${env_args[@]}" timeout 200 .device/cuda-kernels-test --test-threads 1 --nocapture $KTESTS 2>&1 | grep -E "^test |test result|panicked|assert|worst|max err" | tee -a "$R"
    fi
    if [ -n "${MTESTS:-}" ]; then
      echo "== cuda-kernels_moe-test $MTESTS ($s)" | tee -a "$R"
      env "${env_args[@]}" timeout 200 .device/cuda-kernels_moe-test --test-threads 1 $MTESTS 2>&1 | grep -E "^test |test result|panicked|assert" | tee -a "$R"
    fi
    if [ "${GRAPHS:-0}" = 1 ]; then
      echo "== cuda-step_graphs-test ($s)" | tee -a "$R"
      env "${env_args[@]}" timeout 100 .device/cuda-step_graphs-test 2>&1 | grep -E "^test |test result|panicked" | tee -a "$R"
    fi
  done
fi
if [ "$P" = bench ]; then
  echo "== linear_bench --rows ${BENCH_ROWS:-48,64} --big" | tee -a "$R"
  timeout 300 .device/linear_bench --rows ${BENCH_ROWS:-48,64} --reps 64 --big 2>&1 | grep -E "^\||GPU|panicked|rror" | tee -a "$R"
fi
if [ "$P" = ncu ]; then
  # NCU_RUNS: ';'-separated runs, each space-separated VAR=value settings and bin=PATH ("-": defaults).
  IFS=';' read -r -a runs <<< "${NCU_RUNS:--}"
  i=0
  for s in "${runs[@]}"; do
    i=$((i + 1)); args=(); [ "$s" != "-" ] && read -r -a args <<< "$s"
    bin=.device/roofline; env_args=(WEFT_X=1)
    for a in "${args[@]+"${args[@]}"}"; do case $a in bin=*) bin=${a#bin=} ;; *) env_args+=("$a") ;; esac; done
    env "${env_args[@]}" timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size --csv --page raw \
      -k 'regex:^(?!dummy)' --launch-count ${COUNT:-3000} $bin $MOON --dummy --batch ${NCU_BATCH:-64} --ctx 1024 --prefill 16 --steps 2 > "$OUT/ncu$i.csv" 2> "$OUT/ncu$i.err"
    echo "== ncu $i, decode batch ${NCU_BATCH:-64}, $s" | tee -a "$R"
    python3 scripts/gpu/ncu_kernels.py decode "$OUT/ncu$i.csv" "${NCU_BATCH:-64}" | tee -a "$R"
    tail -3 "$OUT/ncu$i.err" | tee -a "$R"
    gzip -f "$OUT/ncu$i.csv"; rm -f "$OUT/ncu$i.err"
  done
fi
done
