#!/usr/bin/env bash
# The two-GPU checks, for the device machine (nvidia-h200-x2):
#   tests/device/multi_gpu.sh [all|build|run] [BUILD_DIR]     (run from anywhere)
# `all` (the default) configures, builds and runs; `build` and `run` split that in two commands when one
# command may not last long enough (the build folder, build-multi-gpu by default, is git-ignored and kept
# between commands on a warm machine). Every step runs even when one before it failed, each under a timeout
# (STRATA_STEP_TIMEOUT caps steps without their own limit, default 300 s; builds 480 s) and inside a total
# budget (STRATA_TOTAL_BUDGET, default 560 s, so that one command of the device machine's 600 s holds it all). Logs go to $OUT/multi_gpu/ (./multi_gpu_out when OUT is
# unset): one log per step, summary.txt ("PASS|FAIL label rc" per step, then the count). Exits 1 if any step
# failed. STRATA_REQUIRE_GPU=2: the GPU tests fail, rather than skip, with fewer than two devices.
# NCCL: STRATA_NCCL_ROOT if set, else PyTorch's wheel (python3 -c "import nvidia.nccl"), else the toolkit's
# folders; without any, the NCCL step is reported "FAIL nccl_allreduce missing". The host parts (routing over
# simulated devices, descriptor passing) run in CI with strata_tests, not here.
set -u
repo=$(cd "$(dirname "$0")/../.." && pwd)
phase=${1:-all}
case "$phase" in all | build | run) ;; *) echo "usage: $0 [all|build|run] [BUILD_DIR]" >&2; exit 2 ;; esac
build=${2:-$repo/build-multi-gpu}
out=${OUT:-$PWD/multi_gpu_out}/multi_gpu
limit=${STRATA_STEP_TIMEOUT:-300}
# The whole command must finish inside the device machine's per-command limit (600 s), summary included: no
# step may run past this many seconds from the start, and a step with no time left is recorded as such.
budget=${STRATA_TOTAL_BUDGET:-560}
mkdir -p "$out"
[ "$phase" = run ] && touch "$out/summary.txt" || : > "$out/summary.txt"
export PATH=/usr/local/cuda/bin:$PATH
export STRATA_REQUIRE_GPU=2
export NCCL_NVLS_ENABLE=0   # NVLink multicast off (KINDS.md)

{ nvidia-smi -L; nvidia-smi topo -m; } > "$out/device.txt" 2>&1 || echo "no nvidia-smi" > "$out/device.txt"
git -C "$repo" rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

# step LABEL COMMAND...: runs it with output to LABEL.log, records PASS/FAIL with its status (124: timed out).
step() {
  local label=$1
  shift
  echo "== $label: $*" | tee -a "$out/$label.log"
  if [ ! -x "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
    echo "FAIL $label missing ($1 not built)" | tee -a "$out/summary.txt"
    return
  fi
  local left=$((budget - SECONDS - 15)) allowed=${step_limit:-$limit}
  if [ $left -lt 10 ]; then
    echo "FAIL $label not run (no time left of the ${budget} s budget)" | tee -a "$out/summary.txt"
    return
  fi
  [ $allowed -gt $left ] && allowed=$left
  timeout --kill-after=5 "$allowed" "$@" >> "$out/$label.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $label 0" | tee -a "$out/summary.txt"; else echo "FAIL $label $rc" | tee -a "$out/summary.txt"; fi
  grep -E "^(PASS|FAIL) |test cases:|assertions:|ERROR SUMMARY|routing a free|skipped" "$out/$label.log" | tail -n 40
}

# nvidia.nccl may be a namespace package (no __file__): its __path__ names the folder.
nccl_root=${STRATA_NCCL_ROOT:-$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)}
nccl_flag=()
[ -n "$nccl_root" ] && nccl_flag=(-DSTRATA_NCCL_ROOT="$nccl_root")
echo "NCCL root: ${nccl_root:-(toolkit folders)}" > "$out/nccl.txt"

if [ "$phase" != run ]; then
  step_limit=480
  step configure cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${nccl_flag[@]}"
  step build cmake --build "$build" -j "$(nproc)" --target strata_gpu_tests ipc_two_processes
  step build_nccl cmake --build "$build" -j "$(nproc)" --target nccl_allreduce
  unset step_limit
fi
if [ "$phase" = build ]; then
  ! grep -q '^FAIL' "$out/summary.txt"
  exit $?
fi

# Two devices: routing, frees from the wrong current device, sources on their own device, peer access per kind.
step_limit=180 step gpu_multi "$build/tests/strata_gpu_tests" --no-intro -ts=multi_gpu
step_limit=60 step gpu_bad_peers "$build/tests/strata_gpu_tests" --no-intro -tc='a peer that does not exist*,mapped_pool: a peer device*'
# IPC between two processes, every pool kind, on each device.
step_limit=120 step ipc_two_processes "$build/examples/ipc_two_processes"
# NCCL all-reduce over pool memory.
step_limit=120 step nccl_allreduce "$build/examples/nccl_allreduce"
# compute-sanitizer memcheck: the two-device suite, then the IPC example on one device.
sanitizer=${STRATA_SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
  /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)}
sanitizer=${sanitizer:-compute-sanitizer}
echo "compute-sanitizer: $sanitizer" > "$out/sanitizer.txt"
step_limit=240 step memcheck_multi "$sanitizer" --tool memcheck --error-exitcode 1 --leak-check full --report-api-errors no \
  "$build/tests/strata_gpu_tests" --no-intro -ts=multi_gpu
step_limit=180 step memcheck_ipc_one_device env CUDA_VISIBLE_DEVICES=0 "$sanitizer" --tool memcheck --error-exitcode 1 \
  --target-processes all "$build/examples/ipc_two_processes"

passed=$(grep -c '^PASS' "$out/summary.txt")
failed=$(grep -c '^FAIL' "$out/summary.txt")
echo "multi_gpu.sh: $passed steps passed, $failed failed" | tee -a "$out/summary.txt"
[ "$failed" -eq 0 ]
