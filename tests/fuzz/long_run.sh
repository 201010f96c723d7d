#!/usr/bin/env bash
# The differential fuzzer's long run: builds strata_fuzz and runs every stack over fresh seeds.
#   tests/fuzz/long_run.sh [SECONDS] [THREADS] [BUILD_DIR]     (defaults: 1800 s, 2 threads, build)
# Exits non-zero when any run broke a rule; each failure prints its stack, seed and what broke, and
# `strata_fuzz --only STACK --first-seed SEED --seconds 1 --threads 1` replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-1800}
threads=${2:-2}
build=${3:-build}
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$threads" --target strata_fuzz
"$build/tests/strata_fuzz" --seconds "$seconds" --threads "$threads" --operations 200000
