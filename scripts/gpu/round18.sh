#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 18
# (results/roofline-h200.md), MLA decode on warpgroup tensor cores (kernels/mla_wgmma.cu,
# opt-in WEFT_CUDA_MLA_WGMMA=1 or 2 warpgroups) against the default kernels, same binary: the MLA GPU tests,
# mla_bench at 64 × 4096 (bf16 cache, every head count, 1 and 2 query rows), and Moonlight end
# to end over a bf16 cache, alternated ROUNDS times; PART (space-separated: tests bench e2e
# ncu, default all) picks; ncu: Nsight Compute's throughput and scheduler sections of one launch
# of each kernel at 64 × 4096, 16 heads. Output: $OUT/round18.md.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
R="$OUT/round18.md"; touch "$R"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$R"
SETS=(${SETS:-WEFT_X=1 WEFT_CUDA_MLA_WGMMA=1 WEFT_CUDA_MLA_WGMMA=2})
P=" ${PART:-tests bench e2e ncu} "
[[ $P == *" tests "* ]] && for s in "${SETS[@]:1}"; do
  echo "== cuda-kernels-test MLA ($s)" | tee -a "$R"
  env ${s//,/ } timeout 150 .device/cuda-kernels-test --test-threads 1 --nocapture ${KTESTS:-mla_ops_match_cpu mla_attention_head_counts} 2>&1 | grep -E "^test |test result|panicked|assert|worst|err" | tee -a "$R"
done
[[ $P == *" bench "* ]] && for s in "${SETS[@]}"; do
  echo "== mla_bench ($s)" | tee -a "$R"
  env ${s//,/ } timeout 120 .device/mla_bench --batch 64 --ctx 4096 --queries 1,2 --heads ${HEADS:-8,12,16,32,64,128} --kv bf16 2>&1 | grep -E "^\| 64" | grep -v "CUDA cores" | tee -a "$R"
done
[[ $P == *" e2e "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    echo "== moonlight bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//,/ } timeout 100 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch ${BATCH:-1,64} --ctx ${CTX:-1024,4096} --prefill 1024 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$R"
  done
done
[[ $P == *" ncu "* ]] && for s in "${SETS[@]}"; do
  echo "== ncu, 64 x 4096, 16 heads ($s)" | tee -a "$R"
  env ${s//,/ } timeout 120 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats -k 'regex:mla_decode_(wg|mmg)' --launch-skip 2 --launch-count 1 .device/mla_bench --batch 64 --ctx 4096 --queries 1 --heads 16 --kv bf16 2>&1 | grep -E "mla_decode_|Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Stall" | tee -a "$R"
done
true
