#!/usr/bin/env bash
# The device reference run, the source of every GPU figure in README.md and docs/ (docs/results/device/).
# On a GPU machine, from anywhere:
#   bench/device_reference.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR (default build) is configured and built afresh (Release, tests, benchmarks, tools, plug-in). Then:
# ctest with STRATA_REQUIRE_GPU=1, the GPU suite without and with its CUDA-graph cases, the per-thread
# default-stream program, compute-sanitizer memcheck over both halves of the suite, the plug-in's GPU tests
# (tests/device/plugin.sh), the plug-in's host cost per allocation twice, mapped_pool's variants replayed on
# device memory, and bench/peers against every peer present (RMM and PyTorch rows where bench/get_rmm.sh and
# bench/get_torch_shim.sh built their shims into build-rmm/ and build-torch/). Each step's exit status and
# time go to OUT_DIR/summary.txt, its output to its own file; the script exits 1 if any step failed.
# PyTorch's own figures (docs/results/device/pytorch/) come from tests/device/torch.sh.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:?output folder}" && cd "$1" && pwd)
build=${2:-build}
limit=${STRATA_BENCH_TIMEOUT:-1800}
cd "$root"
export PATH=/usr/local/cuda/bin:$PATH STRATA_REQUIRE_GPU=1
: > "$out/summary.txt"
failed=0
start=$SECONDS
step() {  # step LABEL LOG COMMAND...: runs COMMAND from the repository root, its output into LOG
  local label=$1 log=$2
  shift 2
  echo "== $label: $*"
  timeout "$limit" "$@" > "$out/$log" 2>&1
  local status=$?
  echo "[t=$((SECONDS - start))s] $label exit $status" >> "$out/summary.txt"
  [ $status -eq 0 ] || { failed=1; echo "   FAILED ($status), see $out/$log"; }
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt" 2>/dev/null || echo "no GPU" > "$out/device.txt"
git rev-parse --short HEAD >> "$out/device.txt" 2>/dev/null
shims=()
[ -f build-rmm/libstrata_rmm_shim.so ] && shims+=(--rmm-shim build-rmm/libstrata_rmm_shim.so)
[ -f build-torch/libstrata_torch_shim.so ] && shims+=(--torch-shim build-torch/libstrata_torch_shim.so)
gpu_tests="$build/tests/strata_gpu_tests"

# With PyTorch's CMake package the plug-in's backend (libstrata_torch_hooks.so) is built too, which the Python
# tests under ctest use when PyTorch is installed.
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
step configure configure.log cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"}
step build build.log cmake --build "$build" -j"$(nproc)"
step ctest ctest.log ctest --test-dir "$build" -j4 --timeout 150 --output-on-failure
step "gpu suite (without graphs)" gpu_suite.log "$gpu_tests" --no-intro -tce="graphs*"
step "gpu graphs" gpu_graphs.log "$gpu_tests" --no-intro -tc="graphs*" -s
gzip -f "$out/gpu_graphs.log"
step per-thread per_thread.log "$build/tests/strata_per_thread_stream_tests"
# The suite provokes out-of-memory errors on purpose (sources and pools refusing): memcheck reports memory
# errors, not those API errors.
step memcheck memcheck.log compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$gpu_tests" --no-intro -tce="graphs*"
step "memcheck graphs" memcheck_graphs.log compute-sanitizer --tool memcheck --error-exitcode 1 "$gpu_tests" --no-intro -tc="graphs*"
step plugin.sh plugin.log env OUT="$out/plugin-logs" tests/device/plugin.sh
for i in 1 2; do
  step plugin_cost "plugin_cost$i.txt" "$build/plugin/strata_plugin_cost" --json "$out/plugin_cost$i.json"
done
step "mapped_variants --device" mapped_variants_device.md "$build/bench/mapped_variants" --device --repeat 3 bench/traces
step peers peers.txt "$build/bench/peers" --json "$out/peers.json" --traces bench/traces "${shims[@]}"
rm -rf "$out/plugin-logs"
cat "$out/summary.txt"
exit $failed
