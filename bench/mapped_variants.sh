#!/usr/bin/env bash
# mapped_pool's design points and the recommended stack's memory, into one folder: on any machine the
# simulated tables (bench/mapped_variants, bench/variant_prices.py, bench/replay_all.sh); on a GPU machine also the same variants on
# device memory (ns per operation with real driver calls) and the GPU tests of mapped_pool and default_pool.
#   bench/mapped_variants.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR (default build) must hold bench/mapped_variants and bench/replay (and tests/strata_gpu_tests
# on a GPU machine). Each step's exit status goes to OUT_DIR/status.txt; the script exits 1 if any failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:?output folder}
build=$(cd "${2:-build}" && pwd)
mkdir -p "$out"
: > "$out/status.txt"
failed=0
step() {  # step LABEL LOG COMMAND...: runs it from the repository root, output to LOG, status recorded
  local label=$1 log=$2
  shift 2
  echo "== $label: $*"
  (cd "$root" && "$@") > "$out/$log" 2>&1
  local status=$?
  echo "$label $status" >> "$out/status.txt"
  [ $status -eq 0 ] || { failed=1; echo "   FAILED ($status), see $out/$log"; }
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt" 2>/dev/null || echo "no GPU" > "$out/device.txt"
git -C "$root" rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null
step simulated_variants mapped_variants.md "$build/bench/mapped_variants" --repeat 3 bench/traces
step simulated_variants_families mapped_variants_families.md "$build/bench/mapped_variants" --repeat 3 \
  --traces mixtral_moe_train,t5_train_varlen,fasterrcnn_train_multiscale,llama_prefill_long,gpt2m_generate_kvcache bench/traces
# Every variant on all thirteen traces, its driver calls priced with the H200's vmm_costs (the archived
# reference run's) against the PyTorch-like model's cudaMalloc calls: where the memory and driver-time targets meet.
all_traces=$(cd "$root/bench/traces" && ls *.csv.gz | sed 's/\.csv\.gz$//' | paste -sd, -)
step variant_calls variant_calls.md "$build/bench/mapped_variants" --traces "$all_traces" --json "$out/variants.json" bench/traces
step variant_prices variant_prices.md python3 bench/variant_prices.py "$out/variants.json" docs/results/device/trace_speed/vmm_costs.json
step replays replay_all.log "$here/replay_all.sh" "$out/replays" "$build"
if [ "$(cat "$out/device.txt")" != "no GPU" ]; then
  step device_variants mapped_variants_device.md "$build/bench/mapped_variants" --device --repeat 3 bench/traces
  step gpu_tests gpu_tests.log env STRATA_REQUIRE_GPU=1 "$build/tests/strata_gpu_tests" -tc="*mapped_pool*,*default_pool*"
fi
cat "$out/status.txt"
exit $failed
