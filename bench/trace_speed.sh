#!/usr/bin/env bash
# default_pool against PyTorch's caching allocator on every trace of bench/traces, on one GPU: bench/peers'
# device replays in rotated rounds (time per operation, held / live, the device calls each allocator made),
# bench/vmm_costs on the same machine, and bench/driver_time.py's verdict, which prices those calls.
#   OUT=DIR bash bench/trace_speed.sh [TRACE...]        (from anywhere; default: every trace)
# ROWS: bench/peers' --only (comma-separated pieces of row names); REPEATS: its --repeats (default 3).
# Builds the PyTorch shim (bench/get_torch_shim.sh, needs torch) and the two programs into build-bench/.
# Writes OUT/peers.txt, peers.json, vmm_costs.txt, vmm_costs.json, verdict.md and verdict_plugin.md (the plug-in's
# stack); exits 1 if a verdict has a missed target.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/strata-trace-speed}
ROWS=${ROWS:-"strata default_pool,torch caching allocator (legacy,torch expandable segments (legacy"}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
[ -f build-torch/libstrata_torch_shim.so ] || bash bench/get_torch_shim.sh >"$OUT/torch_shim_build.txt" 2>&1
{ cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_CUDA=ON -DSTRATA_BUILD_TESTS=OFF \
    -DSTRATA_BUILD_PLUGIN=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=OFF &&
  cmake --build build-bench -j"$(nproc)" --target peers vmm_costs; } >"$OUT/build.txt" 2>&1 ||
  { tail -30 "$OUT/build.txt"; exit 1; }
build-bench/bench/vmm_costs --json "$OUT/vmm_costs.json" >"$OUT/vmm_costs.txt"
traces=()
if [ $# -eq 0 ]; then traces=(--traces bench/traces); else for t in "$@"; do traces+=(--trace "$t"); done; fi
build-bench/bench/peers --parts replay --only "$ROWS" --repeats "$REPEATS" --torch-shim build-torch/libstrata_torch_shim.so \
  "${traces[@]}" --json "$OUT/peers.json" >"$OUT/peers.txt"
# The verdict for the library's default, then for the plug-in's (relocating) stack where it was replayed.
status=0
python3 bench/driver_time.py "$OUT/peers.json" "$OUT/vmm_costs.json" --markdown "$OUT/verdict.md" || status=1
if grep -q '"strata default_pool (relocate idle' "$OUT/peers.json"; then
  python3 bench/driver_time.py "$OUT/peers.json" "$OUT/vmm_costs.json" --markdown "$OUT/verdict_plugin.md" \
    --stack "strata default_pool (relocate idle: the plug-in's default)" >/dev/null || status=1
fi
exit $status
