#!/usr/bin/env bash
# Makes sure a HIP compiler (hipcc, with AMD's device libraries) is there for the AMD kernel
# compile test: present already, or installed from Debian's ROCm packages (hipcc and
# libamdhip64-dev; bookworm ships ROCm 5.2: gfx90a and gfx940, not gfx942/gfx950) when this
# runs as root on a Debian-family system. Prints the hipcc path, or nothing when it could not
# be installed (the test then says it was skipped).
set -euo pipefail
if ! command -v hipcc >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null 2>&1 || echo "setup-hip: apt-get could not install hipcc" >&2
    fi
fi
command -v hipcc || true
