#!/usr/bin/env bash
# On a GPU: strata behind RMM's interface (bench/rmm_interop/rmm_interop.cu), built by tests/rmm/build.sh into
# .rmm_tests/build/bin. Prints the three tables and one PASS/FAIL line per target; ends "rmm_interop: ALL PASS"
# when every target holds. The output goes to $1 as well (default docs/results/device/rmm/rmm_interop.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${STRATA_RMM_BIN:-$PWD/.rmm_tests/build/bin}
out=${1:-docs/results/device/rmm/rmm_interop.txt}
mkdir -p "$(dirname "$out")"
"$bin/rmm_interop" --traces bench/traces "${@:2}" 2>&1 | tee "$out"
exit "${PIPESTATUS[0]}"
