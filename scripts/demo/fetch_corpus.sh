#!/usr/bin/env bash
# Fetches the demo model's training corpus: the fortune-cookie collection of Debian's
# `fortunes` package (fortune-mod data files; BSD licence, see the package's copyright file).
# Writes one fortune per paragraph to OUT (default .device/corpus/fortunes.txt).
set -euo pipefail
out=${1:-.device/corpus/fortunes.txt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download fortunes >/dev/null 2>&1 || { apt-get update -qq && apt-get download fortunes; })
dpkg -x "$work"/fortunes_*.deb "$work/x"
mkdir -p "$(dirname "$out")"
python3 - "$work/x/usr/share/games/fortunes" "$out" <<'PY'
import os, sys, re
src, out = sys.argv[1], sys.argv[2]
pieces = []
for name in sorted(os.listdir(src)):
    p = os.path.join(src, name)
    if "." in name or os.path.islink(p) or not os.path.isfile(p):
        continue  # skip .dat indexes and .u8 duplicates
    text = open(p, encoding="latin-1").read()
    for f in text.split("\n%\n"):
        f = f.strip("%\n ").replace("\t", "    ")
        if 20 <= len(f) <= 1200 and f.isascii():
            pieces.append(f)
open(out, "w").write("\n\n".join(pieces) + "\n")
print(f"{len(pieces)} fortunes, {sum(map(len, pieces))} characters -> {out}")
PY
cp "$work/x/usr/share/doc/fortunes/copyright" "$(dirname "$out")/COPYRIGHT.fortunes" 2>/dev/null || true
