#!/usr/bin/env bash
# Every benchmark, on the GPU machine, into one folder: JSON from each program, then the table and plots.
#   bench/run_all.sh OUT_DIR [BUILD_DIR] [TRACE]
# RMM rows appear when build-rmm/libstrata_rmm_shim.so exists (bench/get_rmm.sh), or STRATA_RMM_SHIM names it.
set -u
out=${1:?output folder}
build=${2:-build}
trace=${3:-shared/traces/resnet50_train.csv.gz}
mkdir -p "$out"
shim=${STRATA_RMM_SHIM:-build-rmm/libstrata_rmm_shim.so}
shim_args=()
[ -f "$shim" ] && shim_args=(--rmm-shim "$shim")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt" 2>/dev/null || echo "no GPU" > "$out/device.txt"
echo "${STRATA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" > "$out/commit.txt"
run() { echo "== $*"; "$@" 2>&1 | tee -a "$out/bench.log" | tail -n 40; }
run "$build/bench/peers" --json "$out/peers.json" --trace "$trace" "${shim_args[@]}"
run "$build/bench/streams" --json "$out/streams.json"
run "$build/bench/threads" --json "$out/threads.json"
run "$build/bench/pinned_managed" --json "$out/pinned_managed.json"
run "$build/bench/replay" "$trace" --json "$out/replay.json"
python3 "$(dirname "$0")/plot.py" "$out"
# summary.md and the plots stay in sight; the raw JSON, logs and notes go into one archive.
( cd "$out" && tar czf results.tar.gz ./*.json ./*.txt ./*.log && rm -f ./*.json ./*.txt ./*.log )
