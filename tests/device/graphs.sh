#!/usr/bin/env bash
# The CUDA-graph tests on a GPU machine, with every log under $OUT (default ./out-graphs).
#   tests/device/graphs.sh          (from the repository root; needs nvcc, g++ and a GPU)
# Builds with nvcc/g++ directly (no CMake): the GPU tests tests/gpu/test_graphs.cu (doctest filter
# 'graphs:*', the same cases strata_gpu_tests runs with -tc='graphs:*'), and the host tests of the private
# pools (tests/detail/stream/test_graph_router.cpp, tests/detail/stream/test_graph_pools.cpp); then the GPU
# tests once more under compute-sanitizer memcheck when it is installed. Prints "graphs <part>: PASS" or
# "FAIL" per part and exits 0 only when every part passed. doctest comes from the system or from .device/doctest.
set -u
OUT=${OUT:-$PWD/out-graphs}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
inc=(-Iinclude -Itests -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
[ -f .device/doctest/doctest.h ] && inc+=(-I.device)
bin=${BIN:-/tmp/strata-graphs}
mkdir -p "$bin"
status=0
report() {  # report PART RC
  if [ "$2" -eq 0 ]; then echo "graphs $1: PASS"; else echo "graphs $1: FAIL ($2)"; status=1; fi
  echo "$1 $2" >> "$OUT/status.txt"
}
: > "$OUT/status.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; } > "$OUT/device.txt" 2>&1

nvcc -std=c++20 -O2 -arch=sm_90 "${inc[@]}" tests/gpu/main.cu tests/gpu/test_graphs.cu -o "$bin/gpu_graphs" \
  > "$OUT/build_gpu.log" 2>&1
rc=$?; report build-gpu $rc
g++ -std=c++20 -O1 "${inc[@]}" -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include tests/support/main.cpp \
  tests/detail/stream/test_graph_router.cpp tests/detail/stream/test_graph_pools.cpp -o "$bin/host_graphs" \
  -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,/usr/local/cuda/lib64 -pthread > "$OUT/build_host.log" 2>&1
report build-host $?

if [ "$rc" -eq 0 ]; then
  STRATA_REQUIRE_GPU=1 timeout 300 "$bin/gpu_graphs" -tc='graphs:*' > "$OUT/gpu_graphs.log" 2>&1
  report gpu $?
  tail -n 3 "$OUT/gpu_graphs.log"
  if command -v compute-sanitizer > /dev/null; then
    # One replay scenario is enough under memcheck (1,000 replays each run slowly there).
    STRATA_REQUIRE_GPU=1 timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/gpu_graphs" \
      -tc='graphs: a capture on one stream*,graphs: the PyTorch-style*,graphs: growing*' > "$OUT/gpu_graphs_memcheck.log" 2>&1
    report memcheck $?
    grep -E "ERROR SUMMARY" "$OUT/gpu_graphs_memcheck.log" | tail -n 1
  fi
fi
[ -x "$bin/host_graphs" ] && { timeout 300 "$bin/host_graphs" > "$OUT/host_graphs.log" 2>&1; report host $?; tail -n 3 "$OUT/host_graphs.log"; }
exit $status
