#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 26
# (results/roofline-h200.md) — the 64-head MLA kernels merging their context splits in the
# kernel (the last split of a row and head group to finish merges; one split writes its rows out
# at once; WEFT_CUDA_MLA_MERGE=2: up to two splits) against mla_combine's second launch (=0),
# and round 25's query prologue loading six granules a thread before converting them (the
# default since this round; WEFT_CUDA_KERNEL_DEFINES=WEFT_MLH_Q_ONE, one at a time), same binary.
# Round 26 ran the first commit's binary, whose defaults were the other way round (it took
# =0 / =2 / =0 with WEFT_MLH_Q_BATCH); these SETS measure the same three with today's. PART
# (space-separated): tests — the MLA GPU tests (the merged outputs also against mla_combine's)
# under the default and =5; bench — mla_bench 64 × 4096, SETS alternated ROUNDS times; kimi —
# the Kimi-K2 slice end to end (the first two SETS); ncuall — one launch of each of the first two
# SETS at 64 heads, every kernel of the call (the combine included). Output: $OUT/round26.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
REPORT=round26 TSETS=${TSETS:-WEFT_X=1 WEFT_CUDA_MLA_WGMMA=5} HEADS=${HEADS:-32,64,128} \
  SETS=${SETS:-WEFT_CUDA_MLA_MERGE=0;WEFT_CUDA_KERNEL_DEFINES=WEFT_MLH_Q_ONE WEFT_CUDA_MLA_MERGE=2;WEFT_CUDA_KERNEL_DEFINES=WEFT_MLH_Q_ONE WEFT_CUDA_MLA_MERGE=0} \
  PART="${PART:-tests bench kimi}" bash "$(dirname "$0")/round24.sh"
R="$OUT/round26.md"
P=" ${PART:-tests bench kimi} "
SETS=(${SETS:-WEFT_CUDA_MLA_MERGE=0 WEFT_CUDA_MLA_MERGE=2})
[[ $P == *" ncuall "* ]] && for s in "${SETS[@]:0:2}"; do
  echo "== ncu, every kernel of one call, 64 x 4096, ${NCU_HEADS:-64} heads ($s)" | tee -a "$R"
  env ${s//;/ } timeout 150 ncu --section SpeedOfLight -k 'regex:mla_' --launch-skip 4 --launch-count 2 .device/mla_bench --batch 64 --ctx 4096 --queries 1 --heads ${NCU_HEADS:-64} --kv bf16 2>&1 | grep -E "mla_decode_|mla_combine|Duration|DRAM Throughput" | tee -a "$R"
done
true
