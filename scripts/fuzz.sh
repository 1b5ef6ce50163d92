#!/usr/bin/env bash
# Runs the cargo-fuzz (libFuzzer) targets in fuzz/ for SECONDS each (default 120) and prints a
# line per target: runs executed, corpus size, crashes. Needs the nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`); the guests are built with the stable toolchain
# (WEFT_GUEST_TOOLCHAIN), which has the wasm32-wasip2 target. Seeds: the demo requests, the
# demo's chat template, the golden fixture's config and shard, the built plugins.
# Usage: bash scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-120}"; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(openai_request chat_template model_config safetensors_file plugin_component)
export WEFT_GUEST_TOOLCHAIN="${WEFT_GUEST_TOOLCHAIN:-stable}"
# No sanitizer by default: the code under test is safe Rust (panics, aborts, OOM and hangs are
# still caught); FUZZ_SANITIZER=address for ASan at several times the build and run cost.
sanitizer="${FUZZ_SANITIZER:-none}"
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2; exit 2; }
# Plugins first, with the stable toolchain (the seeds and the embedded defaults).
(cd plugins && cargo +"$WEFT_GUEST_TOOLCHAIN" build --release --target wasm32-wasip2 --target-dir ../target/plugins -q)
corpus=fuzz/corpus
mkdir -p "$corpus"/{openai_request,chat_template,model_config,safetensors_file,plugin_component}
printf '%s' '{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0.7, "logprobs": 2, "stop": ["\n"]}' > "$corpus/openai_request/completion.json"
printf '%s' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}}' > "$corpus/openai_request/chat.json"
python3 -c 'import json,sys; print(json.load(open("models/demo/tokenizer_config.json"))["chat_template"], end="")' > "$corpus/chat_template/demo.jinja"
cp tests/golden/kimi-fp8-partial-blocks/config.json "$corpus/model_config/kimi.json"
cp tests/golden/v3-qlora-yarn-groups/config.json "$corpus/model_config/v3.json"
cp tests/golden/kimi-fp8-partial-blocks/model.safetensors "$corpus/safetensors_file/kimi.safetensors"
for w in target/plugins/wasm32-wasip2/release/*.wasm; do cp "$w" "$corpus/plugin_component/"; done
summary=()
for t in "${targets[@]}"; do
    log="target/fuzz-$t.log"
    echo "== $t ($secs s)" >&2
    rc=0
    (cd fuzz && cargo +nightly fuzz run -s "$sanitizer" "$t" "corpus/$t" -- -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -max_len=1048576) > "$log" 2>&1 || rc=$?
    runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -1)
    crashes=$(ls fuzz/artifacts/"$t" 2>/dev/null | wc -l)
    summary+=("$t: ${runs:-0} runs, corpus $(ls "$corpus/$t" | wc -l), exit $rc, artifacts $crashes (log $log)")
done
printf '%s\n' "${summary[@]}"
