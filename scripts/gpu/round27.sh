#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 27
# (results/roofline-h200.md) — the 64-head MLA kernels sharing the merge of their context
# splits (each split's block merges some of the 64-column tiles after waiting for the others'
# partials; only where the whole grid is resident; the default up to two splits) against a
# single split written out by the kernel (WEFT_CUDA_MLA_MERGE=1, round 26's default, now straight
# from the registers) and mla_combine's second launch (=0), same binary. PART (space-separated):
# tests — the MLA GPU tests (merged outputs against the combine's) under the default; bench —
# mla_bench 64 × 4096 at HEADS, 1 and 2 query rows, SETS alternated ROUNDS times; short — the
# same at 64 heads for 64 rows × 1024 and 1 row × 1024 / 4096 (2, 16 and 64 splits) under
# SHORT_SETS (the default, the combine for more than one split, and up to 16 splits merged);
# kimi — the Kimi-K2 slice end to end (the first two SETS); full — the roofline table under the
# defaults (Moonlight shape and the Kimi-K2 slice over a bf16 cache). Output: $OUT/round27.md. (Round 27's
# first run had the merge default to 16 splits, each thread loading four splits at a time; its
# SHORT_SETS had WEFT_CUDA_KERNEL_DEFINES=WEFT_MLH_MERGE_SERIAL for one at a time — today's code.)
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
SETS=${SETS:-WEFT_X=1 WEFT_CUDA_MLA_MERGE=1 WEFT_CUDA_MLA_MERGE=0}
R="$OUT/round27.md"
P=" ${PART:-tests bench short kimi} "
run24() { REPORT=round27 TSETS=${TSETS:-WEFT_X=1} HEADS=${HEADS:-32,64,128} SETS="$SETS" PART="$1" bash "$(dirname "$0")/round24.sh"; }
[[ $P == *" tests "* ]] && run24 tests
[[ $P == *" bench "* ]] && run24 bench
[[ $P == *" short "* ]] && for r in $(seq 1 ${ROUNDS:-2}); do
  for s in ${SHORT_SETS:-WEFT_X=1 WEFT_CUDA_MLA_MERGE=1 WEFT_CUDA_MLA_MERGE=16}; do
    for bc in "64 1024" "1 1024" "1 4096"; do
      set -- $bc
      echo "== mla_bench $1 x $2, 64 heads ($s, round $r)" | tee -a "$R"
      env ${s//;/ } timeout 120 .device/mla_bench --batch $1 --ctx $2 --queries 1 --heads 64 --kv bf16 2>&1 | grep -E "^\| [0-9]" | grep -v "CUDA cores" | tee -a "$R"
    done
  done
done
[[ $P == *" kimi "* ]] && run24 kimi
[[ $P == *" full "* ]] && {
  echo "== roofline, Moonlight shape, bf16 cache (defaults)" | tee -a "$R"
  timeout 300 .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch 1,8,32,64,128 --ctx 1024,4096 --prefill 1024,4096 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| |GB/s|TFLOP|panicked|rror" | tee -a "$R"
  echo "== roofline, Kimi-K2 slice, bf16 cache (defaults)" | tee -a "$R"
  timeout 150 .device/roofline models/dummy/kimi-k2-slice --dummy --batch 1,8,64 --ctx 1024,4096 --prefill 1024 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| |GB/s|TFLOP|panicked|rror" | tee -a "$R"
}
true
