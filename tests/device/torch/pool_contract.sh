#!/usr/bin/env bash
# PyTorch's private-pool contract and graph-pool memory on a GPU machine (PyTorch installed), from the
# repository root: builds the plug-in (tests/device/torch/build_plugin.sh), then
#   1. tests/device/torch/pool_contract.py under PyTorch's allocator and under strata (stack=default);
#   2. with GRAPH_MEMORY=1 (several minutes: torch.compile per row), tests/device/torch/graph_pool_memory.py.
# Logs and the memory table under $OUT (default ./out-pool-contract). Prints "pool_contract <part>: PASS/FAIL";
# exits 0 only when every part passed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/out-pool-contract}
mkdir -p "$OUT"
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "pool_contract build: FAIL"; tail -30 "$OUT/build.txt"; exit 1; }
status=0
report() {  # PART RC LOG
  if [ "$2" -eq 0 ]; then echo "pool_contract $1: PASS"; else echo "pool_contract $1: FAIL ($2)"; tail -20 "$3"; status=1; fi
}
for allocator in native strata; do
  timeout 300 python3 tests/device/torch/pool_contract.py --allocator "$allocator" --conf "${CONF:-stack=default}" \
    > "$OUT/contract_$allocator.log" 2>&1
  report "contract-$allocator" $? "$OUT/contract_$allocator.log"
  grep -E "^(PASS|FAIL)" "$OUT/contract_$allocator.log"
done
if [ "${GRAPH_MEMORY:-0}" = 1 ]; then
  python3 tests/device/torch/graph_pool_memory.py --conf "${CONF:-stack=default}" --out "$OUT" ${MEMORY_ARGS:-} \
    > "$OUT/graph_pool_memory.log" 2>&1
  report graph-memory $? "$OUT/graph_pool_memory.log"
  cat "$OUT/graph_pool_memory.log" | grep -vE "^(W|I)[0-9]{4}" | tail -20
fi
exit $status
