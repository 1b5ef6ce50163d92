#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): the device-planned
# grouped GEMM of prefill-sized MoE (kernels/moe_gemm.cu). The GPU kernel tests (every op against
# the CPU; the MoE ones' errors kept) and the step-graph test, then the roofline under each
# setting of AB (space-separated "VAR=value[,VAR=value]", "-" for the defaults; host routing is
# WEFT_CUDA_MOE_GEMM_TOKENS=0; by default also the kernel variants of moe_gemm.cu), alternated twice, Moonlight (BATCH, prefill PREFILL) and the
# Kimi-K2 slice (KBATCH); then Nsight times of the GEMM kernels (moe_gemm.cu, moe_wgmma.cu) in one Moonlight prefill.
# Output: $OUT/moe-gemm.md.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
R="$OUT/moe-gemm.md"; : > "$R"
if [ -n "${TESTS-1}" ]; then
  timeout 300 .device/cuda-kernels-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|relative error|unwritten|FAIL" | tee -a "$R"
  timeout 300 .device/cuda-kernels_moe-test --test-threads 1 2>&1 | grep -E "^test |test result|panicked|moe.*rel err|relative error|unwritten|FAIL" | tee -a "$R"
  timeout 200 .device/cuda-step_graphs-test 2>&1 | grep -E "^test |test result|panicked" | tee -a "$R"
fi
for r in 1 2; do
  for setting in ${AB:-- WEFT_CUDA_MOE_GEMM_TOKENS=0 WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_BK=64 WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_MINB=4 WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_ASYNC WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_ASYNC,WEFT_MG_STAGES=4 WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_ASYNC,WEFT_MG_BK=64 WEFT_CUDA_KERNEL_DEFINES=WEFT_MG_ONE_PART}; do
    env_args=(); [ "$setting" != "-" ] && IFS=, read -r -a env_args <<< "$setting"
    echo "== moonlight ${setting} (round $r)" | tee -a "$R"
    env "${env_args[@]}" timeout 150 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1} --ctx 1024 --prefill ${PREFILL:-1024,4096} --steps 4 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
    [ -n "${KBATCH-1}" ] || continue
    echo "== kimi slice ${setting} (round $r)" | tee -a "$R"
    env "${env_args[@]}" timeout 150 .device/roofline models/dummy/kimi-k2-slice --dummy --batch ${KBATCH:-1} --ctx 1024 --prefill ${PREFILL:-1024,4096} --steps 4 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
  done
done
if [ -n "${NCU-1}" ]; then
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
  -k 'regex:moe_(gemm|wg)' --launch-skip 8 --launch-count 4 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch 1 --ctx 16 --prefill 1024 --steps 1 2>&1 \
  | grep -E "moe_|gpu__time|hmma|warps_active|registers" | tee -a "$R"
fi
