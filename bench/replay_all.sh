#!/usr/bin/env bash
# Every trace in bench/traces at sizes x0.9, x1.0 and x1.1 through bench/replay (simulated memory, no GPU
# needed), into one folder: a JSON per run and memory.md, the table docs/memory.md quotes.
#   bench/replay_all.sh OUT_DIR [BUILD_DIR]
set -euo pipefail
out=${1:?output folder}
build=${2:-build}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for trace in "$here"/traces/*.csv.gz; do
  name=$(basename "$trace" .csv.gz)
  for scale in 0.9 1.0 1.1; do
    "$build/bench/replay" "$trace" --scale "$scale" --json "$out/replay-$name-$scale.json" > "$out/replay-$name-$scale.txt"
  done
done
python3 "$here/replay_table.py" "$out" > "$out/memory.md"
cat "$out/memory.md"
