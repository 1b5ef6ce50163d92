#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): speculative
# decoding on CUDA. STEPS (default "equal off ngram oracle"):
#   equal  — greedy output with and without speculation (prompt lookup; on the demo model also
#            its draft model, on Moonlight + MTP layer the MTP drafter), demo model and Moonlight
#            dummy (EQUAL_MODELS="demo moon kimi" adds the fp8 Kimi-K2 slice), compared
#            token for token over the HTTP API (the CPU tests check the same on the CPU backend;
#            EQUAL_MODES="off dflash" picks the modes);
#   off    — Moonlight-shaped dummy (bf16), no speculation, random and repeated-block prompts;
#   ngram  — the same with prompt lookup (--speculative ngram, adaptive, 4 drafts);
#   oracle — the oracle instrument at acceptance 0.5/0.7/0.9 (4 drafts, fixed length): real
#            verify passes with synthetic verdicts, the speed of a drafter of that acceptance;
#   dflash — the DFlash drafter on Moonlight's shape with the dummy DFlash draft
#            (models/dummy/dflash-moonlight: 5 layers, block 16, weights synthesized): random
#            weights accept ~nothing, so with a fixed draft length (15 and 4) this prices a
#            DFlash block + verification, the cost a real draft's acceptance has to pay back;
#   mtp    — the MTP drafter on Moonlight's shape with one MTP layer added to the config
#            ($MOON_MTP, weights synthesized like the rest): random weights accept ~nothing, so
#            with a fixed draft length (1 and 2) this prices MTP drafting + verification, the
#            cost a real checkpoint's acceptance has to pay back.
# Every bench: --input-len $IN (1024) --output-len $OUTLEN (256) --concurrency $CONC (1,8,32),
# one wave per slot (at least 4 requests), greedy. Logs and JSON go to $OUT; on the device
# machine run `OUT=/tmp/spec PACK_TO=$OUT bash scripts/gpu/spec_bench.sh` (see the end).
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
STEPS=${STEPS:-equal off ngram oracle}
IN=${IN:-1024}; OUTLEN=${OUTLEN:-256}; CONC=${CONC:-1,8,32}
export WEFT_DEMO_MODEL=$PWD/models/demo
MOON=models/dummy/moonlight-16b-a3b
# Moonlight's shape with one MTP layer (Moonlight ships none); same main weights (by name).
MOON_MTP=${MOON_MTP:-/tmp/moonlight-mtp}
mkdir -p "$MOON_MTP" && python3 -c "
import json, sys; c = json.load(open('$MOON/config.json')); c['num_nextn_predict_layers'] = 1
json.dump(c, open('$MOON_MTP/config.json', 'w'), indent=1)"

start() { # port log model-args... ; sets PID
    local port=$1 log=$2; shift 2
    .device/weft serve --backend cuda --port "$port" --kv-memory-fraction 0.8 --max-sequences 128 --token-budget 2048 ${SERVE_ARGS:-} "$@" > "$log" 2>&1 &
    PID=$!
    for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0; sleep 0.5; done
    echo "server on $port did not come up:"; tail -5 "$log"; return 1
}
stop() { kill -TERM "$PID"; while kill -0 "$PID" 2>/dev/null; do sleep 0.2; done; }
bench() { # port name extra-bench-args...
    local port=$1 name=$2; shift 2
    echo "### $name"
    echo "command: weft bench serve --input-len $IN --output-len $OUTLEN --concurrency $CONC --waves 1 --vocab-size 160000 $*"
    timeout 300 .device/weft bench serve --url "http://127.0.0.1:$port" --input-len "$IN" --output-len "$OUTLEN" --concurrency "$CONC" --waves 1 --vocab-size 160000 --label "$name" --json "$OUT/spec-$name.json" "$@" 2>/dev/null
}

if [[ " $STEPS " == *" equal "* ]]; then
echo "== greedy with and without speculation (CUDA)"
for model in ${EQUAL_MODELS:-demo moon}; do
    args=(); [ $model = moon ] && args=(--model $MOON_MTP --load-format dummy)
    [ $model = kimi ] && args=(--model models/dummy/kimi-k2-slice --load-format dummy)
    modes="off ngram mtp dflash"; [ $model = demo ] && modes="off ngram draft"; [ $model = kimi ] && modes="off ngram"
    modes=${EQUAL_MODES:-$modes}
    for mode in $modes; do
        sargs=(); [ $mode = ngram ] && sargs=(--speculative ngram --num-draft-tokens 4)
        [ $mode = mtp ] && sargs=(--speculative mtp --num-draft-tokens 2 --fixed-draft-length)
        [ $mode = draft ] && sargs=(--speculative draft-model --draft-model models/demo-draft --num-draft-tokens 4)
        [ $mode = dflash ] && sargs=(--speculative dflash --draft-model models/dummy/dflash-moonlight --num-draft-tokens 15 --fixed-draft-length)
        start 8020 "$OUT/equal-$model-$mode.log" "${args[@]}" "${sargs[@]}" || continue
        python3 - "$model" "$mode" "$OUT" <<'EOF'
import json, sys, urllib.request, random
model, mode, out = sys.argv[1:]
rng = random.Random(7)
prompts = ["one two three one two three one two", "Love is", "The quick brown fox jumps over the lazy dog. The quick brown fox", "Q: What is the meaning of life?\nA:"]
# Past 64 tokens: a prompt run that takes one bf16 part on CUDA, its drafts marked exact rows.
prompts.append("Once upon a time there was a little cat who lived in a small house by the river. " * 6)
if model in ("moon", "kimi"):
    block = [rng.randrange(100, 160000) for _ in range(16)]
    prompts = [block * 4, [rng.randrange(100, 160000) for _ in range(64)], block * 2 + [5, 6, 7]]
res = []
for p in prompts:
    body = json.dumps({"prompt": p, "max_tokens": 128, "temperature": 0, "ignore_eos": True, "logprobs": None}).encode()
    req = urllib.request.Request("http://127.0.0.1:8020/v1/completions", body, {"Content-Type": "application/json"})
    d = json.load(urllib.request.urlopen(req, timeout=300))
    res.append(d["choices"][0]["text"])
json.dump(res, open(f"{out}/equal-{model}-{mode}.json", "w"))
EOF
        curl -s http://127.0.0.1:8020/health | python3 -c 'import json,sys; print("  ", sys.argv[1], json.load(sys.stdin)["engine"]["speculative"])' "$model-$mode"
        stop
    done
    python3 - "$model" "$OUT" <<'EOF'
import json, sys
model, out = sys.argv[1:]
import os
a = json.load(open(f"{out}/equal-{model}-off.json"))
for m in ("ngram", "draft", "mtp", "dflash"):
    if not os.path.exists(f"{out}/equal-{model}-{m}.json"):
        continue
    b = json.load(open(f"{out}/equal-{model}-{m}.json"))
    for i, (x, y) in enumerate(zip(a, b)):
        same = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        print(f"{model} {m} prompt {i}: {'identical' if x == y else f'differs at character {same} of {len(x)}'}")
EOF
done 2>&1 | tee "$OUT/spec-equal.txt"
fi

if [[ " $STEPS " == *" off "* ]]; then
echo "== Moonlight dummy, no speculation"
start 8021 "$OUT/serve-off.log" --model $MOON --load-format dummy && {
    bench 8021 off-random
    bench 8021 off-repeat --prompt-style repeat --repeat-block 32
    stop; } 2>&1 | tee "$OUT/spec-off.md"
fi

if [[ " $STEPS " == *" ngram "* ]]; then
echo "== Moonlight dummy, prompt lookup"
start 8022 "$OUT/serve-ngram.log" --model $MOON --load-format dummy --speculative ngram --num-draft-tokens 4 && {
    bench 8022 ngram-random
    bench 8022 ngram-repeat --prompt-style repeat --repeat-block 32
    stop; } 2>&1 | tee "$OUT/spec-ngram.md"
fi

if [[ " $STEPS " == *" oracle "* ]]; then
for a in 0.5 0.7 0.9; do
    echo "== Moonlight dummy, oracle instrument, acceptance $a"
    start 8023 "$OUT/serve-oracle-$a.log" --model $MOON --load-format dummy --speculative oracle --oracle-acceptance "$a" --num-draft-tokens 4 --fixed-draft-length && {
        bench 8023 "oracle-$a"
        stop; } 2>&1 | tee "$OUT/spec-oracle-$a.md"
done
fi

if [[ " $STEPS " == *" mtp "* ]]; then
for k in ${MTP_K:-1 2}; do
    echo "== Moonlight dummy + 1 MTP layer, MTP drafter, $k draft(s) per step, fixed length"
    start 8024 "$OUT/serve-mtp-$k.log" --model $MOON_MTP --load-format dummy --speculative mtp --num-draft-tokens $k --fixed-draft-length && {
        bench 8024 "mtp-$k"
        stop; } 2>&1 | tee "$OUT/spec-mtp-$k.md"
done
echo "== Moonlight dummy + 1 MTP layer, MTP drafter, adaptive (up to 2 drafts)"
start 8024 "$OUT/serve-mtp-adaptive.log" --model $MOON_MTP --load-format dummy --speculative mtp --num-draft-tokens 2 && {
    bench 8024 "mtp-adaptive"
    stop; } 2>&1 | tee "$OUT/spec-mtp-adaptive.md"
fi

if [[ " $STEPS " == *" dflash "* ]]; then
for k in ${DFLASH_K:-15 4}; do
    echo "== Moonlight dummy + dummy DFlash draft (5 layers, block 16), $k draft(s) per step, fixed length"
    start 8025 "$OUT/serve-dflash-$k.log" --model $MOON --load-format dummy --speculative dflash --draft-model models/dummy/dflash-moonlight --num-draft-tokens $k --fixed-draft-length && {
        bench 8025 "dflash-$k"
        stop; } 2>&1 | tee "$OUT/spec-dflash-$k.md"
done
fi

# The device machine returns at most 8 files from its $OUT: with PACK_TO set (run with OUT
# elsewhere, PACK_TO=$OUT), the tables and verdicts go there as one summary.md and every log and
# JSON as one spec-raw.tgz.
if [ -n "${PACK_TO:-}" ]; then
    mkdir -p "$PACK_TO"
    for f in "$OUT"/spec-equal.txt "$OUT"/spec-*.md; do [ -f "$f" ] && { echo "# $(basename "$f")"; cat "$f"; echo; }; done > "$PACK_TO/summary.md"
    tar czf "$PACK_TO/spec-raw.tgz" -C "$OUT" .
fi
