#!/usr/bin/env bash
# pinned_host_pool on a GPU machine, every log and result under $OUT (default ./out-pinned).
#   bash tests/device/pinned_host.sh                 # all parts: gpu, bench, torch
#   ONLY=gpu,bench bash tests/device/pinned_host.sh  # a subset (torch builds the plug-in: give it its own call)
# gpu:   tests/gpu/test_pinned_host_pool.cu (nvcc, no CMake) and the host tests tests/pinned/ (g++);
# bench: bench/pinned_host.cu, table on stdout, $OUT/pinned_host.json (SCALE, default 0.5, scales the patterns);
# torch: tests/device/torch/pinned_host.py against PyTorch's own pinned allocator, $OUT/pinned_host_torch.json.
# Prints "pinned <part>: PASS" or "FAIL" per part and exits 0 only when every part run passed.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-pinned}
ONLY=${ONLY:-gpu,bench,torch}
SCALE=${SCALE:-0.5}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
inc=(-Iinclude -Itests -DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
[ -f .device/doctest/doctest.h ] && inc+=(-I.device)
bin=${BIN:-/tmp/strata-pinned}
mkdir -p "$bin"
status=0
report() {  # report PART RC
  if [ "$2" -eq 0 ]; then echo "pinned $1: PASS"; else echo "pinned $1: FAIL ($2)"; status=1; fi
  echo "$1 $2" >> "$OUT/status.txt"
}
: > "$OUT/status.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; free -g | head -2; numactl -H 2>/dev/null | head -3;
  ulimit -l; git rev-parse --short HEAD; } > "$OUT/device.txt" 2>&1

if [[ ",$ONLY," == *,gpu,* ]]; then
  nvcc -std=c++20 -O2 -arch=sm_90 "${inc[@]}" tests/gpu/main.cu tests/gpu/test_pinned_host_pool.cu -o "$bin/gpu_pinned" \
    > "$OUT/build_gpu.log" 2>&1
  rc=$?; report build-gpu $rc
  if [ $rc -eq 0 ]; then
    STRATA_REQUIRE_GPU=1 "$bin/gpu_pinned" > "$OUT/gpu.log" 2>&1; rc=$?; report gpu-tests $rc; tail -4 "$OUT/gpu.log"
  fi
  g++ -std=c++20 -O1 "${inc[@]}" -I/usr/local/cuda/include/cccl -isystem /usr/local/cuda/include tests/support/main.cpp \
    tests/pinned/test_pinned_host_pool.cpp -o "$bin/host_pinned" -L/usr/local/cuda/lib64 -lcudart \
    -Wl,-rpath,/usr/local/cuda/lib64 > "$OUT/build_host.log" 2>&1
  rc=$?; report build-host $rc
  if [ $rc -eq 0 ]; then "$bin/host_pinned" > "$OUT/host.log" 2>&1; rc=$?; report host-tests $rc; tail -3 "$OUT/host.log"; fi
fi

if [[ ",$ONLY," == *,bench,* ]]; then
  nvcc -std=c++20 -O3 -arch=sm_90 "${inc[@]}" bench/pinned_host.cu -o "$bin/pinned_host" > "$OUT/build_bench.log" 2>&1
  rc=$?; report build-bench $rc
  if [ $rc -eq 0 ]; then
    timeout 300 "$bin/pinned_host" --scale "$SCALE" --json "$OUT/pinned_host.json" 2>&1 | tee "$OUT/pinned_host.txt"
    rc=${PIPESTATUS[0]}; report bench $rc
  fi
fi

if [[ ",$ONLY," == *,torch,* ]]; then
  source tests/device/torch/build_plugin.sh
  if strata_build_plugin "$OUT/build_plugin.log"; then
    report build-plugin 0
    timeout 500 python3 tests/device/torch/pinned_host.py --scale "$SCALE" --json "$OUT/pinned_host_torch.json" 2>&1 \
      | tee "$OUT/pinned_host_torch.txt"
    rc=${PIPESTATUS[0]}; report torch $rc
  else
    report build-plugin 1; tail -30 "$OUT/build_plugin.log"
  fi
fi
exit $status
