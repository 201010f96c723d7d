#!/usr/bin/env bash
# default_pool against PyTorch's caching allocator on every trace of bench/traces, on one GPU: bench/peers'
# device replays in rotated rounds (time per operation, held / live, the device calls each allocator made),
# bench/vmm_costs on the same machine, and bench/driver_time.py's verdict, which prices those calls.
#   OUT=DIR bash bench/trace_speed.sh [TRACE...]        (from anywhere; default: every trace)
# ROWS: bench/peers' --only (comma-separated pieces of row names); REPEATS: its --repeats (default 3).
# Builds the PyTorch shim (bench/get_torch_shim.sh, needs torch) and the two programs into build-bench/.
# Writes OUT/peers.txt, peers.json, vmm_costs.txt, vmm_costs.json, verdict.md and verdict_plugin.md (the plug-in's
# stack; each lists the targets it misses). Exits 1 only when something could not be measured: a build, a
# replay, a verdict.
set -euo pipefail
OUT=$(realpath -m "${OUT:-/tmp/strata-trace-speed}")   # a relative OUT is the caller's
cd "$(dirname "$0")/.."
ROWS=${ROWS:-"strata default_pool,torch caching allocator (legacy,torch expandable segments (legacy"}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
# A shim built before it reported PyTorch's device calls is built again.
nm -D build-torch/libstrata_torch_shim.so 2>/dev/null | grep -q strata_torch_device_calls ||
  bash bench/get_torch_shim.sh >"$OUT/torch_shim_build.txt" 2>&1
{ cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_CUDA=ON -DSTRATA_BUILD_TESTS=OFF \
    -DSTRATA_BUILD_PLUGIN=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=OFF &&
  cmake --build build-bench -j"$(nproc)" --target peers vmm_costs; } >"$OUT/build.txt" 2>&1 ||
  { tail -30 "$OUT/build.txt"; exit 1; }
build-bench/bench/vmm_costs --json "$OUT/vmm_costs.json" >"$OUT/vmm_costs.txt"
traces=()
if [ $# -eq 0 ]; then traces=(--traces bench/traces); else for t in "$@"; do traces+=(--trace "$t"); done; fi
status=0
build-bench/bench/peers --parts replay --only "$ROWS" --repeats "$REPEATS" --torch-shim build-torch/libstrata_torch_shim.so \
  "${traces[@]}" --json "$OUT/peers.json" >"$OUT/peers.txt" || status=1   # a replay failed: its row says why
# The verdict for the library's default, then for the plug-in's (relocating) stack where it was replayed; a
# missed target is written down (exit status 1 of driver_time.py), not a failure of this script.
verdict() {
  python3 bench/driver_time.py "$OUT/peers.json" "$OUT/vmm_costs.json" --markdown "$1" "${@:2}"
  local rc=$?
  [ $rc = 0 ] || [ $rc = 3 ] || status=1   # 3: targets missed, written down
}
set +e
verdict "$OUT/verdict.md"
grep -q '"strata default_pool (relocate idle' "$OUT/peers.json" &&
  verdict "$OUT/verdict_plugin.md" --stack "strata default_pool (relocate idle: the plug-in's default)" >/dev/null
[ -s "$OUT/verdict.md" ] || status=1
exit $status
