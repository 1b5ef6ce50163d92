#!/usr/bin/env bash
# On the GPU machine: where the time of a prefill goes. The roofline's prefill time (best of
# three, one sequence of PREFILL tokens), then the device time of each kernel of one prefill
# under Nsight Compute (COUNT launches: enough to pass the prefill that follows the decode steps); the difference between the two is the time the GPU waits for the host.
# Output: $OUT/prefill.md, $OUT/ncu-prefill.csv.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
MODEL=${MODEL:-models/dummy/moonlight-16b-a3b}
BIN=${BIN:-.device/roofline}
N=${PREFILL:-1024}
: > "$OUT/prefill.md"
timeout 200 $BIN $MODEL --dummy --batch 1 --ctx 16 --prefill $N --steps 2 2>&1 | tail -6 | tee -a "$OUT/prefill.md"
timeout ${NCU_TIMEOUT:-420} ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  -k 'regex:^(?!dummy)' --launch-count ${COUNT:-6000} $BIN $MODEL --dummy --batch 1 --ctx 16 --prefill $N --steps 1 > "$OUT/ncu-prefill.csv" 2> "$OUT/ncu-prefill.err"
python3 scripts/gpu/ncu_kernels.py prefill "$OUT/ncu-prefill.csv" >> "$OUT/prefill.md"
tail -45 "$OUT/prefill.md"; tail -3 "$OUT/ncu-prefill.err"
