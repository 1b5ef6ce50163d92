#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): the roofline of
# one model under each backend setting in $AB, in the same run, for A/B comparisons of the
# CUDA backend's knobs (WEFT_CUDA_PDL, WEFT_CUDA_MLA_SPLIT_TILES, ...). AB: space-separated
# settings, each "VAR=value[,VAR=value]" or "-" for the defaults; REPEAT runs the list that many
# times (alternating, so drift shows as spread rather than as a difference). MODEL (Moonlight
# dummy), BATCH (1,8,64), CTX (1024), PREFILL (16), STEPS (8). Rows go to stdout and $OUT/ab-env.md.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
MODEL=${MODEL:-models/dummy/moonlight-16b-a3b}
for r in $(seq 1 "${REPEAT:-1}"); do
  for setting in ${AB:--}; do
    env_args=(); [ "$setting" != "-" ] && IFS=, read -r -a env_args <<< "$setting"
    echo "== ${setting} (round $r)"
    env "${env_args[@]}" timeout "${TIMEOUT:-120}" .device/roofline "$MODEL" --dummy --batch "${BATCH:-1,8,64}" --ctx "${CTX:-1024}" \
      --prefill "${PREFILL:-16}" --steps "${STEPS:-8}" 2>&1 | grep -E "^\| [0-9]|programmatic|panicked|rror"
  done
done | tee "$OUT/ab-env.md"
