#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 27
# (results/roofline-h200.md) — the 64-head MLA kernels sharing the merge of their context
# splits (each split's block merges some of the 64-column tiles after waiting for the others'
# partials; only where the whole grid is resident; the default, WEFT_CUDA_MLA_MERGE=16) against
# a single split written out by the kernel (=1, round 26's default, now straight from the
# registers) and mla_combine's second launch (=0), same binary. PART (space-separated): tests —
# the MLA GPU tests (merged outputs against the combine's) under the default; bench —
# mla_bench 64 × 4096 at HEADS, 1 and 2 query rows, SETS alternated ROUNDS times; short — the
# same at 64 heads for 64 rows × 1024 and 1 row × 1024 / 4096 (16 and 64 splits); kimi — the
# Kimi-K2 slice end to end (the first two SETS). Output: $OUT/round27.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
SETS=${SETS:-WEFT_X=1 WEFT_CUDA_MLA_MERGE=1 WEFT_CUDA_MLA_MERGE=0}
REPORT=round27 TSETS=${TSETS:-WEFT_X=1} HEADS=${HEADS:-32,64,128} SETS="$SETS" \
  PART="${PART:-tests bench short kimi}" bash "$(dirname "$0")/round24.sh"
R="$OUT/round27.md"
P=" ${PART:-tests bench short kimi} "
[[ $P == *" short "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in $SETS; do
    for bc in "64 1024" "1 1024" "1 4096"; do
      set -- $bc
      echo "== mla_bench $1 x $2, 64 heads ($s, round $r)" | tee -a "$R"
      env ${s//;/ } timeout 120 .device/mla_bench --batch $1 --ctx $2 --queries 1 --heads 64 --kv bf16 2>&1 | grep -E "^\| [0-9]" | grep -v "CUDA cores" | tee -a "$R"
    done
  done
done
true
