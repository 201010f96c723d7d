#!/usr/bin/env bash
# The frameworks suite on a GPU machine (PyTorch 2.11, transformers, pytorch-lightning; no network): builds the
# plug-in and libstrata_torch_hooks.so (strata's PyTorch backend) against the installed PyTorch, then runs
# tests/device/frameworks/run_all.py, then, with two GPUs, DDP and FSDP2 (distributed_run.py). Logs under $OUT (default ./frameworks-logs): build.txt, frameworks.log,
# results.json, strata_snapshot.pickle.
#   bash tests/device/frameworks/run.sh                 # everything
#   ONLY=memory_api,graph,compile-ro bash tests/device/frameworks/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/frameworks-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "FAIL build: see build.txt"; tail -40 "$OUT/build.txt"; exit 1; }
echo "PASS build"
python3 tests/device/frameworks/run_all.py --out "$OUT" ${ONLY:+--only "$ONLY"}
status=$?
if [ -z "${ONLY:-}" ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  python3 tests/device/frameworks/distributed_run.py --out "$OUT" || status=1
fi
exit $status
