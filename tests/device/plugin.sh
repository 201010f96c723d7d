#!/usr/bin/env bash
# The PyTorch/CuPy allocator plug-in on a GPU machine: builds libstrata_alloc.so and its tests, runs the host
# tests (configuration parser, record_stream holding, C entry points over the simulated stack), then the GPU
# tests on each CUDA stack (two streams with kernels checking every word, record_stream against a spinning
# reader, empty_cache, out of memory, a limit, device 1 while device 0 is current when there are two GPUs),
# the plug-in inside PyTorch (plugin/tests/torch_smoke.py, with libstrata_torch_hooks.so) on each stack, and
# the GPU tests once more under compute-sanitizer memcheck (default stack).
# Usage: tests/device/plugin.sh   (from the repository root; logs under $OUT, default ./plugin-logs)
# Success: the last line says "plugin.sh: ALL PASSED"; each GPU run ends with "ALL PASSED: 0 failed check(s)".
# Without doctest installed, put its header at .device/doctest/doctest.h (carried) or set STRATA_DOCTEST_INCLUDE.
set -uo pipefail
OUT=${OUT:-$PWD/plugin-logs}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
build=${BUILD:-build-plugin}
doctest_opt=()
if [ -n "${STRATA_DOCTEST_INCLUDE:-}" ]; then doctest_opt=(-DSTRATA_DOCTEST_INCLUDE="$STRATA_DOCTEST_INCLUDE")
elif [ ! -e /usr/include/doctest/doctest.h ] && [ -e .device/doctest/doctest.h ]; then doctest_opt=(-DSTRATA_DOCTEST_INCLUDE="$PWD/.device"); fi
# Where PyTorch is installed, also build libstrata_torch_hooks.so and run plugin/tests/torch_smoke.py.
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) &&
  export CMAKE_PREFIX_PATH=$torch_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
targets=(strata_alloc strata_plugin_unit_tests strata_plugin_c_api_tests strata_plugin_gpu_tests)
[ -n "$torch_prefix" ] && targets+=(strata_torch_hooks)
status=0
step() {  # name, command...: runs it, logs to $OUT/name.log, remembers a failure
  local name=$1; shift
  echo "== $name: $*"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (exit $?), see $name.log"; tail -20 "$OUT/$name.log"; status=1; fi
}
step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_CUDA=ON \
  -DSTRATA_BUILD_PLUGIN=ON -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=OFF "${doctest_opt[@]}"
step build cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
step host_unit "$build"/plugin/tests/strata_plugin_unit_tests
step host_c_api "$build"/plugin/tests/strata_plugin_c_api_tests
export STRATA_REQUIRE_GPU=1
for stack in default coalescing; do
  step "gpu_$stack" "$build"/plugin/tests/strata_plugin_gpu_tests "$stack"
  grep -E "^(PASS|FAIL|SKIP|ALL|FAILED)" "$OUT/gpu_$stack.log" | tail -30
done
if [ -n "$torch_prefix" ]; then
  for stack in default coalescing; do
    step "torch_$stack" python3 plugin/tests/torch_smoke.py "$build/plugin/libstrata_alloc.so" "$build/plugin/libstrata_torch_hooks.so" "$stack"
    grep -E "^(PASS|FAIL|ALL|FAILED)" "$OUT/torch_$stack.log" | tail -30
  done
else
  echo "== torch: PyTorch not importable here: torch_smoke.py not run"; status=1
fi
if command -v compute-sanitizer >/dev/null; then
  step memcheck env STRATA_TEST_UNDER_SANITIZER=1 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 "$build"/plugin/tests/strata_plugin_gpu_tests default
  grep -E "ERROR SUMMARY|ALL PASSED|FAILED" "$OUT/memcheck.log" | tail -5
else
  echo "== memcheck: compute-sanitizer not found"; status=1
fi
if [ $status -eq 0 ]; then echo "plugin.sh: ALL PASSED"; else echo "plugin.sh: FAILED"; fi
exit $status
