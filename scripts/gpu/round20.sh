#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 20
# (results/roofline-h200.md) — MLA decode with 64 heads a block as the rows of every wgmma
# (mla_decode_wgh_bf16, the default beyond 32 heads) against the grouped kernels
# (WEFT_CUDA_MLA_WGMMA=0) and the default below 32 heads, and for every head count
# (WEFT_CUDA_MLA_WGMMA=3): round18.sh's MLA tests (default and =3) and mla_bench at 64 × 4096
# (PART tests / bench), then the Kimi-K2 slice (64 heads) end to end over a bf16 cache, batch 1
# and 64 (PART kimi), alternated ROUNDS times. Output: $OUT/round18.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
P=" ${PART:-tests bench kimi} "
SETS="WEFT_CUDA_MLA_WGMMA=0 WEFT_X=1 WEFT_CUDA_MLA_WGMMA=3" PART="${P//kimi/}" HEADS=${HEADS:-8,16,32,64,128} \
    KTESTS="mla_ops_match_cpu mla_attention_head_counts" bash scripts/gpu/round18.sh 2>&1 | grep -v "rel err"
[[ $P == *" kimi "* ]] && for r in $(seq 1 ${ROUNDS:-1}); do
  for s in WEFT_CUDA_MLA_WGMMA=0 WEFT_X=1; do
    echo "== kimi-k2 slice bf16 cache ($s, round $r)" | tee -a "$OUT/round18.md"
    env $s timeout 150 .device/roofline models/dummy/kimi-k2-slice --dummy --batch ${BATCH:-1,64} --ctx ${CTX:-1024,4096} --prefill 1024 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]|panicked|rror" | tee -a "$OUT/round18.md"
  done
done
true
