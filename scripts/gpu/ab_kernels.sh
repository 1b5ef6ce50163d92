#!/usr/bin/env bash
# On the GPU machine: tensor-core kernels on (WEFT_CUDA_MMA=1) against off in the same run
# (MMA_AB="1" for on only), the launch knobs (WEFT_CUDA_MMA_MIN_M, WEFT_CUDA_MLA_WAVES,
# WEFT_CUDA_MOE_DEVICE_TOKENS), kernel tests first and a batch-8 Nsight profile last. Output in
# $OUT (ab.md, kernels.txt, profile.md).
set -uo pipefail
export WEFT_DEMO_MODEL=$PWD/models/demo
M=models/dummy/moonlight-16b-a3b; K=models/dummy/kimi-k2-slice
timeout 150 .device/cuda-kernels-test --test-threads 1 --nocapture > $OUT/kernels.txt 2>&1
timeout 150 .device/cuda-kernels_moe-test --test-threads 1 --nocapture >> $OUT/kernels.txt 2>&1
timeout 60 .device/cuda-step_graphs-test --nocapture >> $OUT/kernels.txt 2>&1
grep -E "mma=true|test result|panicked|FAILED|median" $OUT/kernels.txt | head -40
for b in cpu cuda; do .device/weft generate --backend $b --prompt "Love is" --max-tokens 60 --temperature 0 --ignore-eos --json > "$OUT/demo-$b.json" 2>/dev/null; done
python3 -c "
import json; a, b = (json.load(open('$OUT/demo-%s.json' % k)) for k in ('cpu', 'cuda'))
same = next((i for i, (x, y) in enumerate(zip(a['token_ids'], b['token_ids'])) if x != y), len(a['token_ids']))
print(f'demo greedy: {same}/{len(a[\"token_ids\"])} identical')"
{
for mma in ${MMA_AB:-1 0}; do
  echo "== WEFT_CUDA_MMA=$mma moonlight"
  WEFT_CUDA_MMA=$mma timeout 150 .device/roofline $M --dummy --batch 1,8,32,64,128 --ctx 1024,4096 --prefill 1024 --steps 6 2>&1 | grep -E "^\| [0-9]|GPU"
  echo "== WEFT_CUDA_MMA=$mma kimi"
  WEFT_CUDA_MMA=$mma timeout 100 .device/roofline $K --dummy --batch 1,8,64 --ctx 1024 --prefill 1024 --steps 6 2>&1 | grep -E "^\| [0-9]"
done
echo "== knobs"
for v in "WEFT_CUDA_MMA_MIN_M=1" "WEFT_CUDA_MLA_WAVES=1" "WEFT_CUDA_MLA_WAVES=2"; do
  echo "-- $v"; env $v timeout 60 .device/roofline $M --dummy --batch 1,8,64 --ctx 1024,4096 --prefill 16 --steps 6 2>&1 | grep -E "^\| [0-9]"
done
for v in "WEFT_CUDA_MOE_DEVICE_TOKENS=128"; do
  echo "-- $v moonlight, kimi"; env $v timeout 60 .device/roofline $M --dummy --batch 128 --ctx 1024 --prefill 1024 --steps 6 2>&1 | grep -E "^\| [0-9]"
  env $v timeout 60 .device/roofline $K --dummy --batch 64 --ctx 1024 --prefill 1024 --steps 6 2>&1 | grep -E "^\| [0-9]"
done
} 2>&1 | tee $OUT/ab.md
NCU_BATCH=8 COUNT=2000 BINS="" timeout 200 bash scripts/gpu/profile_decode.sh > /dev/null 2>&1; tail -25 $OUT/profile.md
