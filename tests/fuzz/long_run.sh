#!/usr/bin/env bash
# The differential fuzzer's long run: builds strata_fuzz and runs every stack over fresh seeds.
#   tests/fuzz/long_run.sh [SECONDS] [THREADS] [BUILD_DIR] [-- strata_fuzz's options]
#   (defaults: 1800 s, 2 threads, build; e.g. `-- --only stream_ordered --min-steps 10000000 --per-stack`)
# Exits non-zero when any run broke a rule (or a --min-steps floor was not reached in time); each failure
# prints its stack, seed and what broke, and `strata_fuzz --only STACK --first-seed SEED --seconds 1 --threads 1`
# replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=1800 threads=2 build=build
for v in seconds threads build; do
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then printf -v "$v" '%s' "$1"; shift; fi
done
[ "${1:-}" = "--" ] && shift
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$threads" --target strata_fuzz
"$build/tests/strata_fuzz" --seconds "$seconds" --threads "$threads" --operations 200000 "$@"
