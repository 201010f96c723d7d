#!/usr/bin/env bash
# Runs RMM's memory-resource tests built by tests/rmm/build.sh (in .rmm_tests/build/bin) on a GPU: RMM's
# programs over RMM's own resources (the baseline), then the same suites over each strata stack (as the
# resource under test and as RMM's current device resource). Prints one line per program and stack:
#   <program> <resource> passed=<n> failed=<n> [FAILED: names]
# and ends with "rmm tests: ALL PASSED" or "rmm tests: <n> FAILED" (a failure RMM's own resources share, or
# one docs/rmm.md lists, is reported too: compare with the baseline lines). Logs and gtest XML go to $1
# (default docs/results/device/rmm). STRATA_RMM_STACKS (default "default_pool coalescing limit_statistics")
# runs fewer stacks; STRATA_RMM_BASELINE=0 skips RMM's own resources: to split a run into shorter ones.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${STRATA_RMM_BIN:-$PWD/.rmm_tests/build/bin}
results=$(realpath -m "${1:-docs/results/device/rmm}")
mkdir -p "$results"
[ -x "$bin/strata_mr_ref" ] || { echo "no $bin/strata_mr_ref: build with tests/rmm/build.sh" >&2; exit 1; }
work=$(mktemp -d)   # RMM's logging tests write their log into the working directory
cd "$work"
failed_total=0
stacks=${STRATA_RMM_STACKS:-default_pool coalescing limit_statistics}
baseline=${STRATA_RMM_BASELINE:-1}
run() {  # run <label> <resource> <program> [gtest args...]; STRATA_RMM_STACK from the caller
  local label=$1 resource=$2 program=$3; shift 3
  local log="$results/$label.$resource.log" xml="$results/$label.$resource.xml"
  "$bin/$program" --gtest_output="xml:$xml" "$@" > "$log" 2>&1
  local rc=$?
  local passed failed names
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  names=$(sed -n 's/^\[  FAILED  \] \([^ ]*\)\( (.*\|, where.*\)\?$/\1/p' "$log" | grep -v '^[0-9]' | sort -u | tr '\n' ' ')
  [ -z "$passed" ] && passed=0
  [ -z "$failed" ] && failed=0
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; names="(exit code $rc, see $log)"; fi
  failed_total=$((failed_total + failed))
  printf '%-22s %-18s passed=%-4s failed=%s%s\n' "$label" "$resource" "$passed" "$failed" "${names:+ FAILED: $names}"
}
echo "RMM $(cat "$bin/../RMM_VERSION" 2>/dev/null || echo 26.10) tests, sources $(cat "$bin/../RMM_COMMIT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
[ "$baseline" = 1 ] && run mr_ref rmm_pool rmm_mr_ref_pool
for stack in $stacks; do
  case $stack in
    default_pool) suite=StrataDefaultPool ;;
    coalescing) suite=StrataCoalescing ;;
    limit_statistics) suite=StrataLimitStatistics ;;
  esac
  STRATA_RMM_STACK=$stack run mr_ref "$stack" strata_mr_ref --gtest_filter="$suite/*"
done
for program in "$bin"/rmm_*; do
  name=$(basename "$program")
  # rmm_mr_ref_pool ran above; the recipe and the benchmark (STRATA_RMM_EXTRAS) are no RMM suites with strata twins
  case $name in rmm_mr_ref_pool | rmm_thrust | rmm_interop) continue ;; esac
  file=${name#rmm_}
  [ "$baseline" = 1 ] && run "$file" rmm_cuda "$name"
  for stack in $stacks; do
    STRATA_RMM_STACK=$stack run "$file" "$stack" "strata_$file"
  done
done
# The recipe (examples/rmm_thrust): RMM's containers in Thrust algorithms on default_pool, not a gtest program.
if [ -x "$bin/rmm_thrust" ]; then
  "$bin/rmm_thrust" > "$results/thrust.default_pool.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed_total=$((failed_total + 1))
  printf '%-22s %-18s %s\n' thrust default_pool "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit code $rc)")"
fi
rm -rf "$work"
if [ "$failed_total" -eq 0 ]; then echo "rmm tests: ALL PASSED"; else echo "rmm tests: $failed_total FAILED"; fi
[ "$failed_total" -eq 0 ]
