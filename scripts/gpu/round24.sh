#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 24
# (results/roofline-h200.md) — MLA decode with the tile's tokens split between the warpgroups
# (mla_decode_wgs_bf16: one bf16 part of queries and weights, 64-token tiles; the default beyond
# 16 heads) against the two-part 64-head kernel (WEFT_CUDA_MLA_WGMMA=3, round 20's default
# there) and for every head count (=5), same binary. PART (space-separated): tests — the MLA
# GPU tests under the default, =5 and =3; bench — mla_bench 64 × 4096 (bf16 cache, HEADS,
# 1 and 2 query rows), SETS alternated ROUNDS times; kimi — the Kimi-K2 slice (64 heads) end to
# end over a bf16 cache at BATCH x CTX; ncu — Nsight Compute's throughput and scheduler
# sections and stall reasons of one launch at NCU_HEADS (64) heads under each of SETS. Output:
# $OUT/round24.md (REPORT names another; TSETS: the tests' settings).
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
R="$OUT/${REPORT:-round24}.md"; touch "$R"
P=" ${PART:-tests bench kimi} "
SETS=(${SETS:-WEFT_CUDA_MLA_WGMMA=3 WEFT_X=1 WEFT_CUDA_MLA_WGMMA=5})
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$R"
[[ $P == *" tests "* ]] && for s in ${TSETS:-WEFT_X=1 WEFT_CUDA_MLA_WGMMA=5 WEFT_CUDA_MLA_WGMMA=3}; do
  echo "== cuda-kernels-test MLA ($s)" | tee -a "$R"
  env $s timeout 200 .device/cuda-kernels-test --test-threads 1 --nocapture ${KTESTS:-mla_ops_match_cpu mla_attention_head_counts} 2>&1 | grep -E "^test |test result|panicked|assert|wgs|wgp|FAIL" | tail -40 | tee -a "$R"
done
[[ $P == *" bench "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]}"; do
    echo "== mla_bench ($s, round $r)" | tee -a "$R"
    env ${s//;/ } timeout 120 .device/mla_bench --batch 64 --ctx ${MCTX:-4096} --queries ${QUERIES:-1,2} --heads ${HEADS:-8,16,32,64,128} --kv bf16 2>&1 | grep -E "^\| 64" | grep -v "CUDA cores" | tee -a "$R"
  done
done
[[ $P == *" kimi "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in "${SETS[@]:0:2}"; do
    echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$R"
    env ${s//;/ } timeout 150 .device/roofline models/dummy/kimi-k2-slice --dummy --batch ${BATCH:-1,64} --ctx ${CTX:-1024,4096} --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | grep -v "^| 16 " | tee -a "$R"
  done
done
[[ $P == *" ncu "* ]] && for s in "${SETS[@]:0:2}"; do
  echo "== ncu, 64 x 4096, ${NCU_HEADS:-64} heads ($s)" | tee -a "$R"
  env ${s//;/ } timeout 150 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' -k 'regex:mla_decode_wg' --launch-skip 2 --launch-count 1 .device/mla_bench --batch 64 --ctx 4096 --queries 1 --heads ${NCU_HEADS:-64} --kv bf16 2>&1 | grep -E "mla_decode_|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|Eligible Warps|Warp Cycles Per Issued|stalled" | awk '$NF != "0" && $NF != "0.00"' | tee -a "$R"
done
true
