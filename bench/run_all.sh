#!/usr/bin/env bash
# Every benchmark, on the GPU machine, into one folder: each program's output and JSON, the policy
# micro-benchmarks, the examples' timings, then summary.md and the plots.
#   bench/run_all.sh OUT_DIR [BUILD_DIR] [TRACE...]
# TRACE defaults to every trace in bench/traces/. Every program runs even when one before it failed; each
# one's exit status is recorded (status.txt, and the summary's first table), and the script exits 1 if any
# failed. RMM rows appear when build-rmm/libstrata_rmm_shim.so exists (bench/get_rmm.sh) or STRATA_RMM_SHIM
# names it; PyTorch rows likewise with build-torch/libstrata_torch_shim.so (bench/get_torch_shim.sh) or
# STRATA_TORCH_SHIM. STRATA_BENCH_TIMEOUT: seconds any one program may run (default 900).
# What stays in OUT_DIR: summary.md, results.tar.gz (every JSON, log and note) and a few PNGs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?output folder}
build=${2:-build}
shift $(( $# >= 2 ? 2 : $# ))
traces=("$@")
[ ${#traces[@]} -eq 0 ] && traces=("$here"/traces/*.csv.gz)
limit=${STRATA_BENCH_TIMEOUT:-900}
mkdir -p "$out"
: > "$out/status.txt"

shim_args=()
rmm=${STRATA_RMM_SHIM:-build-rmm/libstrata_rmm_shim.so}
torch=${STRATA_TORCH_SHIM:-build-torch/libstrata_torch_shim.so}
[ -f "$rmm" ] && shim_args+=(--rmm-shim "$rmm")
[ -f "$torch" ] && shim_args+=(--torch-shim "$torch")
trace_args=()
for t in "${traces[@]}"; do trace_args+=(--trace "$t"); done

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt" 2>/dev/null || echo "no GPU" > "$out/device.txt"
echo "${STRATA_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null)}" > "$out/commit.txt"
printf '%s\n' "${traces[@]}" > "$out/traces.txt"

# run LABEL LOG PROGRAM ARGS...: runs one program (output to LOG and the last lines to the terminal) and
# records "LABEL STATUS" (0, the exit status, "missing" when it was not built, 124 when it ran out of time).
run() {
  local label=$1 log=$2
  shift 2
  echo "== $label: $*"
  if [ ! -x "$1" ]; then
    echo "$label missing" >> "$out/status.txt"
    echo "   (not built: $1)"
    return
  fi
  timeout "$limit" "$@" >> "$out/$log" 2>&1
  local rc=$?
  echo "$label $rc" >> "$out/status.txt"
  tail -n 30 "$out/$log"
}

# A torch shim built elsewhere finds libc10 through torch's own lib folder, where python3 imports torch.
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
(
  [ -n "$torch_lib" ] && export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  run peers peers.log "$build/bench/peers" --json "$out/peers.json" "${trace_args[@]}" "${shim_args[@]}"
)
run streams streams.log "$build/bench/streams" --json "$out/streams.json"
run vmm_costs vmm_costs.log "$build/bench/vmm_costs" --json "$out/vmm_costs.json"
run threads threads.log "$build/bench/threads" --json "$out/threads.json"
run pinned_managed pinned_managed.log "$build/bench/pinned_managed" --json "$out/pinned_managed.json"
run policies_host policies_host.log "$build/bench/policies_host" --benchmark_format=json --benchmark_out_format=json \
  --benchmark_out="$out/policies_host.json"
# Simulated replays: every trace at its own sizes and scaled by 0.9 and 1.1 (a figure that holds only at one
# lucky size shows it).
for t in "${traces[@]}"; do
  name=$(basename "$t")
  name=${name%%.*}
  for scale in 1.0 0.9 1.1; do
    run "replay:$name:x$scale" replay.log "$build/bench/replay" "$t" --scale "$scale" --json "$out/replay-$name-x$scale.json"
  done
done
# The examples print their own timings: each one's output, under its name, in examples.log (77: skipped, no GPU).
for ex in "$build"/examples/*; do
  [ -f "$ex" ] && [ -x "$ex" ] || continue
  echo "### $(basename "$ex")" >> "$out/examples.log"
  run "example:$(basename "$ex")" examples.log "$ex"
done

python3 "$here/plot.py" "$out" || echo "plot 1" >> "$out/status.txt"
python3 "$here/replay_table.py" "$out" > "$out/memory.md" || echo "replay_table 1" >> "$out/status.txt"
# summary.md and the plots stay in sight; the raw JSON, logs and notes go into one archive.
( cd "$out" && tar czf results.tar.gz ./*.json ./*.txt ./*.log && rm -f ./*.json ./*.txt ./*.log )
failed=$(tar xzf "$out/results.tar.gz" -O ./status.txt | awk '$2 != 0 && $2 != 77' | wc -l)
echo "run_all: $failed program(s) failed or missing; see summary.md"
[ "$failed" -eq 0 ]
