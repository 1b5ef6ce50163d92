#!/usr/bin/env bash
# On a machine with several GPUs (nvidia-h200-x2 and up), from the repository root, with the
# binaries of scripts/gpu/build_device.sh in .device/: tensor and expert parallelism over NCCL,
# one GPU per rank. STEPS picks parts (default "test roofline serve"):
#   test      .device/cuda-tensor_parallel-test: TP/EP over NCCL = the whole model (fixtures)
#   allreduce .device/roofline --allreduce-only: NCCL all-reduce times, default and AR_ENVS settings
#   roofline  .device/roofline --tensor-parallel 1 and N: decode step times, Moonlight and Kimi
#   serve     weft serve --tensor-parallel N --collective nccl + weft bench serve 1024/400
# Logs go to $OUT. NVLink multicast stays off (NCCL_NVLS_ENABLE=0): a shared machine.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
STEPS=${STEPS:-test roofline serve}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export WEFT_DEMO_MODEL=$PWD/models/demo
NGPU=$(nvidia-smi -L | wc -l); TP=${TP:-$NGPU}
# NCCL is loaded at run time as libnccl.so: link the system's (or the pip wheel's) .so.2.
lib=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null || python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
mkdir -p /tmp/nccl && ln -sf "$lib" /tmp/nccl/libnccl.so && export LD_LIBRARY_PATH=/tmp/nccl:${LD_LIBRARY_PATH:-}
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; nvidia-smi topo -m; echo "NCCL: $lib"; } 2>&1 | tee "$OUT/gpus.txt"
MOON=models/dummy/moonlight-16b-a3b; KIMI=models/dummy/kimi-k2-slice
if [[ " $STEPS " == *" test "* ]]; then
echo "== tensor / expert parallelism over NCCL against the whole model"
WEFT_REQUIRE_NCCL=1 timeout 300 .device/cuda-tensor_parallel-test --test-threads 1 --nocapture > "$OUT/tp-test.txt" 2>&1
grep -E "NCCL|TP=|test |panicked|test result" "$OUT/tp-test.txt" | cut -c1-200
[ -x .device/cuda-kernels-test ] && timeout 60 .device/cuda-kernels-test dummy --nocapture 2>&1 | grep -E "dummy|test result|panicked" | tee -a "$OUT/tp-test.txt"
[ -x .device/cuda-kernels_moe-test ] && timeout 120 .device/cuda-kernels_moe-test --nocapture 2>&1 | grep -E "moe|test result|panicked" | tee -a "$OUT/tp-test.txt"
fi
if [[ " $STEPS " == *" serve "* ]] && [ -n "${SERVE_DEMO:-}" ]; then
echo "== weft serve --tensor-parallel $TP --collective nccl on the demo model (checkpoint files)"
.device/weft serve --backend cuda --port 8020 --tensor-parallel $TP --collective nccl > "$OUT/serve-demo.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8020/health >/dev/null && break; sleep 0.5; done
curl -s http://127.0.0.1:8020/v1/completions -H 'content-type: application/json' -d '{"model":"demo","prompt":"Love is","max_tokens":24,"temperature":0}' | tee -a "$OUT/serve-demo.log"; echo
kill -TERM $pid; wait $pid
.device/weft generate --backend cuda --prompt "Love is" --max-tokens 24 --temperature 0 --json 2>/dev/null | tee -a "$OUT/serve-demo.log" | cut -c1-300; echo
fi
# A Kimi-K2 slice with more layers (as memory allows: 12 layers ≈ 193 GB of fp8 over 2 GPUs).
KIMI_LAYERS=${KIMI_LAYERS:-$((NGPU >= 2 ? 6 * NGPU : 4))}
KIMI_BIG=/tmp/kimi-k2-slice-$KIMI_LAYERS; mkdir -p $KIMI_BIG
sed "s/\"num_hidden_layers\": 4/\"num_hidden_layers\": $KIMI_LAYERS/" $KIMI/config.json > $KIMI_BIG/config.json
if [[ " $STEPS " == *" allreduce "* ]]; then
echo "== NCCL all-reduce under NCCL settings (AR_ENVS, ';'-separated)"
NCCL_DEBUG=VERSION timeout 60 .device/roofline $MOON --dummy --batch 1 --tensor-parallel $TP --allreduce-only 2>&1 | grep -i "nccl version" | head -1 | tee -a "$OUT/allreduce.md"
IFS=';' read -ra envs <<< "${AR_ENVS:-NCCL_PROTO=Simple;NCCL_PROTO=LL;NCCL_PROTO=LL128;NCCL_ALGO=Tree;NCCL_ALGO=Ring}"
for e in "default" "${envs[@]}"; do
  for m in $MOON $KIMI; do
    echo "-- $e $(basename $m)" | tee -a "$OUT/allreduce.md"
    if [ "$e" = default ]; then v=; else v=$e; fi
    env $v timeout 60 .device/roofline $m --dummy --batch 1,8,64,128 --tensor-parallel $TP --allreduce-only 2>&1 | grep -E "^\| [0-9]" | tee -a "$OUT/allreduce.md"
  done
done
fi
if [[ " $STEPS " == *" roofline-ep "* ]]; then
R="--batch ${BATCH:-1,8,64,128} --ctx ${CTX:-1024,4096} --prefill ${PREFILL:-1024} --steps 8 --kv-cache-dtype bf16"
for m in $MOON $KIMI; do
  echo "== roofline $(basename $m) TP=$TP expert-parallel"
  timeout 240 .device/roofline $m --dummy $R --tensor-parallel $TP --expert-parallel 2>&1 | grep -E "^\| [0-9]|^model|^\(tensor" | tee -a "$OUT/roofline-ep.md"
done
fi
if [[ " $STEPS " == *" roofline "* ]]; then
R="--batch ${BATCH:-1,8,64,128} --ctx ${CTX:-1024,4096} --prefill ${PREFILL:-1024} --steps 8 --kv-cache-dtype bf16"
for m in $MOON $KIMI; do
  for t in 1 $TP; do
    echo "== roofline $(basename $m) TP=$t"
    timeout 240 .device/roofline $m --dummy $R --tensor-parallel $t 2>&1 | grep -vE "^\(step graphs" | tee -a "$OUT/roofline-tp.md"
  done
  echo "== roofline $(basename $m) TP=$TP expert-parallel"
  timeout 240 .device/roofline $m --dummy $R --tensor-parallel $TP --expert-parallel 2>&1 | grep -E "^\| [0-9]|^model|^\(tensor" | tee -a "$OUT/roofline-tp.md"
done
echo "== roofline Kimi-K2 slice of $KIMI_LAYERS layers, TP=$TP"
timeout 300 .device/roofline $KIMI_BIG --dummy $R --tensor-parallel $TP 2>&1 | grep -E "^\| [0-9]|^model|^\(tensor|skipped" | tee -a "$OUT/roofline-tp.md"
fi
# weft serve + weft bench serve: random 1024-token prompts, 400 output tokens, ignore_eos.
serve_bench() { # model port tensor-parallel concurrency-list label
    local extra=(); [ "$3" -gt 1 ] && extra=(--tensor-parallel "$3" --collective nccl ${EP_FLAG:-})
    .device/weft serve --backend cuda --port "$2" --model "$1" --load-format dummy --kv-cache-dtype bf16 --kv-memory-fraction 0.8 --max-sequences 128 --token-budget 2048 "${extra[@]}" > "$OUT/serve-$5.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$2/health" >/dev/null && break; sleep 0.5; done
    echo "== $5: weft serve --tensor-parallel $3; weft bench serve --input-len 1024 --output-len 400 --concurrency $4 --gpus $3"
    timeout 240 .device/weft bench serve --url "http://127.0.0.1:$2" --input-len 1024 --output-len 400 --concurrency "$4" --waves 1 --vocab-size 160000 --gpus "$3" --json "$OUT/serve-$5.json" 2>&1
    kill -TERM $pid; wait $pid
    grep -E "ERROR|panicked" "$OUT/serve-$5.log" | head -5
}
if [[ " $STEPS " == *" serve "* ]]; then
SC=${SERVE_CONC:-1,8,32,64}
if [ -n "${EP_FLAG:-}" ]; then
serve_bench $KIMI 8034 $TP $SC kimi4-tp$TP-ep 2>&1 | tee "$OUT/serve-tp-ep.md"
else
{ serve_bench $KIMI 8031 1 $SC kimi4-tp1; serve_bench $KIMI 8032 $TP $SC kimi4-tp$TP; serve_bench $KIMI_BIG 8033 $TP $SC kimi$KIMI_LAYERS-tp$TP; } 2>&1 | tee "$OUT/serve-tp.md"
fi
fi
